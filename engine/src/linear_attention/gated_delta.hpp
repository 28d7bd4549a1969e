// Part of the gated delta rule (gated_delta.cpp, gated_delta_checks.cpp): a call's sizes, its
// checks, and an element of a view as f32.
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

}  // namespace simdattn::detail
