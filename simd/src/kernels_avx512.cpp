// AVX-512 (F/BW/DQ/CD) build of the kernels. Compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512cd -mavx2 -mfma (see simd/CMakeLists.txt).
//
// Blocking, f32: a 12 x 32 tile: 24 accumulators + 2 B vectors + 1 A broadcast of the 32 zmm
// registers. Two FMA pipes x 4-cycle latency need >= 8 independent chains; 24 give slack.
// Packed B (most shapes): rows outer. kc = 256: an A micro-panel (12 x 256 x 4 B = 12 KiB)
// stays in L1 while it sweeps the packed kc x nc block of B, which stays in L2: nc = 4096 at
// most, lowered by the driver to fill half of the CPU's L2 (1024 at kc = 256 in a 2 MiB L2,
// the whole 2048 columns at K = 64). B pre-packed (few rows per thread) or read in place:
// columns outer, the A block (mc = 336 rows) in L2; a pre-packed 256 x 32 panel (32 KiB) in
// L1; read in place, passes are kc_b_in_place = 768 deep, the kernel prefetching B's rows
// (gemm 128x768x768, same-process harness: kc 256 without the prefetch 0.90 ms at 1 thread,
// 0.46-0.48 at 2; one 768-deep pass with it 0.85-0.87 and 0.44). Measured (gemm 1024^3 t1,
// same-process harness, best of 8-15): columns outer with kc 512 / mc 336 / B block in L3:
// 14.8-15.0 ms; rows outer, kc 256 / nc 1024: 13.4-13.7; nc 512: 14.2; kc 384: 14.0; kc 344 /
// nc 768: 14.0.
// f64: 14 x 16 tiles, kc = 256, nc <= 2048, mc = 168.
// In-place A (narrow C): 6 x 64 f32 / 6 x 32 f64 tiles, 24 accumulators + 4 B vectors + 1 A
// broadcast; 6 rows of A per L1 set stay within its 12 ways, and a 64-wide head is one panel.
#include "kernels_impl.hpp"

namespace simdattn::simd {

KernelTable make_table_avx512() {
  using A = xsimd::avx512bw;
  return {Isa::avx512,
          impl::make_probe_kernels<A>(),
          impl::make_gemm_kernels<A, float, 12, 2, 6, 4>(336, 256, 4096, 2048, 768),
          impl::make_gemm_kernels<A, double, 14, 2, 6, 4>(168, 256, 2048, 1024, 768),
          impl::make_vector_kernels<A, float>(),
          impl::make_vector_kernels<A, double>()};
}

}  // namespace simdattn::simd
