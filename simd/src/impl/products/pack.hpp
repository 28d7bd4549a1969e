// Packing: the transposing pack of VectorKernels::pack_transpose (K^T panels, GEMM's A and B
// panels), with AVX-512's 16 x 16 register transpose.
#pragma once

#include <algorithm>
#include <cstdint>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

#if defined(__AVX512F__)
// r[i] := column i of the 16 x 16 matrix whose rows are r[0..15] (unpack 32- and 64-bit pairs,
// then swap 128-bit lanes twice).
inline void transpose16x16(__m512 r[16]) {
  __m512 t[16], u[16], v[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j) {
      v[8 * h + j] = _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0x88);
      v[8 * h + 4 + j] = _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0xdd);
  }
}

// pack_transpose's AVX-512 loop (below) on rows supplied by load(r, c0, ncol): row r's 16 values
// from column c0 as f32, zero past ncol (the caller's element type and widening).
template <class Load>
void pack_transpose_blocks(Load load, std::int64_t rows, std::int64_t cols, float* dst, std::int64_t dst_ld,
                           std::int64_t width) {
  for (std::int64_t r0 = 0; r0 < width; r0 += 16) {
    const std::int64_t nrow = std::max<std::int64_t>(0, std::min<std::int64_t>(16, rows - r0));
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      const std::int64_t ncol = std::min<std::int64_t>(16, cols - c0);
      __m512 v[16];
      for (std::int64_t i = 0; i < 16; ++i) v[i] = i < nrow ? load(r0 + i, c0, ncol) : _mm512_setzero_ps();
      transpose16x16(v);
      if (r0 + 16 <= width) {
        for (std::int64_t j = 0; j < ncol; ++j) _mm512_storeu_ps(dst + (c0 + j) * dst_ld + r0, v[j]);
      } else {  // a panel narrower than 16 (GEMM's A panels are 12 rows): store its lanes only
        const auto wm = static_cast<__mmask16>((1u << (width - r0)) - 1u);
        for (std::int64_t j = 0; j < ncol; ++j) _mm512_mask_storeu_ps(dst + (c0 + j) * dst_ld + r0, wm, v[j]);
      }
    }
  }
}
#endif

template <class Arch, class T>
void pack_transpose(const T* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, T* dst,
                    std::int64_t dst_ld, std::int64_t width) {
  // AVX-512, f32: 16 x 16 blocks transposed in registers (16 row loads, 64 shuffles, 16
  // stores), where a masked gather per 16 rows and column costs about three times as much
  // (guarded by attention/native/vit, which packs a K^T panel per key block). Partial blocks
  // load with a column mask; rows past `rows` are zero vectors and are never read.
#if defined(__AVX512F__)
  if constexpr (kHasAvx512<Arch> && sizeof(T) == 4) {
    pack_transpose_blocks(
        [&](std::int64_t r, std::int64_t c0, std::int64_t ncol) {
          const auto cm = static_cast<__mmask16>(ncol == 16 ? 0xffffu : (1u << ncol) - 1u);
          return _mm512_maskz_loadu_ps(cm, reinterpret_cast<const float*>(src) + r * ld + c0);
        },
        rows, cols, reinterpret_cast<float*>(dst), dst_ld, width);
    return;
  }
#endif
  // c outer: one contiguous write stream, `rows` sequential read streams
  for (std::int64_t c = 0; c < cols; ++c) {
    T* d = dst + c * dst_ld;
    for (std::int64_t r = 0; r < rows; ++r) d[r] = src[r * ld + c];
    for (std::int64_t r = rows; r < width; ++r) d[r] = T(0);
  }
}

}  // namespace simdattn::simd::impl
