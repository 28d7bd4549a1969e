// Positions in the layer: each token's position (given, or counted from a start), QK-norm and
// RoPE applied to the projected q and k.
#pragma once

#include <cstdint>
#include <span>

#include "layer/storage.hpp"

namespace simdattn::detail {

// Positions given for B sequences of S tokens: B*S of them, none negative (Error naming
// "options.positions").
void check_positions(std::span<const std::int64_t> positions, std::int64_t B, std::int64_t S);

// QK-norm and RoPE on the projected q (heads columns from column 0) and k (kv_heads columns from
// k0) of rows [b * S + s] (row stride N) of p: the position of (b, s) is positions[b * S + s] if
// given, else start[b] + s (start null: 0).
template <class T>
void position_qk(const LayerStorage<T>& layer, T* p, std::int64_t N, std::int64_t k0, std::int64_t B, std::int64_t S,
                 std::span<const std::int64_t> positions, const std::int64_t* start, int threads);

}  // namespace simdattn::detail
