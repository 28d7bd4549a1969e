// 8-bit K/V codes (Quant8Kernels; the formats are simdattn/simd/code8.hpp's): rows quantized as
// tokens are appended, and read in place by the few-rows products (gemv_rows.hpp), each code
// widened to f32 in registers (a quarter of f32's bytes, which a step bound by reading K and V turns into
// time: guarded by attention/native/decode.int8 and .fp8_e4m3).
//
// Widening: int8 sign-extends and converts; E5M2 is the top byte of an IEEE f16, so code << 8
// goes through the f16 conversion (F16C / AVX-512), subnormals, inf and NaN included; E4M3's
// magnitude bits shifted by 7 are an f16 worth 2^-8 of the code's value (its subnormals land on
// f16 subnormals or normals, exactly), so the products carry a factor 256 (kFold) applied once
// per row, and 0x7F / 0xFF become an f16 NaN. SSE2 has no f16 conversion: code by code.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include <immintrin.h>

#include "impl/batch.hpp"
#include "simdattn/simd/code8.hpp"

namespace simdattn::simd::impl {

#if defined(__AVX512VL__) && defined(__AVX512BW__)
constexpr bool kHasAvx512Vl = true;
#else
constexpr bool kHasAvx512Vl = false;
#endif

// The factor by which load8's values fall short of the codes' (E4M3: 2^-8).
template <Code8 F> constexpr float kFold = F == Code8::e4m3 ? 256.0f : 1.0f;

// One code widened as load8 widens it (code8.hpp's value / kFold).
template <class Arch, Code8 F>
inline float widen8(std::uint8_t c) {
  return decode8<F, Arch>(c) / kFold<F>;
}

// The f16 bits of codes in 16-bit lanes, sign-extended from their byte (vpmovsxbw): E5M2 is the
// f16's top byte; E4M3's magnitude goes 7 bits up, its sign bit (copied into bit 15 by the
// extension) stays, bit 14 is cleared, and 0x7F / 0xFF become an f16 NaN.
template <Code8 F, class V>
__attribute__((always_inline)) inline V f16_of_codes(V h) {
  if constexpr (sizeof(V) == 32) {
    if constexpr (F == Code8::e5m2) return _mm256_slli_epi16(h, 8);
    const V bits = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<short>(0xbf80)));
    if constexpr (kHasAvx512Vl) {
      const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(bits, _mm256_set1_epi16(0x3f80)), _mm256_set1_epi16(0x3f80));
      return _mm256_mask_or_epi16(bits, nan, bits, _mm256_set1_epi16(0x7c00));
    } else {
      const V mag = _mm256_and_si256(bits, _mm256_set1_epi16(0x3f80));
      return _mm256_or_si256(bits, _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3f80)), _mm256_set1_epi16(0x7c00)));
    }
  } else {
    if constexpr (F == Code8::e5m2) return _mm_slli_epi16(h, 8);
    const V bits = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(static_cast<short>(0xbf80)));
    const V mag = _mm_and_si128(bits, _mm_set1_epi16(0x3f80));
    return _mm_or_si128(bits, _mm_and_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3f80)), _mm_set1_epi16(0x7c00)));
  }
}

// W consecutive codes at p, widened to an f32 batch (each code's value / kFold).
template <class Arch, Code8 F>
__attribute__((always_inline)) inline batch<float, Arch> load8(const std::uint8_t* p) {
  using B = batch<float, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (F == Code8::int8) return B(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)));
    else return B(_mm512_cvtph_ps(f16_of_codes<F>(_mm256_cvtepi8_epi16(v))));
  } else if constexpr (B::size == 8) {  // AVX2 (with F16C)
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if constexpr (F == Code8::int8) return B(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
    else return B(_mm256_cvtph_ps(f16_of_codes<F>(_mm_cvtepi8_epi16(v))));
  } else {
    alignas(16) float f[4];
    for (int i = 0; i < 4; ++i) f[i] = widen8<Arch, F>(p[i]);
    return B::load_aligned(f);
  }
}

// 2W consecutive codes at p, widened to two f32 batches (lo: the first W). On AVX-512 the
// integer steps run once on 32 16-bit lanes (vpmovsxbw zmm and a mask register for E4M3's NaN).
template <class Arch, Code8 F>
__attribute__((always_inline)) inline void load8x2(const std::uint8_t* p, batch<float, Arch>& lo, batch<float, Arch>& hi) {
  using B = batch<float, Arch>;
  if constexpr (kHasAvx512<Arch> && F != Code8::int8) {
    const __m512i h = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512i bits;
    if constexpr (F == Code8::e5m2) {
      bits = _mm512_slli_epi16(h, 8);
    } else {
      bits = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16(static_cast<short>(0xbf80)));
      const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(bits, _mm512_set1_epi16(0x3f80)), _mm512_set1_epi16(0x3f80));
      bits = _mm512_mask_mov_epi16(bits, nan, _mm512_or_si512(bits, _mm512_set1_epi16(0x7c00)));
    }
    lo = B(_mm512_cvtph_ps(_mm512_castsi512_si256(bits)));
    hi = B(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1)));
  } else {
    lo = load8<Arch, F>(p);
    hi = load8<Arch, F>(p + B::size);
  }
}

// The codes of W finite quotients y (code8.hpp's encode8), in 32-bit lanes.
template <class Arch, Code8 F>
__attribute__((always_inline)) inline batch<std::int32_t, Arch> encode8_lanes(const batch<float, Arch>& y) {
  using I = batch<std::int32_t, Arch>;
  using Fb = batch<float, Arch>;
  if constexpr (F == Code8::int8) {
    return xsimd::max(xsimd::min(xsimd::nearbyint_as_int(y), I(127)), I(-127));
  } else {
    constexpr int kMant = F == Code8::e4m3 ? 3 : 2, kDrop = 23 - kMant;
    constexpr std::int32_t kRebias = F == Code8::e4m3 ? 120 : 112, kMaxCode = F == Code8::e4m3 ? 0x7e : 0x7b;
    constexpr float kMinNormal = F == Code8::e4m3 ? 0x1p-6f : 0x1p-14f, kSubScale = F == Code8::e4m3 ? 0x1p9f : 0x1p16f;
    const Fb a = xsimd::min(xsimd::abs(y), Fb(code8_max(F)));
    const I u = xsimd::bitwise_cast<I>(a);
    const I normal = ((u + I((1 << (kDrop - 1)) - 1) + ((u >> kDrop) & I(1))) >> kDrop) - I(kRebias << kMant);
    const I sub = xsimd::nearbyint_as_int(a * Fb(kSubScale));
    const I code = xsimd::min(xsimd::select(xsimd::bool_cast(a < Fb(kMinNormal)), sub, normal), I(kMaxCode));
    return code | ((xsimd::bitwise_cast<I>(y) >> 24) & I(0x80));
  }
}

// While alive, the calling thread's MXCSR has flush-to-zero and denormals-are-zero off and
// rounds to nearest: the formats are defined on IEEE arithmetic, whatever the caller set.
class IeeeArithmetic {
 public:
  IeeeArithmetic() : saved_(_mm_getcsr()) {
    if ((saved_ & kChanged) != 0) _mm_setcsr(saved_ & ~kChanged);
  }
  ~IeeeArithmetic() {
    if ((saved_ & kChanged) != 0) _mm_setcsr(saved_);
  }
  IeeeArithmetic(const IeeeArithmetic&) = delete;
  IeeeArithmetic& operator=(const IeeeArithmetic&) = delete;

 private:
  static constexpr unsigned kChanged = 0x8000u | 0x0040u | 0x6000u;  // FTZ, DAZ, the rounding control
  unsigned saved_;
};

// rows rows of n f32 values (ldx apart) to codes (ldc bytes apart) and one scale each (scale
// + r * scale_stride). Returns the first row holding a NaN or an infinity, or -1; that row's and
// the later rows' codes and scales are left unwritten.
template <class Arch, Code8 F>
std::int64_t quantize8_rows(const float* x, std::int64_t rows, std::int64_t n, std::int64_t ldx, std::uint8_t* codes,
                            std::int64_t ldc, float* scale, std::int64_t scale_stride) {
  using Fb = batch<float, Arch>;
  using I = batch<std::int32_t, Arch>;
  constexpr std::int64_t W = Fb::size;
  const IeeeArithmetic ieee;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    std::uint8_t* cr = codes + r * ldc;
    Fb m(0.0f);
    auto bad = xsimd::batch_bool<float, Arch>(false);
    std::int64_t i = 0;
    for (; i + W <= n; i += W) {
      const Fb v = xsimd::abs(Fb::load_unaligned(xr + i));
      bad = bad || !(v <= Fb(std::numeric_limits<float>::max()));  // NaN or inf
      m = xsimd::max(m, v);
    }
    float mx = hmax<Arch, float>(m);
    bool finite = !xsimd::any(bad);
    for (; i < n; ++i) {
      const float v = std::fabs(xr[i]);
      finite = finite && v <= std::numeric_limits<float>::max();
      mx = v > mx ? v : mx;
    }
    if (!finite) return r;
    const float s = mx / code8_max(F);
    scale[r * scale_stride] = s;
    if (s == 0.0f) {
      std::memset(cr, 0, static_cast<std::size_t>(n));
      continue;
    }
    const Fb sv(s);
    i = 0;
    for (; i + W <= n; i += W) {
      const I c = encode8_lanes<Arch, F>(Fb::load_unaligned(xr + i) / sv);
      if constexpr (kHasAvx512<Arch>) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(cr + i), _mm512_cvtepi32_epi8(c));
      } else {
        alignas(64) std::int32_t lanes[W];
        c.store_aligned(lanes);
        for (std::int64_t l = 0; l < W; ++l) cr[i + l] = static_cast<std::uint8_t>(lanes[l]);
      }
    }
    for (; i < n; ++i) cr[i] = encode8<F, Arch>(xr[i] / s);
  }
  return -1;
}

// dst[i] = decode(codes[i]) * scale, rounded to f32, for i < n.
template <class Arch, Code8 F>
void dequantize8_row(const std::uint8_t* codes, std::int64_t n, float scale, float* dst) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) {
    B v = load8<Arch, F>(codes + i);
    if constexpr (kFold<F> != 1.0f) v *= B(kFold<F>);  // exact: a power of two on a value of at most 448
    (v * B(scale)).store_unaligned(dst + i);
  }
  for (; i < n; ++i) dst[i] = decode8<F, Arch>(codes[i]) * scale;
}

}  // namespace simdattn::simd::impl
