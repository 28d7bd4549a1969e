// Non-owning strided 4-D tensor views.
//
// A view is a pointer, a dtype, four sizes and four *element* strides (not bytes). Any layout
// strides can express works without a copy: [B,H,S,D] contiguous, [B,S,H,D] (heads interleaved),
// a slice of a packed QKV projection, or a broadcast (stride 0) input. Strides must be >= 0.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "simdattn/half.hpp"

namespace simdattn {

enum class DType : std::uint8_t {
  f32,  // float
  f64,  // double
  u8,   // bool / uint8 (masks: nonzero = attend)
  i32,
  i64,
  bf16,  // simdattn::bfloat16 (half.hpp)
  f16,   // simdattn::float16, IEEE binary16
  // 8-bit K/V codes, each row with an f32 scale (attention.hpp, "8-bit K and V"):
  int8,      // int8_t: round(x / s), s = max|x| / 127
  fp8_e4m3,  // uint8_t holding OCP E4M3FN (bias 7, max 448, no infinities), s = max|x| / 448
  fp8_e5m2,  // uint8_t holding OCP E5M2 (bias 15, max 57344), s = max|x| / 57344
};

// Whether a dtype is one of the 8-bit K/V codes.
constexpr bool is_kv_code(DType t) noexcept {
  return t == DType::int8 || t == DType::fp8_e4m3 || t == DType::fp8_e5m2;
}

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::int8:
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::int8: return "int8";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
  }
  return "?";
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::u8; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<float16>() { return DType::f16; }
template <> constexpr DType dtype_of<std::int8_t>() { return DType::int8; }

using Shape4 = std::array<std::int64_t, 4>;

// Row-major (C order) element strides of a shape.
constexpr Shape4 contiguous_strides(const Shape4& shape) noexcept {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
}

// A view: `Pointer` is const void* for inputs (ConstTensorView) and void* for outputs
// (TensorView); a TensorView converts to a ConstTensorView, not the other way.
template <class Pointer>
struct BasicTensorView {
  Pointer data = nullptr;
  DType dtype = DType::f32;
  Shape4 shape{0, 0, 0, 0};
  Shape4 strides{0, 0, 0, 0};

  constexpr BasicTensorView() = default;
  BasicTensorView(Pointer d, DType t, const Shape4& s, const Shape4& st)
      : data(d), dtype(t), shape(s), strides(st) {}
  BasicTensorView(Pointer d, DType t, const Shape4& s) : BasicTensorView(d, t, s, contiguous_strides(s)) {}

  // Typed pointers give the dtype: float -> f32, double -> f64, uint8_t/bool -> u8, ...
  template <class T>
    requires std::is_convertible_v<T*, Pointer>
  BasicTensorView(T* d, const Shape4& s) : BasicTensorView(d, dtype_of<std::remove_const_t<T>>(), s) {}
  template <class T>
    requires std::is_convertible_v<T*, Pointer>
  BasicTensorView(T* d, const Shape4& s, const Shape4& st)
      : BasicTensorView(d, dtype_of<std::remove_const_t<T>>(), s, st) {}

  template <class P>
    requires(!std::is_same_v<P, Pointer> && std::is_convertible_v<P, Pointer>)
  BasicTensorView(const BasicTensorView<P>& o)  // NOLINT: TensorView -> ConstTensorView, implicit
      : data(o.data), dtype(o.dtype), shape(o.shape), strides(o.strides) {}

  bool empty() const noexcept { return data == nullptr; }
};
using ConstTensorView = BasicTensorView<const void*>;
using TensorView = BasicTensorView<void*>;

}  // namespace simdattn
