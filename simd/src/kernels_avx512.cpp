// AVX-512 (F/BW/DQ/CD) build of the kernels. Compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512cd -mavx2 -mfma (see simd/CMakeLists.txt).
//
// Blocking, f32: 32 zmm registers hold a 14 x 32 tile (28 accumulators) + 2 B vectors + 1 A
// broadcast, leaving one spare. Two FMA pipes x 4-cycle latency need >= 8 independent chains; 28
// give slack. kc = 256: the B micro-panel (256 x 32 x 4 B = 32 KiB) stays in the 48 KiB L1;
// mc = 336 (24 x 14): the A block (336 x 256 x 4 B = 336 KiB) stays in L2 (2 MiB here, 1 MiB on
// the Zen 5 kind); nc = 4096: the B block (4 MiB) lives in L3. f64 halves the columns per
// vector: 14 x 16 tiles, kc = 256 (B panel 32 KiB), mc = 168, nc = 2048.
// In-place A (narrow C): 6 x 64 f32 / 6 x 32 f64 tiles, 24 accumulators + 4 B vectors + 1 A
// broadcast; 6 rows of A per L1 set stay within its 12 ways, and a 64-wide head is one panel.
#include "kernels_impl.hpp"

namespace simdattn::simd {

KernelTable make_table_avx512() {
  using A = xsimd::avx512bw;
  return {Isa::avx512,
          impl::make_probe_kernels<A>(),
          impl::make_gemm_kernels<A, float, 12, 2, 6, 4>(336, 512, 4096, 2048),
          impl::make_gemm_kernels<A, double, 14, 2, 6, 4>(168, 256, 2048, 1024),
          impl::make_vector_kernels<A, float>(),
          impl::make_vector_kernels<A, double>()};
}

}  // namespace simdattn::simd
