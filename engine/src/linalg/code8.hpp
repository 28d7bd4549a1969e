// Rows of 8-bit K/V codes (simdattn/simd/code8.hpp's formats) made and read by the KV caches and
// the public quantize_kv / dequantize_kv: each row of D values quantized on the kernel table's
// Quant8Kernels (bit for bit the scalar formats on every ISA).
#pragma once

#include <cstdint>

#include "simdattn/tensor.hpp"

namespace simdattn::detail {

// rows rows of n f32 values (ldx apart) to codes of dtype `code` (ldc bytes apart) and a scale
// each (at scale + r * scale_stride). Returns the first row holding a NaN or an infinity (it and
// the rows after it unwritten), or -1.
std::int64_t quantize_rows(DType code, const float* x, std::int64_t rows, std::int64_t n, std::int64_t ldx,
                           std::uint8_t* codes, std::int64_t ldc, float* scale, std::int64_t scale_stride);

// One row of n values of dtype t (f32, f64, bf16 or f16) to codes and a scale, widened (f64:
// rounded) to f32 in tmp first. False, nothing written, if it holds a NaN or an infinity.
bool quantize_row(DType code, const void* x, DType t, std::int64_t n, float* tmp, std::uint8_t* codes, float* scale);

// The first of `rows` rows of n values of dtype t (f32, f64, bf16 or f16; row r at element
// r * ldx, elements cs apart) holding a NaN or an infinity, or -1.
std::int64_t first_nonfinite_row(const void* x, DType t, std::int64_t rows, std::int64_t n, std::int64_t ldx,
                                 std::int64_t cs = 1);

}  // namespace simdattn::detail
