// The MHA layer's projections on the onednn backend: y = x W + b as a oneDNN matmul, so that a
// layer run there computes all of its products on oneDNN (an independent cross-check of the
// whole layer, not only of its attention core).
#pragma once

#include <cstdint>

#include "simdattn/tensor.hpp"

namespace simdattn::detail {

// y[M, N] = x[M, K] W[K, N] + bias[N] (row-major, leading dimensions ldx, ldw, ldy; bias f32 or
// null). dtype f32 or bf16 for x, W and y (bf16: products and bias summed in f32, y rounded to
// nearest even). Primitives are cached per shape; scratchpads are the calling thread's. Throws
// Error("options.backend") where oneDNN has no such matmul.
void onednn_matmul(DType dtype, const void* x, std::int64_t M, std::int64_t K, std::int64_t ldx, const void* w,
                   std::int64_t ldw, std::int64_t N, const float* bias, void* y, std::int64_t ldy, int threads);

}  // namespace simdattn::detail
