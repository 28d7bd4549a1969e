// AVX2 + FMA3 build of the kernels. Compiled with -mavx2 -mfma.
//
// Blocking: 16 ymm registers hold a 6 x 16 f32 tile (12 accumulators) + 2 B vectors + 1 A
// broadcast; 12 chains cover 2 FMA pipes x 4-5 cycles. kc = 256 (A micro-panel 6 KiB in L1),
// nc <= 4096 (the driver fits the B block to half the L2); B read in place: 768-deep passes,
// mc = 144 (A block in L2). f64: 6 x 8 tiles, the same depths, nc <= 2048.
#include "kernels_impl.hpp"

namespace simdattn::simd {

KernelTable make_table_avx2() {
  using A = xsimd::fma3<xsimd::avx2>;
  return {Isa::avx2,
          impl::make_probe_kernels<A>(),
          impl::make_gemm_kernels<A, float, 6, 2, 6, 2>(144, 256, 4096, 1024, 768),
          impl::make_gemm_kernels<A, double, 6, 2, 6, 2>(144, 256, 2048, 512, 768),
          impl::make_vector_kernels<A, float>(),
          impl::make_vector_kernels<A, double>()};
}

}  // namespace simdattn::simd
