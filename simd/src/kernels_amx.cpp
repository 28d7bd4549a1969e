// AMX build: the AVX512-BF16 table plus the bf16 GEMM on AMX tiles (Gemm16Kernels::amx_block)
// and the tile peak probe. Compiled with the AVX-512 flags, -mavx512bf16, -mamx-tile and
// -mamx-bf16 (see simd/CMakeLists.txt).
//
// Tiles of one block (C = A B, at most 32 x 32 of C):
//   tmm0 C[0:16, 0:16]   tmm1 C[0:16, 16:32]   tmm2 C[16:32, 0:16]   tmm3 C[16:32, 16:32]
//   tmm4 A[0:16, k:k+32] tmm5 A[16:32, k:k+32] (A packed as tiles by the caller, or its rows in place)
//   tmm6 B[k:k+32, 0:16] tmm7 B[k:k+32, 16:32] (16 rows of 16 bf16 pairs: the packed B panel)
// Each k step loads two A and two B tiles and issues four tdpbf16ps, so every loaded tile is
// used twice. Edge blocks (m or n < 32) configure shorter tiles (rows of A and C, bytes per row
// of B and C) rather than padding; packed A and B are zero past the depth (B's depth blocks are
// rounded up to 32: k_align).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "impl/products/tile_pairs.hpp"
#include "impl/softmax/softmax_tiles.hpp"
#include "impl/tables.hpp"

namespace simdattn::simd {

KernelTable make_table_avx512_bf16();

namespace {

constexpr int kKc = 256;  // depth block of the packed B (as the vdpbf16ps kernels': one layout)
constexpr int kNr = 32;   // columns of a packed B panel: two B tiles

// The 64-byte LDTILECFG operand (palette 1).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// The block shape this thread's tiles are configured for (m0, m1, n0, n1 in one word; 0: none):
// a configuration is loaded only when a block's shape differs.
thread_local std::uint32_t current_shape = 0;

void configure(int m0, int m1, int n0, int n1) {
  const auto shape = static_cast<std::uint32_t>(m0 | m1 << 8 | n0 << 16 | n1 << 24);  // m0, n0 >= 1: never 0
  if (shape == current_shape) return;
  TileConfig c;
  auto set = [&](int t, int rows, int bytes) {
    c.rows[t] = static_cast<std::uint8_t>(bytes > 0 ? rows : 0);
    c.colsb[t] = static_cast<std::uint16_t>(rows > 0 ? bytes : 0);
  };
  set(0, m0, n0 * 4), set(1, m0, n1 * 4), set(2, m1, n0 * 4), set(3, m1, n1 * 4);
  set(4, m0, 64), set(5, m1, 64);
  set(6, 16, n0 * 4), set(7, 16, n1 * 4);
  // GCC 12 does not see LDTILECFG's builtin read all 64 bytes: without this barrier it drops
  // the stores above as dead (leaving every tile unconfigured: SIGILL at the first tile use).
  __asm__ volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
  current_shape = shape;
}

void release() {
  if (current_shape == 0) return;
  _tile_release();
  current_shape = 0;
}

// C[0:m, 0:n] (+)= A[0:m, 0:kb] Bp (m, n <= 32), Bp one packed panel: the GEMM's depth blocks
// (kb <= kKc), the attention's K panels of any depth (D / 2 pair rows back to back) and V panels.
// Nothing here depends on kb beyond the step count.
template <bool kM1, bool kN1>
void block(std::int64_t kb, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_half, std::int64_t a_stride, int m,
           const std::uint16_t* Bp, int n, float* C, std::int64_t ldc, bool accumulate) {
  const int m0 = std::min(m, 16), m1 = m - m0, n0 = std::min(n, 16), n1 = n - n0;
  configure(m0, m1, n0, n1);
  const std::int64_t cs = ldc * 4;
  if (accumulate) {
    _tile_loadd(0, C, cs);
    if constexpr (kN1) _tile_loadd(1, C + 16, cs);
    if constexpr (kM1) _tile_loadd(2, C + 16 * ldc, cs);
    if constexpr (kM1 && kN1) _tile_loadd(3, C + 16 * ldc + 16, cs);
  } else {
    _tile_zero(0);
    if constexpr (kN1) _tile_zero(1);
    if constexpr (kM1) _tile_zero(2);
    if constexpr (kM1 && kN1) _tile_zero(3);
  }
  for (std::int64_t s = 0; s < kb; s += 32) {
    const std::uint16_t* a = A + (s / 32) * a_step;
    const std::uint16_t* b = Bp + (s / 2) * 2 * kNr;
    _tile_loadd(4, a, a_stride);
    _tile_loadd(6, b, 2 * kNr * 2);
    if constexpr (kN1) _tile_loadd(7, b + 32, 2 * kNr * 2);
    if constexpr (kM1) _tile_loadd(5, a + a_half, a_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kN1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kM1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kM1 && kN1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, cs);
  if constexpr (kN1) _tile_stored(1, C + 16, cs);
  if constexpr (kM1) _tile_stored(2, C + 16 * ldc, cs);
  if constexpr (kM1 && kN1) _tile_stored(3, C + 16 * ldc + 16, cs);
}

// Panels of 32 columns one after the other: each a block (the configuration stays loaded
// across the full ones).
void amx_block(std::int64_t kb, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_half, std::int64_t a_stride,
               int m, const std::uint16_t* Bp, std::int64_t b_stride, int n, float* C, std::int64_t ldc, bool accumulate) {
  const bool m1 = m > 16;
  for (int j = 0; j < n; j += kNr, Bp += b_stride, C += kNr) {
    const int nj = std::min(kNr, n - j);
    const bool n1 = nj > 16;
    if (m1 && n1) block<true, true>(kb, A, a_step, a_half, a_stride, m, Bp, nj, C, ldc, accumulate);
    else if (m1) block<true, false>(kb, A, a_step, a_half, a_stride, m, Bp, nj, C, ldc, accumulate);
    else if (n1) block<false, true>(kb, A, a_step, a_half, a_stride, m, Bp, nj, C, ldc, accumulate);
    else block<false, false>(kb, A, a_step, a_half, a_stride, m, Bp, nj, C, ldc, accumulate);
  }
}

// TileAttentionKernels::block on tiles: amx_block's panels, the prefetch lines shared out evenly
// over them (into L2, before each panel's block).
void attention_block(std::int64_t kb, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_half,
                     std::int64_t a_stride, int m, const std::uint16_t* Bp, std::int64_t b_stride, int n, float* C,
                     std::int64_t ldc, bool accumulate, const void* pf, std::int64_t pf_lines) {
  const std::int64_t panels = (n + kNr - 1) / kNr, share = (pf_lines + panels - 1) / panels;
  const char* next = static_cast<const char*>(pf);
  for (int j = 0; j < n; j += kNr, Bp += b_stride, C += kNr) {
    for (std::int64_t i = 0; i < share && pf_lines > 0; ++i, --pf_lines, next += 64) _mm_prefetch(next, _MM_HINT_T1);
    amx_block(kb, A, a_step, a_half, a_stride, m, Bp, b_stride, std::min(kNr, n - j), C, ldc, accumulate);
  }
}

// `iterations` rounds of four independent tdpbf16ps (16 x 32 by 32 x 16 into four C tiles) on
// tiles loaded once: the tile peak (perf's peak/amx-bf16). Returns a value of the results so the
// work cannot be dropped.
float amx_peak(std::int64_t iterations) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
  current_shape = 0;  // not a block configuration
  alignas(64) std::uint16_t ab[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) ab[i] = 0x3c00;  // bf16 2^-7: sums stay small
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

}  // namespace

KernelTable make_table_amx() {
  KernelTable t = make_table_avx512_bf16();
  t.isa = Isa::amx;
  // bf16: the pair layout of the vdpbf16ps kernels (which run blocks of fewer than
  // kAmxMinRows rows), depth blocks rounded up to whole tiles, and the tile block kernel.
  t.gemm_bf16 = t.gemm_bf16_pairs;
  if (t.gemm_bf16.kc != kKc || t.gemm_bf16.nr != kNr) __builtin_trap();  // one layout for both
  t.gemm_bf16.k_align = 32;
  t.gemm_bf16.amx_block = &amx_block;
  t.gemm_bf16.amx_done = &release;
  t.gemm_bf16.amx_pack_a = &impl::pack_a_tiles;
  t.probe.amx_peak = &amx_peak;
  t.tile_attention = {.softmax_rows = &impl::softmax_rows_to_tiles<false>,
                      .softmax_rows_lse = &impl::softmax_rows_to_tiles<true>,
                      .block = &attention_block,
                      .pack_a = &impl::pack_a_tiles,
                      .pair_rows = &impl::pair_rows_tiles,
                      .done = &release};
  return t;
}

}  // namespace simdattn::simd
