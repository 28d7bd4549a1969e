// AVX2 + FMA3 build of the kernels. Compiled with -mavx2 -mfma.
//
// The GEMM blocking follows kernels_avx512.cpp's plan (rows outer with packed B, the driver
// fitting the B block to half of the L2; columns outer with B pre-packed or read in place) on
// the 16 ymm registers. Guarded by the gemm/native benchmarks with SIMDATTN_ISA=avx2.
#include "impl/tables.hpp"

namespace simdattn::simd {
namespace {

// f32: a 6 x 16 tile, 12 accumulators + 2 B vectors + 1 A broadcast of the 16 ymm registers;
// 12 chains cover 2 FMA pipes x 4-5 cycles.
constexpr impl::GemmParams kF32{
    .tile = {.mr = 6, .nv = 2},
    .mc = 144,  // 144 x 256 x 4 B = 144 KiB of A in L2
    .kc = 256,  // an A micro-panel (6 x 256 x 4 B = 6 KiB) stays in L1
    .nc = 4096,  // at most (the driver fits the B block to half the L2)
    .kc_b_in_place = 768,  // the kernel prefetches B's rows: one pass over a 768-deep B
    .tile_a_in_place = {.mr = 6, .nv = 2},
    .kc_a_in_place = 1024,  // the packed B panel: 1024 x 16 x 4 B = 64 KiB
};

// f64: 6 x 8 tiles, the same depths, the B block's columns halved.
constexpr impl::GemmParams kF64{
    .tile = {.mr = 6, .nv = 2},
    .mc = 144,
    .kc = 256,
    .nc = 2048,
    .kc_b_in_place = 768,
    .tile_a_in_place = {.mr = 6, .nv = 2},
    .kc_a_in_place = 512,
};

}  // namespace

KernelTable make_table_avx2() {
  return impl::make_kernel_table<xsimd::fma3<xsimd::avx2>, kF32, kF64>(Isa::avx2);
}

}  // namespace simdattn::simd
