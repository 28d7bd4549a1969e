// The merge of two attention states' rows (StateKernels, kernels.hpp): y = w_a a + w_b b in double,
// rounded once to f32. Every ISA gives the same bits: the sum is one explicit fused multiply-add
// over the rounded first product (std::fma on SSE2), so no compiler contraction can differ.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

// One value: fma(w_b, b, 0 + w_a a) rounded to f32, to nearest even or (odd) to odd: an inexact
// result truncated toward zero with its last bit set (simdattn/half.hpp's round_to_odd).
template <class Arch>
inline float merge_pair_value(float a, float b, double wa, double wb, bool odd) {
  const double x = std::fma(wb, static_cast<double>(b), 0.0 + wa * static_cast<double>(a));
  const float t = static_cast<float>(x);
  if (!odd) return t;
  const double back = static_cast<double>(t);
  std::uint32_t u;
  std::memcpy(&u, &t, sizeof u);
  u = (u - static_cast<std::uint32_t>(std::fabs(back) > std::fabs(x))) | static_cast<std::uint32_t>(back != x);
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

// Eight values on AVX-512 (doubles in a zmm, the f32 result in a ymm).
template <class Arch>
__attribute__((always_inline)) inline __m256 merge_pair8_avx512(__m256 a, __m256 b, __m512d wa, __m512d wb, bool odd) {
  const __m512d x = _mm512_fmadd_pd(wb, _mm512_cvtps_pd(b), _mm512_add_pd(_mm512_setzero_pd(), _mm512_mul_pd(wa, _mm512_cvtps_pd(a))));
  const __m256 t = _mm512_cvtpd_ps(x);
  if (!odd) return t;
  const __m512d back = _mm512_cvtps_pd(t);
  const __mmask8 inexact = _mm512_cmp_pd_mask(back, x, _CMP_NEQ_UQ);
  const __mmask8 up = _mm512_cmp_pd_mask(_mm512_abs_pd(back), _mm512_abs_pd(x), _CMP_GT_OQ);
  const __m256i down = _mm512_cvtepi64_epi32(_mm512_maskz_set1_epi64(up, -1));
  const __m256i last = _mm512_cvtepi64_epi32(_mm512_maskz_set1_epi64(inexact, 1));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_add_epi32(_mm256_castps_si256(t), down), last));
}

// Four values on AVX2.
template <class Arch>
__attribute__((always_inline)) inline __m128 merge_pair4_avx2(__m128 a, __m128 b, __m256d wa, __m256d wb, bool odd) {
  const __m256d x = _mm256_fmadd_pd(wb, _mm256_cvtps_pd(b), _mm256_add_pd(_mm256_setzero_pd(), _mm256_mul_pd(wa, _mm256_cvtps_pd(a))));
  const __m128 t = _mm256_cvtpd_ps(x);
  if (!odd) return t;
  const __m256d back = _mm256_cvtps_pd(t);
  const __m256i sel = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);  // each 64-bit lane's low half
  const __m128i inexact = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(_mm256_cmp_pd(back, x, _CMP_NEQ_UQ)), sel));
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m128i up = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(_mm256_cmp_pd(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, x), _CMP_GT_OQ)), sel));
  return _mm_castsi128_ps(_mm_or_si128(_mm_add_epi32(_mm_castps_si128(t), up), _mm_and_si128(inexact, _mm_set1_epi32(1))));
}

// y[i] = merge_pair_value<Arch>(a[i], b[i], wa, wb, odd), i < n; y may be a or b.
template <class Arch>
void merge_pair_rows(const float* a, const float* b, float* y, std::int64_t n, double wa, double wb, bool odd) {
  std::int64_t i = 0;
  if constexpr (kHasAvx512<Arch>) {
    const __m512d va = _mm512_set1_pd(wa), vb = _mm512_set1_pd(wb);
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(y + i, merge_pair8_avx512<Arch>(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), va, vb, odd));
    if (i < n) {  // the last n - i < 8: masked
      const auto m = static_cast<__mmask16>((1u << (n - i)) - 1u);
      const __m256 ta = _mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, a + i));
      const __m256 tb = _mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, b + i));
      _mm512_mask_storeu_ps(y + i, m, _mm512_castps256_ps512(merge_pair8_avx512<Arch>(ta, tb, va, vb, odd)));
    }
    return;
  } else if constexpr (kHasFma<Arch>) {
    const __m256d va = _mm256_set1_pd(wa), vb = _mm256_set1_pd(wb);
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, merge_pair4_avx2<Arch>(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i), va, vb, odd));
    if (i < n) {  // the last n - i < 4, through a padded buffer
      alignas(16) float ta[4] = {}, tb[4] = {}, ty[4];
      std::memcpy(ta, a + i, static_cast<std::size_t>(n - i) * sizeof(float));
      std::memcpy(tb, b + i, static_cast<std::size_t>(n - i) * sizeof(float));
      _mm_store_ps(ty, merge_pair4_avx2<Arch>(_mm_load_ps(ta), _mm_load_ps(tb), va, vb, odd));
      std::memcpy(y + i, ty, static_cast<std::size_t>(n - i) * sizeof(float));
    }
    return;
  }
  for (; i < n; ++i) y[i] = merge_pair_value<Arch>(a[i], b[i], wa, wb, odd);
}

}  // namespace simdattn::simd::impl
