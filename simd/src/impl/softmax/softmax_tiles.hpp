// The tile attention path's online-softmax step (TileAttentionKernels::softmax_rows and
// softmax_rows_lse): the step of VectorKernels::softmax_rows on f32 scores, its weights rounded
// to bf16 (vcvtne2ps2bf16) and stored straight into the 32 x 32 tiles of P the PV tile product
// loads. AVX512-BF16 intrinsics: included by the AVX512-BF16 and AMX tables' translation units
// only.
//
// Per weight: the scaled score minus the reference (rounded as softmax_rows' max is, so the row
// max gives exactly 0 whatever its size: -1e30 masks included), times log2(e) (one FMA where the
// reference is near 0), its fraction above the floor by vreduceps, a polynomial for 2^f on [0, 1)
// with p(0) = 1, vscalefps by the floor with the flush-to-zero and the visibility mask in its
// zero-masking form, the row sum, and half a conversion and 64-byte store. The polynomial is
// what the weights need: degree 3 (relative error 8.6e-5) where they only become P, which bf16
// rounds by up to 2^-8; degree 4 (2.9e-6) where the call's lse is an output, as l is then more
// than P's normaliser. Rows go in fours (independent chains); rows whose visible keys do not
// cover whole vectors (causal and window edges, a step starting mid-tile, a short last step) take
// masked loads.
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
// normal: never a denormal) or where k is clear; NaN stays NaN. f = t - floor(t) in [0, 1) by
// vreduceps (one instruction where a rounding and a subtraction take two or three), 2^f by a
// polynomial with p(0) = 1 (the row max's weight exactly 1), fitted minimax in relative error:
// kExact degree 4, 2.9e-6; else degree 3, 8.6e-5 (1/45 of bf16's rounding). vscalefps scales by
// 2^floor(t) itself.
template <bool kExact>
inline __m512 exp2_weights(__m512 t, __mmask16 k) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p;
  if constexpr (kExact) {
    p = _mm512_fmadd_ps(_mm512_set1_ps(0.0134266298f), f, _mm512_set1_ps(0.0522425622f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.241280168f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693044841f));
  } else {
    p = _mm512_fmadd_ps(_mm512_set1_ps(0.0770663843f), f, _mm512_set1_ps(0.22764571f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.695116639f));
  }
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __mmask16 keep = _mm512_mask_cmp_ps_mask(k, t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, t);
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
//
// One sweep where the rows' references hold: once every row has one (a finite m), the weights
// are taken against it in the same sweep that finds the block max, and only if a row's
// reference then moves (its block max past the slack of online_max_step) is the block swept
// again against the new ones. Either way the weights are those of a max pass and then a weight
// pass (the same reference, the same arithmetic), with one read of x where the reference holds.
template <int R, bool kMasked, bool kExact>
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
  // (v first: vmaxps gives its second operand where either is NaN, so a NaN score never enters
  // the max, and the reference follows the row's other scores; the NaN's weight stays NaN)
  auto max_of = [&](int q, __mmask16 k, __m512 v) {
    mx[q] = _mm512_mask_max_ps(mx[q], k, positive ? v : _mm512_mul_ps(v, s), mx[q]);
  };
  constexpr float kLog2e = 1.44269504088896341f;
  float ref[R];
  __m512 sum[R];
  // The weights against ref (kMax: the block max found on the way). kFused: t = x * (scale
  // log2 e) - ref log2 e in one FMA, within 1.2e-7 |ref| of the exact form's t (4e-5 relative in
  // the weight at |ref| = kNearRef); else (x * scale - ref) * log2 e, where x * scale is rounded as
  // the max was, so the max gives exactly 0 at any size.
  auto weigh = [&](auto fused, auto find_max) {
    constexpr bool kFused = decltype(fused)::value, kMax = decltype(find_max)::value;
    const __m512 c1 = _mm512_set1_ps(kFused ? scale * kLog2e : scale), log2e = _mm512_set1_ps(kLog2e);
    __m512 c0[R];
    for (int q = 0; q < R; ++q) {
      c0[q] = _mm512_set1_ps(kFused ? -ref[q] * kLog2e : ref[q]);
      sum[q] = _mm512_setzero_ps();
    }
    auto base2 = [&](int q, __m512 v) {
      if constexpr (kFused) return _mm512_fmadd_ps(v, c1, c0[q]);
      else return _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(v, c1), c0[q]), log2e);
    };
    for (std::int64_t c = 0; c < cols; c += 32)
      for (int q = 0; q < R; ++q) {
        const float* xr = x + q * ld + c;
        const __mmask16 k0 = mask(q, c), k1 = mask(q, c + 16);
        // (a vector with no visible key is zeros without the arithmetic: a row's tail past the
        // keys, the far side of a causal edge)
        __m512 w0 = _mm512_setzero_ps(), w1 = _mm512_setzero_ps();
        if (k0 != 0) {
          const __m512 v = _mm512_maskz_loadu_ps(k0, xr);
          if constexpr (kMax) max_of(q, k0, v);
          w0 = exp2_weights<kExact>(base2(q, v), k0);
        }
        if (k1 != 0) {
          const __m512 v = _mm512_maskz_loadu_ps(k1, xr + 16);
          if constexpr (kMax) max_of(q, k1, v);
          w1 = exp2_weights<kExact>(base2(q, v), k1);
        }
        sum[q] = _mm512_add_ps(sum[q], _mm512_add_ps(w0, w1));
        _mm512_store_si512(p + q * 32 + (c / 32) * 1024, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
      }
  };
  auto weigh_against_ref = [&](auto find_max) {
    bool near = true;  // every reference within kNearRef of 0
    for (int q = 0; q < R; ++q) near = near && std::fabs(ref[q]) <= kNearRef;
    if (near) weigh(std::true_type{}, find_max);
    else weigh(std::false_type{}, find_max);
  };
  bool held = true;  // every row's reference finite: tried in one sweep
  for (int q = 0; q < R; ++q) {
    held = held && std::isfinite(m[q]);
    ref[q] = m[q];
  }
  if (held) {
    weigh_against_ref(std::true_type{});
  } else {
    for (std::int64_t c = 0; c < cols; c += 16)
      for (int q = 0; q < R; ++q) {
        const __mmask16 k = mask(q, c);
        max_of(q, k, _mm512_maskz_loadu_ps(k, x + q * ld + c));
      }
  }
  float bm[R];
  reduce_rows<R, true>(mx, bm);
  bool moved = !held;
  for (int q = 0; q < R; ++q) {
    const float r = online_max_step(positive ? bm[q] * scale : bm[q], m[q], l[q], alpha[q]);
    moved = moved || r != ref[q];
    ref[q] = r;
  }
  if (moved) weigh_against_ref(std::false_type{});
  float total[R];
  reduce_rows<R, false>(sum, total);
  for (int q = 0; q < R; ++q) l[q] += total[q];
}

// See TileAttentionKernels::softmax_rows (kExact: softmax_rows_lse; kernels.hpp).
template <bool kExact>
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
    if (g == kRows && whole) tile_row_group<kRows, false, kExact>(xr, ld, cols, mk, mk_row, scale, m + r, l + r, alpha + r, pr);
    else if (g == kRows) tile_row_group<kRows, true, kExact>(xr, ld, cols, mk, mk_row, scale, m + r, l + r, alpha + r, pr);
    else
      for (std::int64_t q = 0; q < g; ++q)
        tile_row_group<1, true, kExact>(xr + q * ld, ld, cols, mk + q * mk_row, mk_row, scale, m + r + q, l + r + q,
                                alpha + r + q, pr + q * 32);
  }
}

}  // namespace simdattn::simd::impl
