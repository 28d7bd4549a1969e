// quantize_kv and dequantize_kv (simdattn/attention.hpp) and the caches' row quantizer.
#include "linalg/code8.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "linalg/convert.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

std::int64_t quantize_rows(DType code, const float* x, std::int64_t rows, std::int64_t n, std::int64_t ldx,
                           std::uint8_t* codes, std::int64_t ldc, float* scale, std::int64_t scale_stride) {
  return simd::kernels().code8(code8_of(code)).quantize(x, rows, n, ldx, codes, ldc, scale, scale_stride);
}

bool quantize_row(DType code, const void* x, DType t, std::int64_t n, float* tmp, std::uint8_t* codes, float* scale) {
  convert_elements(x, t, tmp, DType::f32, n);
  return quantize_rows(code, tmp, 1, n, n, codes, n, scale, 1) < 0;
}

std::int64_t first_nonfinite_row(const void* x, DType t, std::int64_t rows, std::int64_t n, std::int64_t ldx,
                                 std::int64_t cs) {
  for (std::int64_t r = 0; r < rows; ++r) {
    bool finite = true;
    if (t == DType::f32 && cs == 1) {
      const float* row = static_cast<const float*>(x) + r * ldx;
      float acc = 0.0f;  // x * 0 is NaN exactly for NaN and infinities: one branch-free pass
      for (std::int64_t i = 0; i < n; ++i) acc += row[i] * 0.0f;
      finite = acc == 0.0f;
    } else {
      for (std::int64_t i = 0; i < n && finite; ++i) finite = std::isfinite(widen_at(x, t, r * ldx + i * cs));
    }
    if (!finite) return r;
  }
  return -1;
}

namespace {

void check_code(DType code, const char* name) {
  if (!is_kv_code(code))
    throw Error(name, "expected an 8-bit K/V code dtype (int8, fp8_e4m3 or fp8_e5m2), got " +
                          std::string(dtype_name(code)));
}

void check_float_dtype(DType t, const char* name) {
  if (t != DType::f32 && t != DType::f64 && t != DType::bf16 && t != DType::f16)
    throw Error(name, "dtype must be f32, f64, bf16 or f16, got " + std::string(dtype_name(t)));
}

Shape4 scale_shape(const Shape4& s) { return {s[0], s[1], s[2], 1}; }

// Every element offset of a view's rows: calls f(row index r, element offset of the row's first element).
template <class F>
void for_rows(const Shape4& shape, const Shape4& st, F f) {
  std::int64_t r = 0;
  for (std::int64_t a = 0; a < shape[0]; ++a)
    for (std::int64_t b = 0; b < shape[1]; ++b)
      for (std::int64_t c = 0; c < shape[2]; ++c, ++r) f(r, a * st[0] + b * st[1] + c * st[2]);
}

std::string row_name(const Shape4& shape, std::int64_t r) {
  const std::int64_t c = r % shape[2], b = (r / shape[2]) % shape[1], a = r / (shape[2] * shape[1]);
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + "]";
}

}  // namespace
}  // namespace simdattn::detail

namespace simdattn {

void quantize_kv(const ConstTensorView& x, DType code, const TensorView& codes, const TensorView& scales) {
  using namespace detail;
  check_isa();
  check_code(code, "code");
  check_float_dtype(x.dtype, "x");
  if (codes.dtype != code)
    throw Error("codes", "expected dtype " + std::string(dtype_name(code)) + ", got " + std::string(dtype_name(codes.dtype)));
  if (scales.dtype != DType::f32) throw Error("scales", "expected dtype f32, got " + std::string(dtype_name(scales.dtype)));
  const Span sx = byte_span("x", x), sc = byte_span("codes", codes), ss = byte_span("scales", scales);
  if (codes.shape != x.shape) throw Error("codes", "expected x's shape " + shape_str(x.shape) + ", got " + shape_str(codes.shape));
  if (scales.shape != scale_shape(x.shape))
    throw Error("scales", "expected shape " + shape_str(scale_shape(x.shape)) + " (x's without its last axis), got " +
                              shape_str(scales.shape));
  check_no_self_overlap("codes", codes.shape, codes.strides);
  check_no_self_overlap("scales", scales.shape, scales.strides);
  if (overlaps(sc, sx)) throw Error("codes", "memory overlaps x");
  if (overlaps(ss, sx)) throw Error("scales", "memory overlaps x");
  if (overlaps(ss, sc)) throw Error("scales", "memory overlaps codes");
  const std::int64_t n = x.shape[3];
  // every row checked before anything is written
  for_rows(x.shape, x.strides, [&](std::int64_t r, std::int64_t off) {
    if (first_nonfinite_row(static_cast<const char*>(x.data) + off * std::int64_t(dtype_size(x.dtype)), x.dtype, 1, n, 0,
                            x.strides[3]) == 0)
      throw Error("x", "row " + row_name(x.shape, r) + " holds a NaN or an infinity, which 8-bit codes cannot represent");
  });
  std::vector<float> row(static_cast<std::size_t>(n));
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  auto* scale_base = static_cast<float*>(scales.data);
  std::int64_t r2 = 0;
  for (std::int64_t a = 0; a < x.shape[0]; ++a)
    for (std::int64_t b = 0; b < x.shape[1]; ++b)
      for (std::int64_t c = 0; c < x.shape[2]; ++c, ++r2) {
        const auto* src = static_cast<const char*>(x.data) +
                          (a * x.strides[0] + b * x.strides[1] + c * x.strides[2]) * std::int64_t(dtype_size(x.dtype));
        convert_matrix(src, x.dtype, 0, x.strides[3], 1, n, row.data(), DType::f32, n);  // f64: rounded to f32
        auto* dst = static_cast<std::uint8_t*>(codes.data) + a * codes.strides[0] + b * codes.strides[1] + c * codes.strides[2];
        float* s = scale_base + a * scales.strides[0] + b * scales.strides[1] + c * scales.strides[2];
        if (codes.strides[3] == 1) {
          quantize_rows(code, row.data(), 1, n, n, dst, n, s, 1);
        } else {
          quantize_rows(code, row.data(), 1, n, n, out.data(), n, s, 1);
          for (std::int64_t i = 0; i < n; ++i) dst[i * codes.strides[3]] = out[i];
        }
      }
}

void dequantize_kv(const ConstTensorView& codes, const ConstTensorView& scales, const TensorView& out) {
  using namespace detail;
  check_isa();
  check_code(codes.dtype, "codes");
  check_float_dtype(out.dtype, "out");
  if (scales.dtype != DType::f32) throw Error("scales", "expected dtype f32, got " + std::string(dtype_name(scales.dtype)));
  const Span sc = byte_span("codes", codes), ss = byte_span("scales", scales), so = byte_span("out", out);
  if (scales.shape != scale_shape(codes.shape))
    throw Error("scales", "expected shape " + shape_str(scale_shape(codes.shape)) + " (codes' without its last axis), got " +
                              shape_str(scales.shape));
  if (out.shape != codes.shape) throw Error("out", "expected codes' shape " + shape_str(codes.shape) + ", got " + shape_str(out.shape));
  check_no_self_overlap("out", out.shape, out.strides);
  if (overlaps(so, sc)) throw Error("out", "memory overlaps codes");
  if (overlaps(so, ss)) throw Error("out", "memory overlaps scales");
  const auto* sb = static_cast<const float*>(scales.data);
  for_rows(scales.shape, scales.strides, [&](std::int64_t r, std::int64_t off) {
    if (!(std::isfinite(sb[off]) && sb[off] >= 0.0f))
      throw Error("scales", "scale " + row_name(scales.shape, r) + " must be finite and >= 0, got " + std::to_string(sb[off]));
  });
  const std::int64_t n = codes.shape[3];
  const simd::Quant8Kernels& q8 = simd::kernels().code8(code8_of(codes.dtype));
  std::vector<float> row(static_cast<std::size_t>(n));
  std::vector<std::uint8_t> in(static_cast<std::size_t>(n));
  for (std::int64_t a = 0; a < codes.shape[0]; ++a)
    for (std::int64_t b = 0; b < codes.shape[1]; ++b)
      for (std::int64_t c = 0; c < codes.shape[2]; ++c) {
        const auto* src = static_cast<const std::uint8_t*>(codes.data) + a * codes.strides[0] + b * codes.strides[1] + c * codes.strides[2];
        if (codes.strides[3] != 1) {
          for (std::int64_t i = 0; i < n; ++i) in[i] = src[i * codes.strides[3]];
          src = in.data();
        }
        q8.dequantize(src, n, sb[a * scales.strides[0] + b * scales.strides[1] + c * scales.strides[2]], row.data());
        char* dst = static_cast<char*>(out.data) +
                    (a * out.strides[0] + b * out.strides[1] + c * out.strides[2]) * std::int64_t(dtype_size(out.dtype));
        convert_matrix(row.data(), DType::f32, 0, 1, 1, n, dst, out.dtype, 0, out.strides[3]);
      }
}

}  // namespace simdattn
