// 16-bit floats (bf16 or f16 bits) widened to f32, exactly: one (widen16) or a batch's worth
// (load16), as the 16-bit GEMM, the few-rows products and the row conversions read them.
#pragma once

#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

// One 16-bit float widened to f32 (exact). A template on Arch like everything in impl/ (half.hpp's
// inline conversions are not: compiled here, an AVX-512 body could be the one the linker keeps).
template <class Arch, bool kBf16>
inline float widen16(std::uint16_t h) {
  std::uint32_t u = std::uint32_t{h} << 16;
  if constexpr (!kBf16) {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
      const float v = static_cast<float>(mant) * 0x1p-24f;
      return sign ? -v : v;
    }
    u = sign | (exp == 0x1f ? 0x7f800000u | (mant << 13) : ((exp + 112u) << 23) | (mant << 13));
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// W consecutive 16-bit floats at p, widened to an f32 batch.
template <class Arch, bool kBf16>
__attribute__((always_inline)) inline batch<float, Arch> load16(const std::uint16_t* p) {
  using B = batch<float, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kBf16) return B(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    else return B(_mm512_cvtph_ps(v));
  } else if constexpr (B::size == 8) {  // AVX2 (with F16C)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kBf16) return B(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    else return B(_mm256_cvtph_ps(v));
  } else if constexpr (kBf16) {  // SSE2: a bf16 is the high half of its f32
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return B(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), v)));
  } else {  // SSE2 has no f16 conversion
    alignas(16) float f[4];
    for (int i = 0; i < 4; ++i) f[i] = widen16<Arch, false>(p[i]);
    return B::load_aligned(f);
  }
}

}  // namespace simdattn::simd::impl
