// The AMX attention path's online-softmax step (AmxAttentionKernels::softmax_rows): the step of
// VectorKernels::softmax_rows on f32 scores, its weights rounded to bf16 (vcvtne2ps2bf16) and
// stored straight into the 32 x 32 tiles of P the PV tile product loads. AVX512-BF16 intrinsics:
// included by the AMX table's translation unit only.
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
#include <cstdint>
#include <limits>

#include "softmax.hpp"

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

// R rows of one tile group. x: row 0's score at column 0 (of cols, a multiple of 32), rows ld
// apart; row q sees columns [lo[q], hi[q]) only (kMasked; else all of them) and nothing
// outside them is read. p: row 0 of the group's P tiles (step of 32 columns s at p + s * 1024,
// rows 32 apart).
template <int R, bool kMasked>
inline void tile_row_group(const float* x, std::int64_t ld, std::int64_t cols, const std::int64_t* lo,
                           const std::int64_t* hi, float scale, float* m, float* l, float* alpha, std::uint16_t* p) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m512 ninf = _mm512_set1_ps(neg_inf), s = _mm512_set1_ps(scale);
  auto mask = [&](int q, std::int64_t c) -> __mmask16 {
    if constexpr (kMasked) return lanes_in(c, lo[q], hi[q]);
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
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 ref[R], sum[R];
  for (int q = 0; q < R; ++q) {
    const float bm = _mm512_reduce_max_ps(mx[q]);
    ref[q] = _mm512_set1_ps(online_max_step(positive ? bm * scale : bm, m[q], l[q], alpha[q]));
    sum[q] = _mm512_setzero_ps();
  }
  auto base2 = [&](int q, const float* at, __mmask16 k) {  // (x * scale - ref) * log2(e)
    return _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, at), s), ref[q]), log2e);
  };
  for (std::int64_t c = 0; c < cols; c += 32)
    for (int q = 0; q < R; ++q) {
      const float* xr = x + q * ld + c;
      const __mmask16 k0 = mask(q, c), k1 = mask(q, c + 16);
      const __m512 w0 = exp2_weights(base2(q, xr, k0), k0);
      const __m512 w1 = exp2_weights(base2(q, xr + 16, k1), k1);
      sum[q] = _mm512_add_ps(sum[q], _mm512_add_ps(w0, w1));
      _mm512_store_si512(p + q * 32 + (c / 32) * 1024, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
    }
  for (int q = 0; q < R; ++q) l[q] += _mm512_reduce_add_ps(sum[q]);
}

// See AmxAttentionKernels::softmax_rows (kernels.hpp).
inline void softmax_rows_to_tiles(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t n, float scale,
                                  const std::int64_t* lo, const std::int64_t* hi, float* m, float* l, float* alpha,
                                  std::uint16_t* p, std::int64_t lead) {
  const std::int64_t cols = (lead + n + 31) / 32 * 32;
  const float* x0 = x - lead;  // column 0 of the tiles (columns before lead are never read)
  constexpr int kRows = 4;
  std::int64_t vlo[kRows], vhi[kRows];
  const bool whole = lo == nullptr && lead == 0 && n == cols;
  for (std::int64_t r = 0; r < rows; r += kRows) {
    const std::int64_t g = std::min<std::int64_t>(kRows, rows - r);
    for (std::int64_t q = 0; q < g; ++q) {
      vlo[q] = lead + (lo != nullptr ? std::clamp<std::int64_t>(lo[r + q], 0, n) : 0);
      vhi[q] = lead + (hi != nullptr ? std::clamp<std::int64_t>(hi[r + q], 0, n) : n);
    }
    const float* xr = x0 + r * ld;
    std::uint16_t* pr = p + r * 32;
    if (g == kRows && whole) tile_row_group<kRows, false>(xr, ld, cols, vlo, vhi, scale, m + r, l + r, alpha + r, pr);
    else if (g == kRows) tile_row_group<kRows, true>(xr, ld, cols, vlo, vhi, scale, m + r, l + r, alpha + r, pr);
    else
      for (std::int64_t q = 0; q < g; ++q)
        tile_row_group<1, true>(xr + q * ld, ld, cols, vlo + q, vhi + q, scale, m + r + q, l + r + q, alpha + r + q,
                                pr + q * 32);
  }
}

}  // namespace simdattn::simd::impl
