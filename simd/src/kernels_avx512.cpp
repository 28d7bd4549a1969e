// AVX-512 (F/BW/DQ/CD) build of the kernels. Compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512cd -mavx2 -mfma (see simd/CMakeLists.txt).
//
// Blocking, f32: a 12 x 32 tile: 24 accumulators + 2 B vectors + 1 A broadcast of the 32 zmm
// registers. Two FMA pipes x 4-cycle latency need >= 8 independent chains; 24 give slack.
// kc = 512: the B micro-panel (512 x 32 x 4 B = 64 KiB) overflows the 48 KiB L1 and is read
// from L2 in part, but the longer k loop halves the C tile's loads and stores and the passes
// over A; mc = 336 (28 x 12): the A block (336 x 512 x 4 B = 672 KiB) stays in the 2 MiB L2;
// nc = 4096: the B block (8 MiB) lives in L3. Measured (gemm/native/1024x1024x1024/t1, best of
// 4 alternating runs, ms): 12 x 32, kc 512: 15.0; 14 x 32, kc 384: 15.1; 14 x 32, kc 256:
// 15.4; 12 x 32, kc 256: 15.7. f64: 14 x 16 tiles, kc = 256 (B panel 32 KiB), mc = 168,
// nc = 2048.
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
