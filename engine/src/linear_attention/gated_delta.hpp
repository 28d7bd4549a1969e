// Part of the gated delta rule (gated_delta.cpp, gated_delta_checks.cpp, gated_delta_pairs.cpp):
// a call's sizes, its checks, an element of a view as f32, and the choice of the chunks' products.
#pragma once

#include <cstdint>

#include "core/element.hpp"
#include "simdattn/linear.hpp"

namespace simdattn::detail {

struct GdrSizes {
  std::int64_t B, T, H, Hv, Dk, Dv;
};

// Element (i0, i1, i2, i3) of a view, widened to float.
inline float gdr_at(const ConstTensorView& v, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
  return static_cast<float>(widen_at(v.data, v.dtype, i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2] + i3 * v.strides[3]));
}

// Every argument of gated_delta_rule: dtypes, shapes, overlaps, then values (finite inputs, g <=
// 0, a finite initial state); an Error naming the first bad one, before anything is written.
GdrSizes check_gated_delta(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                           const ConstTensorView& g, const ConstTensorView& beta, const TensorView& out,
                           const GatedDeltaRuleOptions& o);

// What a chunk's products run on: f32 (the GEMM's in-place-A kernels; bf16 and f16 rows widened),
// or bf16 pairs (AVX512-BF16's vdpbf16ps: the normalized keys and queries, the state and the
// chunk's U rounded to bf16 for [K; Q] S and K^T U, every sum in f32, as flash-linear-attention's
// kernels round the state to the inputs' dtype). gated_delta_rule chooses (automatic): bf16
// pairs for bf16 q, k and v where the CPU prefers them (simd::bf16_pairs_preferred), else f32;
// tests and perf name one. bf16_pairs where the dispatched table has no such kernels: a
// std::logic_error.
enum class GdrProducts { automatic, f32, bf16_pairs };

void gated_delta_rule_on(GdrProducts products, const ConstTensorView& q, const ConstTensorView& k,
                         const ConstTensorView& v, const ConstTensorView& g, const ConstTensorView& beta,
                         const TensorView& out, const GatedDeltaRuleOptions& options);

}  // namespace simdattn::detail
