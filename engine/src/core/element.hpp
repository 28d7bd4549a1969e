// Element types the engine computes on: each widens exactly to double, and a double narrows to
// it with one rounding (to nearest even; bf16/f16 directly, not through f32).
#pragma once

#include <cstdint>

#include "simdattn/half.hpp"
#include "simdattn/simd/code8.hpp"
#include "simdattn/tensor.hpp"

namespace simdattn::detail {

inline double widen(float x) noexcept { return x; }
inline double widen(double x) noexcept { return x; }
inline double widen(bfloat16 x) noexcept { return to_float(x); }
inline double widen(float16 x) noexcept { return to_float(x); }

template <class T>
T narrow(double d) noexcept;
template <>
inline float narrow<float>(double d) noexcept { return static_cast<float>(d); }
template <>
inline double narrow<double>(double d) noexcept { return d; }
template <>
inline bfloat16 narrow<bfloat16>(double d) noexcept { return to_bfloat16(d); }
template <>
inline float16 narrow<float16>(double d) noexcept { return to_float16(d); }

// The value of one 8-bit K/V code (simdattn/simd/code8.hpp's formats; exact in f32).
inline float code8_value(DType code, std::uint8_t c) noexcept {
  switch (code) {
    case DType::int8: return simd::decode8<simd::Code8::int8>(c);
    case DType::fp8_e4m3: return simd::decode8<simd::Code8::e4m3>(c);
    default: return simd::decode8<simd::Code8::e5m2>(c);
  }
}

// The simd layer's name of an 8-bit code dtype.
inline simd::Code8 code8_of(DType code) noexcept {
  return code == DType::int8 ? simd::Code8::int8 : code == DType::fp8_e4m3 ? simd::Code8::e4m3 : simd::Code8::e5m2;
}

// Element `off` of an array of dtype f32, f64, bf16 or f16 (an additive mask), widened exactly.
inline double widen_at(const void* data, DType dtype, std::int64_t off) noexcept {
  switch (dtype) {
    case DType::f64: return static_cast<const double*>(data)[off];
    case DType::bf16: return widen(static_cast<const bfloat16*>(data)[off]);
    case DType::f16: return widen(static_cast<const float16*>(data)[off]);
    default: return static_cast<const float*>(data)[off];
  }
}

// Stores d, narrowed to dtype (rounded once), as element `off` of an array of that dtype.
inline void store_at(void* data, DType dtype, std::int64_t off, double d) noexcept {
  switch (dtype) {
    case DType::f64: static_cast<double*>(data)[off] = d; break;
    case DType::bf16: static_cast<bfloat16*>(data)[off] = narrow<bfloat16>(d); break;
    case DType::f16: static_cast<float16*>(data)[off] = narrow<float16>(d); break;
    default: static_cast<float*>(data)[off] = static_cast<float>(d);
  }
}

}  // namespace simdattn::detail
