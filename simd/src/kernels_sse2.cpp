// SSE2 baseline build of the kernels: runs on every x86-64 CPU. No FMA (xsimd emulates it with a
// multiply and an add). Blocking: 16 xmm registers hold a 4 x 8 f32 tile (8 accumulators) + 2 B
// vectors + 1 A broadcast + temporaries; kc = 256, nc <= 2048 (the driver fits the B block to
// half the L2); B read in place: 768-deep passes, mc = 128. f64: 4 x 4 tiles.
#include "kernels_impl.hpp"

namespace simdattn::simd {

KernelTable make_table_sse2() {
  using A = xsimd::sse2;
  return {Isa::sse2,
          impl::make_probe_kernels<A>(),
          impl::make_gemm_kernels<A, float, 4, 2, 4, 2>(128, 256, 2048, 512, 768),
          impl::make_gemm_kernels<A, double, 4, 2, 4, 2>(128, 256, 2048, 512, 768),
          impl::make_vector_kernels<A, float>(),
          impl::make_vector_kernels<A, double>()};
}

}  // namespace simdattn::simd
