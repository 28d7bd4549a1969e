// 16-bit floating-point storage types and their conversions.
//
//   bfloat16  1 sign, 8 exponent, 7 mantissa bits: f32's range, 8 bits of precision
//   float16   IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits, largest finite 65504
//
// Conversions to them round to nearest, ties to even, from f32 or from f64 (directly: no double
// rounding through f32); a value beyond the format's range becomes +-Inf, NaN stays NaN (quiet,
// sign kept). Conversions from them are exact.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace simdattn {

struct bfloat16 {
  std::uint16_t bits = 0;
};
struct float16 {
  std::uint16_t bits = 0;
};

namespace detail {

inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// d rounded to f32 with "round to odd": truncated toward zero, the last bit set when inexact.
// Rounding that to fewer bits (bf16, f16) to nearest-even gives d's own nearest-even rounding.
// (No branch and no library call, so loops over it vectorize: an inexact t steps one ulp toward
// zero by its bits where it rounded the magnitude up, then sets its last bit; a NaN keeps NaN.)
inline float round_to_odd(double d) noexcept {
  const float t = static_cast<float>(d);
  const double back = static_cast<double>(t);
  const auto inexact = static_cast<std::uint32_t>(back != d);
  const auto up = static_cast<std::uint32_t>(std::fabs(back) > std::fabs(d));
  return bits_float((float_bits(t) - up) | inexact);
}

}  // namespace detail

inline float to_float(bfloat16 h) noexcept { return detail::bits_float(std::uint32_t{h.bits} << 16); }

inline bfloat16 to_bfloat16(float f) noexcept {
  const std::uint32_t u = detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even
  return {static_cast<std::uint16_t>(rounded >> 16)};
}

inline float to_float(float16 h) noexcept {
  const std::uint32_t sign = std::uint32_t{h.bits & 0x8000u} << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return detail::bits_float(sign | 0x7f800000u | (mant << 13));  // Inf, NaN
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline float16 to_float16(float f) noexcept {
  const std::uint32_t u = detail::float_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // quiet NaN
  if (a >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520: Inf (and Inf)
  if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero) of f16, round(|f| * 2^24)
    const float scaled = detail::bits_float(a) * 0x1p24f;  // exact: a power-of-two scaling
    return {static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)))};
  }
  std::uint32_t h = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
  const std::uint32_t rest = a & 0x1fffu;  // the 13 bits dropped
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // to nearest, ties to even (may carry)
  return {static_cast<std::uint16_t>(sign | h)};
}

inline bfloat16 to_bfloat16(double d) noexcept { return to_bfloat16(detail::round_to_odd(d)); }
inline float16 to_float16(double d) noexcept { return to_float16(detail::round_to_odd(d)); }

}  // namespace simdattn
