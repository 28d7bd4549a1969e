// Element types the engine computes on: each widens exactly to double, and a double narrows to
// it with one rounding (to nearest even; bf16/f16 directly, not through f32).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "simdattn/error.hpp"
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

// fn(T{}) for the element type T of dtype, f32, f64, bf16 or f16: the one switch from a dtype to
// its type. Any other dtype: fn(float{}) (for callers that validated it).
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(bfloat16{});
    case DType::f16: return fn(float16{});
    default: return fn(float{});
  }
}

// The same for a dtype not yet validated: another than those four is Error(argument).
template <class Fn>
decltype(auto) visit_float_dtype(DType dtype, const char* argument, Fn&& fn) {
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error(argument, "expected f32, f64, bf16 or f16, got " + std::string(dtype_name(dtype)));
  return visit_dtype(dtype, std::forward<Fn>(fn));
}

// The type attention computes in for elements of S: double for f64, else float (bf16 and f16
// widened).
template <class S>
using compute_type = std::conditional_t<std::is_same_v<S, double>, double, float>;

// Element `off` of an array of dtype f32, f64, bf16 or f16 (an additive mask), widened exactly.
inline double widen_at(const void* data, DType dtype, std::int64_t off) noexcept {
  return visit_dtype(dtype, [&](auto t) { return widen(static_cast<const decltype(t)*>(data)[off]); });
}

// Stores d, narrowed to dtype (rounded once), as element `off` of an array of that dtype.
inline void store_at(void* data, DType dtype, std::int64_t off, double d) noexcept {
  visit_dtype(dtype, [&](auto t) { static_cast<decltype(t)*>(data)[off] = narrow<decltype(t)>(d); });
}

}  // namespace simdattn::detail
