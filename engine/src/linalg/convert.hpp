// Bulk conversions between the element types (core/element.hpp's, one rounding each): rows of
// f32 <-> bf16/f16 on the SIMD kernels, anything else element by element.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/element.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

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
