// Element types the engine computes on: each widens exactly to double, and a double narrows to
// it with one rounding (to nearest even; bf16/f16 directly, not through f32).
#pragma once

#include "simdattn/half.hpp"

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

}  // namespace simdattn::detail
