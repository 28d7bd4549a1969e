// Element types the engine computes on: each widens exactly to double, and a double narrows to
// it with one rounding (to nearest even; bf16/f16 directly, not through f32).
#pragma once

#include <cstdint>
#include <cstring>

#include "simdattn/half.hpp"
#include "simdattn/simd/kernels.hpp"
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

// n elements from src (dtype sd) to dst (dtype dd), each of f32, f64, bf16 or f16: copied when
// the dtypes match, else rounded once to nearest even (f32 <-> bf16/f16 on the SIMD kernels).
inline void convert_elements(const void* src, DType sd, void* dst, DType dd, std::int64_t n) {
  if (sd == dd) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(sd));
    return;
  }
  const simd::KernelTable& kt = simd::kernels();
  const bool src16 = sd == DType::bf16 || sd == DType::f16, dst16 = dd == DType::bf16 || dd == DType::f16;
  if (src16 && dd == DType::f32) {
    (sd == DType::bf16 ? kt.convert_bf16 : kt.convert_f16).widen(static_cast<const std::uint16_t*>(src),
                                                                static_cast<float*>(dst), n);
    return;
  }
  if (sd == DType::f32 && dst16) {
    (dd == DType::bf16 ? kt.convert_bf16 : kt.convert_f16).narrow(static_cast<const float*>(src),
                                                                 static_cast<std::uint16_t*>(dst), n);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store_at(dst, dd, i, widen_at(src, sd, i));
}

// Rows x cols elements of a strided matrix (dtype sd, row stride rs, element stride cs, in
// elements) to another (dtype dd, strides ld and dcs), converted as convert_elements does: a call
// per row when both rows are dense (one for the whole matrix when it is dense), else element by
// element.
inline void convert_matrix(const void* src, DType sd, std::int64_t rs, std::int64_t cs, std::int64_t rows,
                           std::int64_t cols, void* dst, DType dd, std::int64_t ld, std::int64_t dcs = 1) {
  if (rows <= 0 || cols <= 0) return;
  const auto ss = static_cast<std::int64_t>(dtype_size(sd)), ds = static_cast<std::int64_t>(dtype_size(dd));
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  if (cs == 1 && dcs == 1) {
    if (rs == cols && ld == cols) convert_elements(src, sd, dst, dd, rows * cols);
    else
      for (std::int64_t r = 0; r < rows; ++r) convert_elements(s + r * rs * ss, sd, d + r * ld * ds, dd, cols);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) store_at(dst, dd, r * ld + c * dcs, widen_at(src, sd, r * rs + c * cs));
}

}  // namespace simdattn::detail
