// The tile attention path's online-softmax step (TileAttentionKernels::softmax_rows): the step of
// VectorKernels::softmax_rows on f32 scores, its weights rounded to bf16 (vcvtne2ps2bf16) and
// stored straight into the 32 x 32 tiles of P the PV tile product loads. AVX512-BF16 intrinsics:
// included by the AVX512-BF16 and AMX tables' translation units only.
//
// Per weight: the scaled score minus the reference (rounded as softmax_rows' max is, so the row
// max gives exactly 0 whatever its size: -1e30 masks included), times log2(e), a rounding to the
// integer part, a degree-4 polynomial for 2^f on [-1/2, 1/2] (relative error 3.5e-6, fitted at
// Chebyshev nodes: far below bf16's 2^-9 rounding), vscalefps with the flush-to-zero and the
// visibility mask in its zero-masking form, the row sum, and half a conversion and 64-byte store.
// Rows go in fours (independent chains); rows whose visible keys do not cover whole vectors
// (causal and window edges, a step starting mid-tile, a short last step) take masked loads.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "impl/softmax/softmax.hpp"

namespace simdattn::simd::impl {

// Lanes c .. c + 15 that fall inside [lo, hi).
inline __mmask16 lanes_in(std::int64_t c, std::int64_t lo, std::int64_t hi) {
  const auto a = static_cast<unsigned>(std::clamp<std::int64_t>(lo - c, 0, 16));
  const auto z = static_cast<unsigned>(std::clamp<std::int64_t>(hi - c, 0, 16));
  return z <= a ? __mmask16{0} : static_cast<__mmask16>(((1u << z) - 1u) & ~((1u << a) - 1u));
}

// 2^t for t = scaled score minus reference, in base 2; 0 where t < -126 (below the smallest
// normal: never a denormal) or where k is clear; NaN stays NaN.
inline __m512 exp2_weights(__m512 t, __mmask16 k) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.00966636852f), f, _mm512_set1_ps(0.0559219758f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022349f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693121045f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __mmask16 keep = k & _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// Below this size of a row's reference max, the fused (one FMA) form of the exp's argument.
inline constexpr float kNearRef = 256.0f;

// out[q] = the max (kMax) or the sum of v[q]'s 16 lanes, q < R. Four rows share their
// shuffles: 13 operations where four separate reductions take 32.
template <int R, bool kMax>
inline void reduce_rows(const __m512* v, float* out) {
  auto op = [](__m512 a, __m512 b) { return kMax ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b); };
  if constexpr (R == 4) {
    // 128-bit blocks: [v0 b0.b2, v0 b1.b3, v1 b0.b2, v1 b1.b3], the same for v2 and v3
    const __m512 ab = op(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
    const __m512 cd = op(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
    // block q: row q's four partial lanes, then reduced within the block
    __m512 r = op(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    r = op(r, _mm512_permute_ps(r, 0x4E));
    r = op(r, _mm512_permute_ps(r, 0xB1));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, r);
    for (int q = 0; q < 4; ++q) out[q] = lanes[4 * q];
  } else {
    for (int q = 0; q < R; ++q) out[q] = kMax ? _mm512_reduce_max_ps(v[q]) : _mm512_reduce_add_ps(v[q]);
  }
}

// The most columns of a step (TileAttentionKernels::softmax_rows' lead + n, rounded up to 32).
inline constexpr std::int64_t kTileStepCols = 512;

// Which lanes of each vector of columns [0, cols) fall inside [lo, hi): whole vectors without
// the arithmetic (most of a row).
inline void vector_masks(std::int64_t cols, std::int64_t lo, std::int64_t hi, __mmask16* mk) {
  for (std::int64_t c = 0; c < cols; c += 16) mk[c / 16] = c >= lo && c + 16 <= hi ? __mmask16{0xFFFF} : lanes_in(c, lo, hi);
}

// R rows of one tile group. x: row 0's score at column 0 (of cols, a multiple of 32), rows ld
// apart; with kMasked, row q reads and weighs only the lanes of mk[q * mk_row + v] in vector v of its
// columns (mk_row 0: one set for all rows), else all columns. p: row 0 of the group's P tiles
// (step of 32 columns s at p + s * 1024, rows 32 apart).
template <int R, bool kMasked>
inline void tile_row_group(const float* x, std::int64_t ld, std::int64_t cols, const __mmask16* mk, std::int64_t mk_row,
                           float scale, float* m, float* l, float* alpha, std::uint16_t* p) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m512 ninf = _mm512_set1_ps(neg_inf), s = _mm512_set1_ps(scale);
  auto mask = [&](int q, std::int64_t c) -> __mmask16 {
    if constexpr (kMasked) return mk[q * mk_row + c / 16];
    else return 0xFFFF;
  };
  // The block max of x * scale; for scale > 0, (max x) * scale exactly (rounding is monotonic).
  const bool positive = scale > 0.0f;
  __m512 mx[R];
  for (int q = 0; q < R; ++q) mx[q] = ninf;
  for (std::int64_t c = 0; c < cols; c += 16)
    for (int q = 0; q < R; ++q) {
      const __mmask16 k = mask(q, c);
      __m512 v = _mm512_mask_loadu_ps(ninf, k, x + q * ld + c);
      if (!positive) v = _mm512_mask_mul_ps(ninf, k, v, s);
      mx[q] = _mm512_max_ps(mx[q], v);  // (as softmax_rows': a NaN lane gives way to later values)
    }
  constexpr float kLog2e = 1.44269504088896341f;
  float bm[R], ref[R];
  reduce_rows<R, true>(mx, bm);
  bool near = true;  // every reference within kNearRef of 0
  for (int q = 0; q < R; ++q) {
    ref[q] = online_max_step(positive ? bm[q] * scale : bm[q], m[q], l[q], alpha[q]);
    near = near && std::fabs(ref[q]) <= kNearRef;
  }
  __m512 sum[R];
  for (int q = 0; q < R; ++q) sum[q] = _mm512_setzero_ps();
  // kFused: t = x * (scale log2 e) - ref log2 e in one FMA, within 1.2e-7 |ref| of the exact
  // form's t (4e-5 relative in the weight at |ref| = kNearRef); else (x * scale - ref) * log2 e,
  // where x * scale is rounded as the max was, so the max gives exactly 0 at any size.
  auto exp_pass = [&](auto fused) {
    constexpr bool kFused = decltype(fused)::value;
    const __m512 c1 = _mm512_set1_ps(kFused ? scale * kLog2e : scale), log2e = _mm512_set1_ps(kLog2e);
    __m512 c0[R];
    for (int q = 0; q < R; ++q) c0[q] = _mm512_set1_ps(kFused ? -ref[q] * kLog2e : ref[q]);
    auto base2 = [&](int q, const float* at, __mmask16 k) {
      const __m512 v = _mm512_maskz_loadu_ps(k, at);
      if constexpr (kFused) return _mm512_fmadd_ps(v, c1, c0[q]);
      else return _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(v, c1), c0[q]), log2e);
    };
    for (std::int64_t c = 0; c < cols; c += 32)
      for (int q = 0; q < R; ++q) {
        const float* xr = x + q * ld + c;
        const __mmask16 k0 = mask(q, c), k1 = mask(q, c + 16);
        // (a vector with no visible key is zeros without the arithmetic: a row's tail past the
        // keys, the far side of a causal edge)
        const __m512 w0 = k0 != 0 ? exp2_weights(base2(q, xr, k0), k0) : _mm512_setzero_ps();
        const __m512 w1 = k1 != 0 ? exp2_weights(base2(q, xr + 16, k1), k1) : _mm512_setzero_ps();
        sum[q] = _mm512_add_ps(sum[q], _mm512_add_ps(w0, w1));
        _mm512_store_si512(p + q * 32 + (c / 32) * 1024, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
      }
  };
  if (near) exp_pass(std::true_type{});
  else exp_pass(std::false_type{});
  float total[R];
  reduce_rows<R, false>(sum, total);
  for (int q = 0; q < R; ++q) l[q] += total[q];
}

// See TileAttentionKernels::softmax_rows (kernels.hpp).
inline void softmax_rows_to_tiles(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t n, float scale,
                                  const std::int64_t* lo, const std::int64_t* hi, float* m, float* l, float* alpha,
                                  std::uint16_t* p, std::int64_t lead) {
  const std::int64_t cols = (lead + n + 31) / 32 * 32;
  const float* x0 = x - lead;  // column 0 of the tiles (columns before lead are never read)
  constexpr int kRows = 4;
  constexpr std::int64_t kVectors = kTileStepCols / 16;
  const bool whole = lo == nullptr && lead == 0 && n == cols;
  // One interval for every row (no lo / hi): its masks once; else each row's, per group of rows.
  __mmask16 mk[kRows * kVectors];
  const std::int64_t mk_row = lo == nullptr ? 0 : kVectors;
  if (lo == nullptr) vector_masks(cols, lead, lead + n, mk);
  for (std::int64_t r = 0; r < rows; r += kRows) {
    const std::int64_t g = std::min<std::int64_t>(kRows, rows - r);
    if (lo != nullptr)
      for (std::int64_t q = 0; q < g; ++q)
        vector_masks(cols, lead + std::clamp<std::int64_t>(lo[r + q], 0, n), lead + std::clamp<std::int64_t>(hi[r + q], 0, n),
                     mk + q * kVectors);
    const float* xr = x0 + r * ld;
    std::uint16_t* pr = p + r * 32;
    if (g == kRows && whole) tile_row_group<kRows, false>(xr, ld, cols, mk, mk_row, scale, m + r, l + r, alpha + r, pr);
    else if (g == kRows) tile_row_group<kRows, true>(xr, ld, cols, mk, mk_row, scale, m + r, l + r, alpha + r, pr);
    else
      for (std::int64_t q = 0; q < g; ++q)
        tile_row_group<1, true>(xr + q * ld, ld, cols, mk + q * mk_row, mk_row, scale, m + r + q, l + r + q,
                                alpha + r + q, pr + q * 32);
  }
}

}  // namespace simdattn::simd::impl
