// Packing a layer's weights for its GEMM (layer/build.cpp, layer/mla/mla.cpp): W [rows, cols]
// transposed to W^T, column groups padded to the GEMM's panel width, packed once.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "layer/storage.hpp"
#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

// The panel width of T's GEMM: column groups packed side by side start at multiples of it.
template <class T>
std::int64_t weights_nr() {
  if constexpr (kIs16Bit<T>) return gemm16_kernels(simd::kernels(), std::is_same_v<T, bfloat16>).nr;
  else return simd::kernels().gemm<T>().blocking.nr;
}

// B [K, N] (row-major, leading dimension ldb) packed for T's GEMM.
template <class T>
PackedWeights<T> pack_weights(const T* B, std::int64_t ldb, std::int64_t K, std::int64_t N) {
  if constexpr (kIs16Bit<T>)
    return pack16_b(reinterpret_cast<const std::uint16_t*>(B), ldb, K, N, std::is_same_v<T, bfloat16>);
  else return pack_matrix_b(B, ldb, K, N);
}

// dst[c * ld + r] = src[r * cols + c]: W [rows, cols] -> W^T [cols, rows] (leading dimension ld).
template <class T>
void transpose_into(const std::vector<T>& src, std::int64_t rows, std::int64_t cols, T* dst, std::int64_t ld) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * ld + r] = src[static_cast<std::size_t>(r * cols + c)];
}

}  // namespace simdattn::detail
