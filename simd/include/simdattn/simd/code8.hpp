// The 8-bit KV-cache formats, one value at a time: the scalar definition that the vector
// kernels (src/impl/convert/quant8.hpp) and the engine's reference paths both follow bit for bit.
//
// One scale s per row (the D values of one kv head of one token), in f32:
//   int8      s = max|x| / 127;   code = clamp(round_half_even(x / s), -127, 127), two's complement
//   fp8_e4m3  s = max|x| / 448;   code = x / s rounded to nearest even in OCP E4M3FN (bias 7, no
//             infinities, max finite 448, NaN 0x7F / 0xFF), saturating at +-448
//   fp8_e5m2  s = max|x| / 57344; code = x / s rounded to nearest even in OCP E5M2 (bias 15,
//             IEEE-like, max finite 57344), saturating at +-57344 (never inf)
// Every division is one f32 division, rounded to nearest (max|x| / 127 and x / s); the rounding
// to the code is from that f32 quotient. A row of zeros (or any row whose s is 0) has s = 0 and
// codes 0. fp8 codes keep the quotient's sign, also at zero (-0.0 / s is 0x80). The value a code
// stands for is decode(code) * s, rounded to f32. Rows with NaN or inf are not quantized (the
// callers refuse them).
//
// Functions are templates on a tag (default void) so that each ISA's build instantiates its own
// copy, as the kernels in src/impl/ are (an inline function compiled with AVX-512 flags could be
// the one the linker keeps for every caller).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace simdattn::simd {

enum class Code8 : std::uint8_t { int8, e4m3, e5m2 };

// The largest code magnitude: s = max|x| / code8_max.
constexpr float code8_max(Code8 f) { return f == Code8::int8 ? 127.0f : f == Code8::e4m3 ? 448.0f : 57344.0f; }

namespace code8_detail {
template <class Tag>
inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
template <class Tag>
inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace code8_detail

// The value of one code (exact in f32; E4M3's 0x7F / 0xFF are NaN, E5M2's exponent 31 inf / NaN).
template <Code8 F, class Tag = void>
inline float decode8(std::uint8_t c) {
  if constexpr (F == Code8::int8) {
    return static_cast<float>(static_cast<std::int8_t>(c));
  } else if constexpr (F == Code8::e4m3) {
    const std::uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
    float v;
    if (e == 0xf && m == 7) v = std::numeric_limits<float>::quiet_NaN();
    else if (e == 0) v = static_cast<float>(m) * 0x1p-9f;
    else v = std::ldexp(static_cast<float>(8 + m), static_cast<int>(e) - 10);
    return (c & 0x80u) ? -v : v;
  } else {
    const std::uint32_t e = (c >> 2) & 0x1fu, m = c & 3u;
    float v;
    if (e == 0x1f) v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    else if (e == 0) v = static_cast<float>(m) * 0x1p-16f;
    else v = std::ldexp(static_cast<float>(4 + m), static_cast<int>(e) - 17);
    return (c & 0x80u) ? -v : v;
  }
}

// The code of a finite quotient y = x / s: rounded to nearest even, saturating.
template <Code8 F, class Tag = void>
inline std::uint8_t encode8(float y) {
  if constexpr (F == Code8::int8) {
    const float r = std::nearbyint(y);  // the default rounding: to nearest, ties to even
    return static_cast<std::uint8_t>(static_cast<std::int8_t>(r > 127.0f ? 127 : r < -127.0f ? -127 : static_cast<int>(r)));
  } else {
    // E4M3: 3 mantissa bits, normals from 2^-6 (exponent field - 120 of f32's), subnormals in
    // steps of 2^-9. E5M2: 2 bits, normals from 2^-14 (field - 112), steps of 2^-16.
    constexpr int kMant = F == Code8::e4m3 ? 3 : 2;
    constexpr std::uint32_t kRebias = F == Code8::e4m3 ? 120u : 112u;
    constexpr float kMinNormal = F == Code8::e4m3 ? 0x1p-6f : 0x1p-14f, kSubScale = F == Code8::e4m3 ? 0x1p9f : 0x1p16f;
    constexpr std::uint8_t kMaxCode = F == Code8::e4m3 ? 0x7e : 0x7b;
    const std::uint32_t sign = (code8_detail::bits<Tag>(y) >> 24) & 0x80u;
    const float a = std::fabs(y);
    std::uint32_t code;
    if (a >= code8_max(F)) {
      code = kMaxCode;
    } else if (a < kMinNormal) {
      code = static_cast<std::uint32_t>(std::nearbyint(a * kSubScale));  // exact product; 2^mant = the smallest normal
    } else {
      constexpr int kDrop = 23 - kMant;
      const std::uint32_t u = code8_detail::bits<Tag>(a);
      const std::uint32_t r = (u + ((1u << (kDrop - 1)) - 1u) + ((u >> kDrop) & 1u)) >> kDrop;  // may carry into the exponent
      code = r - (kRebias << kMant);
      if (code > kMaxCode) code = kMaxCode;  // a < max rounds to at most max; kept for safety
    }
    return static_cast<std::uint8_t>(sign | code);
  }
}

}  // namespace simdattn::simd
