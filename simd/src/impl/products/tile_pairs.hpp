// The fused attention path's tile-layout products (TileAttentionKernels, kernels.hpp) on
// vdpbf16ps, and the packing of A as tiles that AMX shares. AVX512-BF16 intrinsics: included by
// the AVX512-BF16 and AMX tables' translation units only.
//
// pairs_block keeps Gemm16AmxBlock's contract (A as 32 x 32 bf16 tiles or read in place, B as
// panels of 32 columns of bf16 pairs) with the products on the vector unit: per pair of k, one
// or two 64-byte loads of B's pairs (16 columns each), a row's pair broadcast from A (the
// instruction's own broadcast operand) and one vdpbf16ps per 16 columns. Rows go in groups of up
// to 8 within a 16-row half of the tiles: 16 accumulators, more than the instruction's latency
// times its rate on the cores that take this table (6 x 1 on Zen 4), the B vectors loaded once
// per group from L1. Packed A (the attention path's only layout) has its row and step strides
// as constants, so a row's pair is one displacement from the group's pointer.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "impl/tables.hpp"

namespace simdattn::simd::impl {

// A[0:m, 0:kb] as the tiles' packed A (Gemm16Kernels::amx_pack_a): each row's steps of 32 one
// masked 64-byte load and an aligned store.
inline void pack_a_tiles(const std::uint16_t* A, std::int64_t lda, int m, std::int64_t kb, std::uint16_t* ap) {
  for (int r = 0; r < m; ++r) {
    const std::uint16_t* a = A + r * lda;
    for (std::int64_t s = 0; s < kb; s += 32) {
      const std::int64_t n = std::min<std::int64_t>(32, kb - s);
      const auto k = static_cast<__mmask32>(n == 32 ? 0xffffffffu : (1u << n) - 1u);
      _mm512_store_si512(ap + s * 32 + r * 32, _mm512_maskz_loadu_epi16(k, a + s));
    }
  }
}

// C[0:R, 0:16 NV] (+)= the group's rows of A times one panel of B over `steps` steps of 32 k
// and `pairs` pairs of k after them (a last step's part that holds any: the zero pairs past
// kb are not multiplied); the last C vector's lanes in `last`. A: the group's first row at step
// 0, rows a_rs elements apart, steps a_step apart (kPacked: 32 and 1024).
// pf_lines lines from pf prefetched into L2, one a pair step from the first on (any left at the end).
template <int R, int NV, bool kPacked>
inline void pairs_group(std::int64_t steps, int pairs, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_rs,
                        const std::uint16_t* Bp, float* C, std::int64_t ldc, __mmask16 last, bool accumulate, const char* pf,
                        std::int64_t pf_lines) {
  const std::int64_t rs = kPacked ? 32 : a_rs, ss = kPacked ? 1024 : a_step;
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) {
      const __mmask16 k = j == NV - 1 ? last : __mmask16{0xFFFF};
      acc[q][j] = accumulate ? _mm512_maskz_loadu_ps(k, C + q * ldc + 16 * j) : _mm512_setzero_ps();
    }
  // pair s of a step: B's pairs at b, A's step at a
  auto pair_step = [&](const std::uint16_t* a, const std::uint16_t* b, int s) __attribute__((always_inline)) {
    if (pf_lines > 0) {
      _mm_prefetch(pf, _MM_HINT_T1);
      pf += 64;
      --pf_lines;
    }
    __m512bh bv[NV];
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + s * 64 + 32 * j);
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      std::uint32_t pair;
      std::memcpy(&pair, a + q * rs + 2 * s, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) acc[q][j] = _mm512_dpbf16_ps(acc[q][j], av, bv[j]);
    }
  };
  for (std::int64_t t = 0; t < steps; ++t) {
    const std::uint16_t* a = A + t * ss;
    const std::uint16_t* b = Bp + t * 16 * 64;
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s) pair_step(a, b, s);
  }
  for (int s = 0; s < pairs; ++s) pair_step(A + steps * ss, Bp + steps * 16 * 64, s);
  for (; pf_lines > 0; --pf_lines, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);  // (more lines than pair steps)
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j)
      _mm512_mask_storeu_ps(C + q * ldc + 16 * j, j == NV - 1 ? last : __mmask16{0xFFFF}, acc[q][j]);
}

using PairsGroup = void (*)(std::int64_t, int, const std::uint16_t*, std::int64_t, std::int64_t, const std::uint16_t*, float*,
                            std::int64_t, __mmask16, bool, const char*, std::int64_t);

// pairs_group by [kPacked][NV - 1][R] (rows_table: entry 0 null).
inline constexpr int kPairsGroupRows = 8;
template <bool kPacked, int NV>
constexpr auto pairs_groups() {
  return rows_table<PairsGroup, kPairsGroupRows>([](auto r) { return &pairs_group<decltype(r)::value, NV, kPacked>; });
}
inline constexpr std::array<std::array<std::array<PairsGroup, kMaxMr + 1>, 2>, 2> kPairsGroups = {
    {{pairs_groups<false, 1>(), pairs_groups<false, 2>()}, {pairs_groups<true, 1>(), pairs_groups<true, 2>()}}};

// TileAttentionKernels::block on vdpbf16ps: panels of 32 columns, each the rows of its two
// 16-row halves in groups of up to kPairsGroupRows; the prefetch lines shared out evenly over
// the groups. The pairs of k up to kb rounded up to even (packed A is zero past kb, B's rows
// there are multiplied by those zeros or not read; A read in place has kb a multiple of 32): a
// depth of 40 (sdcross) is 20 pairs, not the 32 of two tile steps.
inline void pairs_block(std::int64_t kb, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_half,
                        std::int64_t a_stride, int m, const std::uint16_t* Bp, std::int64_t b_stride, int n, float* C,
                        std::int64_t ldc, bool accumulate, const void* pf, std::int64_t pf_lines) {
  const bool packed = a_step == 1024 && a_half == 512 && a_stride == 64;
  const std::int64_t steps = kb / 32, a_rs = a_stride / 2;
  const int pairs = static_cast<int>((kb % 32 + 1) / 2);
  const std::int64_t groups = std::int64_t{(n + 31) / 32} * ((m + kPairsGroupRows - 1) / kPairsGroupRows);
  const std::int64_t share = (pf_lines + groups - 1) / groups;
  const char* next = static_cast<const char*>(pf);
  for (int j = 0; j < n; j += 32, Bp += b_stride, C += 32) {
    const int nj = std::min(32, n - j), nv = nj > 16 ? 2 : 1;
    const int tail = nj - 16 * (nv - 1);
    const auto last = static_cast<__mmask16>(tail == 16 ? 0xFFFFu : (1u << tail) - 1u);
    for (int r0 = 0; r0 < m; r0 += kPairsGroupRows) {  // (groups of 8 never cross a half)
      const int half = r0 / 16, rows = std::min(kPairsGroupRows, m - r0);
      const std::uint16_t* a = A + half * a_half + (r0 % 16) * a_rs;
      const std::int64_t lines = std::min(share, pf_lines);
      kPairsGroups[packed][nv - 1][rows](steps, pairs, a, a_step, a_rs, Bp, C + r0 * ldc, ldc, last, accumulate, next, lines);
      next += 64 * lines;
      pf_lines -= lines;
    }
  }
}

inline void pairs_done() {}

// TileAttentionKernels::pair_rows: 32 columns of both rows a step, interleaved into two vectors
// of pairs by vpermt2w; the last step's columns through masked loads and stores.
inline void pair_rows_tiles(const std::uint16_t* r0, const std::uint16_t* r1, std::int64_t n, std::uint32_t* dst) {
  alignas(64) static constexpr std::uint16_t kLow[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                         8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                          24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_load_si512(kHigh);
  for (std::int64_t c = 0; c < n; c += 32) {
    const std::int64_t k = std::min<std::int64_t>(32, n - c);
    const auto m = static_cast<__mmask32>(k == 32 ? 0xffffffffu : (1u << k) - 1u);
    const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + c);
    const __m512i b = r1 != nullptr ? _mm512_maskz_loadu_epi16(m, r1 + c) : _mm512_setzero_si512();
    const auto m0 = static_cast<__mmask16>(k >= 16 ? 0xffffu : (1u << k) - 1u);
    _mm512_mask_storeu_epi32(dst + c, m0, _mm512_permutex2var_epi16(a, low, b));
    if (k > 16) {
      const auto m1 = static_cast<__mmask16>(k == 32 ? 0xffffu : (1u << (k - 16)) - 1u);
      _mm512_mask_storeu_epi32(dst + c + 16, m1, _mm512_permutex2var_epi16(a, high, b));
    }
  }
}

}  // namespace simdattn::simd::impl
