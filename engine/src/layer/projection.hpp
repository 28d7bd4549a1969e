// The layer's projections, y = x W^T + b (torch's nn.Linear), on the GEMM of the layer's dtype
// over the pre-packed W^T, or on a oneDNN matmul over its row-major copy (the onednn backend).
#pragma once

#include <cstdint>

#include "layer/storage.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// y[M, N] = x[M, K] W^T + b, with W^T [K, ...] pre-packed for the GEMM (columns col .. col + N -
// 1 of it): no call packs a weight, and a decode step's matrix-vector product streams each
// panel once. bf16/f16: the products and the bias summed in f32, y rounded to nearest even.
// With `row_major` (w's row-major copy: W^T, w's columns apart), on a oneDNN matmul instead.
template <class T>
void project(const T* x, std::int64_t M, std::int64_t K, std::int64_t ldx, const PackedWeights<T>& w, std::int64_t col,
             std::int64_t N, const T* bias, T* y, std::int64_t ldy, int threads, const T* row_major = nullptr);

// The row-major W^T of `w` (one of the layer's packed weights) when the call runs on the onednn
// backend, else null (the native GEMM on the packed panels). Made on the layer's first onednn
// call, once for all its weights.
template <class T>
const T* onednn_weights(const LayerStorage<T>& layer, const MhaOptions& o, const PackedWeights<T>& w);

}  // namespace simdattn::detail
