// SSE2 baseline build of the kernels: runs on every x86-64 CPU. No FMA (xsimd emulates it with a
// multiply and an add).
//
// The GEMM blocking follows kernels_avx512.cpp's plan on the 16 xmm registers. Guarded by the
// gemm/native benchmarks with SIMDATTN_ISA=sse2.
#include "impl/tables.hpp"

namespace simdattn::simd {
namespace {

// f32: a 4 x 8 tile, 8 accumulators + 2 B vectors + 1 A broadcast + the emulated FMA's
// temporaries of the 16 xmm registers.
constexpr impl::GemmParams kF32{
    .tile = {.mr = 4, .nv = 2},
    .mc = 128,  // 128 x 256 x 4 B = 128 KiB of A in L2
    .kc = 256,  // an A micro-panel (4 x 256 x 4 B = 4 KiB) stays in L1
    .nc = 2048,  // at most (the driver fits the B block to half the L2)
    .kc_b_in_place = 768,  // the kernel prefetches B's rows: one pass over a 768-deep B
    .tile_a_in_place = {.mr = 4, .nv = 2},
    .kc_a_in_place = 512,
};

// f64: 4 x 4 tiles, otherwise the same.
constexpr impl::GemmParams kF64{
    .tile = {.mr = 4, .nv = 2},
    .mc = 128,
    .kc = 256,
    .nc = 2048,
    .kc_b_in_place = 768,
    .tile_a_in_place = {.mr = 4, .nv = 2},
    .kc_a_in_place = 512,
};

}  // namespace

KernelTable make_table_sse2() {
  return impl::make_kernel_table<xsimd::sse2, kF32, kF64>(Isa::sse2);
}

}  // namespace simdattn::simd
