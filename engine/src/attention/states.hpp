// merge_attention_states' rule (simdattn/paged.hpp) on views the caller keeps valid, for the
// engine's own merges (the pool's cascade, layer/cache/pool_core.hpp): no checks; out and lse may
// be the views of out_a and lse_a or of out_b and lse_b (in place), nothing else may overlap.
#pragma once

#include "simdattn/tensor.hpp"

namespace simdattn::detail {

void merge_states_into(const ConstTensorView& out_a, const ConstTensorView& lse_a, const ConstTensorView& out_b,
                       const ConstTensorView& lse_b, const TensorView& out, const TensorView& lse);

}  // namespace simdattn::detail
