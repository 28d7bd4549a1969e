// Rows of 16-bit floats widened to f32 and f32 rounded to them (Convert16Kernels): the native
// backend's copies of bf16/f16 operands and the 16-bit GEMM's packing run on these, not on a
// scalar loop through double (3x the f32 time of bert's attention; guarded by
// attention/native/bert.bf16 and .f16). Bit for bit what simdattn/half.hpp's scalar conversions
// give: exact widening (but F16C's, like every hardware conversion, quiets a signalling f16 NaN);
// rounding to nearest even, overflow to Inf (f16), NaN kept quiet.
#pragma once

#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "impl/batch.hpp"
#include "impl/convert/widen16.hpp"
#include "impl/products/pack.hpp"

namespace simdattn::simd::impl {

// f32 to bf16 or f16 (nearest even), one value: half.hpp's rules, compiled per ISA.
template <class Arch, bool kBf16>
inline std::uint16_t narrow16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if constexpr (kBf16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  } else {
    const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (a < 0x38800000u) {
      float scaled;
      std::memcpy(&scaled, &a, sizeof scaled);
      scaled *= 0x1p24f;
      // round half to even of a value below 2^10 (exact: the f32 has more bits than it needs)
      const float r = (scaled + 0x1p23f) - 0x1p23f;
      return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r));
    }
    std::uint32_t h = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
    const std::uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
}

template <class Arch, bool kBf16>
void widen16_row(const std::uint16_t* src, float* dst, std::int64_t n) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  std::int64_t i = 0;
  if constexpr (kBf16 || B::size > 4)  // SSE2 has no f16 conversion
    for (; i + W <= n; i += W) load16<Arch, kBf16>(src + i).store_unaligned(dst + i);
  if constexpr (kHasAvx512<Arch>) {
    // the last n - i < 16 values: masked load and store (rows of 40 or 72 are common head sizes)
    if (i < n) {
      const auto m = static_cast<__mmask16>((1u << (n - i)) - 1u);
      const __m256i v = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, src + i));
      const __m512 x = kBf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)) : _mm512_cvtph_ps(v);
      _mm512_mask_storeu_ps(dst + i, m, x);
    }
    return;
  }
  for (; i < n; ++i) dst[i] = widen16<Arch, kBf16>(src[i]);
}

// The f16 bits of NaN f32 lanes u: sign | 0x7e00 | the top 10 payload bits (half.hpp's rule).
template <class V>
__attribute__((always_inline)) inline V f16_nan_bits(V u) {
  if constexpr (sizeof(V) == 64)
    return _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                                           _mm512_set1_epi32(0x7e00)),
                           _mm512_and_si512(_mm512_srli_epi32(u, 13), _mm512_set1_epi32(0x3ff)));
  else
    return _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                                           _mm256_set1_epi32(0x7e00)),
                           _mm256_and_si256(_mm256_srli_epi32(u, 13), _mm256_set1_epi32(0x3ff)));
}

// The bf16 bits of each f32 value, in the low 16 bits of its 32-bit lane: rounded to nearest even
// (the bits below the top 16 plus 0x7fff plus the lowest kept bit, carried up), a NaN kept quiet
// with its sign and top payload bits (as half.hpp's narrowing).
template <class Arch>
batch<std::uint32_t, Arch> bf16_bits(const batch<float, Arch>& x) {
  using U = batch<std::uint32_t, Arch>;
  using F = batch<float, Arch>;
  const U u = xsimd::bitwise_cast<U>(x);
  const U r = (u + U(0x7fff) + ((u >> 16) & U(1))) >> 16;
  const U q = (u >> 16) | U(0x40);
  return xsimd::bitwise_cast<U>(xsimd::select(xsimd::isnan(x), xsimd::bitwise_cast<F>(q), xsimd::bitwise_cast<F>(r)));
}

template <class Arch, bool kBf16>
void narrow16_row(const float* src, std::uint16_t* dst, std::int64_t n) {
  std::int64_t i = 0;
  if constexpr (kHasAvx512<Arch>) {
    // 16 values a step; the last n % 16 with a masked load and store (m)
    for (; i < n; i += 16) {
      const bool full = n - i >= 16;
      const auto m = static_cast<__mmask16>(full ? 0xffffu : (1u << (n - i)) - 1u);
      const __m512 x = full ? _mm512_loadu_ps(src + i) : _mm512_maskz_loadu_ps(m, src + i);
      __m256i h;
      if constexpr (kBf16) {
        h = _mm512_cvtepi32_epi16(bf16_bits<Arch>(batch<float, Arch>(x)));
      } else {
        // vcvtps2ph rounds as half.hpp does; a NaN's payload is half.hpp's (sign, quiet bit, the
        // top 10 bits of the f32 payload) rather than the instruction's.
        h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        if (nan != 0)  // blended as 32-bit lanes (a 16-bit blend of 256 bits needs AVX512VL)
          h = _mm512_cvtepi32_epi16(
              _mm512_mask_blend_epi32(nan, _mm512_cvtepu16_epi32(h), f16_nan_bits(_mm512_castps_si512(x))));
      }
      if (full) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
      else _mm512_mask_storeu_epi16(dst + i, m, _mm512_castsi256_si512(h));
    }
    return;
  } else if constexpr (batch<float, Arch>::size == 8) {  // AVX2 (with F16C)
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(src + i);
      __m128i h;
      if constexpr (kBf16) {
        const __m256i v = bf16_bits<Arch>(batch<float, Arch>(x));  // each 32-bit value < 2^16
        h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      } else {
        h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        if (!_mm256_testz_si256(nan, nan)) {  // NaN payloads as half.hpp's (see the AVX-512 branch)
          const __m256i q = f16_nan_bits(_mm256_castps_si256(x));
          const __m128i q16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
          const __m128i m16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
          h = _mm_blendv_epi8(h, q16, m16);
        }
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
  }
  for (; i < n; ++i) dst[i] = narrow16<Arch, kBf16>(src[i]);
}

// Rows of f32 values into the pair layout (Convert16Kernels::narrow_pairs): word c of pair row s
// holds row 2s's value in its low half and row 2s + 1's in its high half, each rounded as
// narrow16_row; an odd last row pairs with zero. bf16: a vector of words at a time (bf16_bits
// of both rows, one shifted up); f16 value by value.
template <class Arch, bool kBf16>
void narrow16_pairs(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, std::uint32_t* dst,
                    std::int64_t dst_ld) {
  using U = batch<std::uint32_t, Arch>;
  constexpr std::int64_t W = static_cast<std::int64_t>(U::size);
  for (std::int64_t s = 0; 2 * s < rows; ++s) {
    const float* r0 = src + 2 * s * ld;
    const float* r1 = 2 * s + 1 < rows ? r0 + ld : nullptr;
    std::uint32_t* d = dst + s * dst_ld;
    std::int64_t c = 0;
    if constexpr (kBf16) {
      for (; c + W <= cols; c += W) {
        U w = bf16_bits<Arch>(batch<float, Arch>::load_unaligned(r0 + c));
        if (r1 != nullptr) w = w | (bf16_bits<Arch>(batch<float, Arch>::load_unaligned(r1 + c)) << 16);
        w.store_unaligned(d + c);
      }
    }
    for (; c < cols; ++c)
      d[c] = std::uint32_t{narrow16<Arch, kBf16>(r0[c])} |
             (r1 != nullptr ? std::uint32_t{narrow16<Arch, kBf16>(r1[c])} << 16 : 0u);
  }
}

// pack_transpose (pack.hpp) from 16-bit rows: dst[c * dst_ld + r] = src[r * ld + c] widened, rows
// past `rows` up to `width` zero. AVX-512: each 16 x 16 block's rows widened as they are loaded,
// then the f32 register transpose (one pass over a bf16 K panel instead of widening it to a copy
// first: attention/native/bert.bf16).
template <class Arch, bool kBf16>
void pack_transpose16(const std::uint16_t* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* dst,
                         std::int64_t dst_ld, std::int64_t width) {
#if defined(__AVX512F__)
  if constexpr (kHasAvx512<Arch>) {
    pack_transpose_blocks(
        [&](std::int64_t r, std::int64_t c0, std::int64_t ncol) {
          const auto cm = static_cast<__mmask32>(ncol == 16 ? 0xffffu : (1u << ncol) - 1u);
          const __m256i h = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(cm, src + r * ld + c0));
          return kBf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
        },
        rows, cols, dst, dst_ld, width);
    return;
  }
#endif
  for (std::int64_t c = 0; c < cols; ++c) {
    float* d = dst + c * dst_ld;
    for (std::int64_t r = 0; r < rows; ++r) d[r] = widen16<Arch, kBf16>(src[r * ld + c]);
    for (std::int64_t r = rows; r < width; ++r) d[r] = 0.0f;
  }
}

}  // namespace simdattn::simd::impl
