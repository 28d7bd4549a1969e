// AVX-512 (F/BW/DQ/CD) build of the kernels. Compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512cd -mavx2 -mfma (see simd/CMakeLists.txt).
//
// The GEMM blocking. Packed B (most shapes) goes rows outer: an A micro-panel stays in L1 while
// it sweeps the packed kc x nc block of B, which stays in L2. B pre-packed (few rows per
// thread) or read in place goes columns outer, the mc x kc block of A in L2. kc = 256 and nc
// fitted to half of the L2 beat both columns outer with kc = 512 and the B block in L3, and
// rows outer with kc = 344-384 or nc = 512-768 (guarded by gemm/native/1024x1024x1024/t1).
#include "impl/tables.hpp"

namespace simdattn::simd {
namespace {

// f32: a 14 x 32 tile, 28 accumulators + 2 B vectors + 1 A broadcast of the 32 zmm registers
// (with the FMA form fixed, fma_into; 12 x 32 before: 3-7% slower on K = 2048 products).
// Two FMA pipes x 4-cycle latency need >= 8 independent chains.
constexpr impl::GemmParams kF32{
    .tile = {.mr = 14, .nv = 2},
    .mc = 336,  // 336 x 256 x 4 B = 336 KiB of A in L2 (guarded by gemm/native/128x768x768/t1)
    // An A micro-panel (14 x 256 x 4 B = 14 KiB) stays in L1; so does a pre-packed 256 x 32
    // panel of B (32 KiB).
    .kc = 256,
    // At most: the driver lowers it to fill half of the CPU's L2 (1024 at kc = 256 in a 2 MiB
    // L2; the whole 2048 columns at K = 64, guarded by gemm/native/2048x2048x64/t1).
    .nc = 4096,
    // The kernel prefetches B's rows, so a deeper panel than L1 holds costs nothing and C is
    // passed over less: one pass over a 768-deep B (guarded by gemm/native/128x768x768/t1 and
    // t2).
    .kc_b_in_place = 768,
    // A read in place (narrow C): 6 x 64, 24 accumulators + 4 B vectors + 1 A broadcast; 6 rows
    // of A per L1 set stay within its 12 ways, and a 64-wide head is one panel.
    .tile_a_in_place = {.mr = 6, .nv = 4},
    // A's rows stream through; the packed B panel (2048 x 64 x 4 B = 512 KiB) stays in L2
    // (guarded by gemm/native/2048x64x2048/t1).
    .kc_a_in_place = 2048,
};

// f64: the f32 blocking in bytes, on 14 x 16 tiles (28 accumulators + 2 B vectors + 1 A
// broadcast) and 6 x 32 tiles with A read in place.
constexpr impl::GemmParams kF64{
    .tile = {.mr = 14, .nv = 2},
    .mc = 168,
    .kc = 256,
    .nc = 2048,
    .kc_b_in_place = 768,
    .tile_a_in_place = {.mr = 6, .nv = 4},
    .kc_a_in_place = 1024,
};

}  // namespace

KernelTable make_table_avx512() {
  return impl::make_kernel_table<xsimd::avx512bw, kF32, kF64>(Isa::avx512);
}

}  // namespace simdattn::simd
