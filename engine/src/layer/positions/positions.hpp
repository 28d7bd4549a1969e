// Positions in the layer: each token's position (given, or counted from a start), QK-norm and
// RoPE applied to the projected q and k.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <span>

#include "core/element.hpp"
#include "layer/storage.hpp"

namespace simdattn::detail {

// Hugging Face's RMSNorm of one row x[0 .. n) in place: x / sqrt(mean(x^2) + eps) in f32 (f64
// layers: f64), rounded to T, times the weight w, rounded once (weight * hidden.to(dtype)).
template <class T>
void rms_norm_row(T* x, std::int64_t n, const float* w, double eps) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  A ss = 0;
  for (std::int64_t d = 0; d < n; ++d) ss += static_cast<A>(widen(x[d])) * static_cast<A>(widen(x[d]));
  const A inv = A(1) / std::sqrt(ss / static_cast<A>(n) + static_cast<A>(eps));
  for (std::int64_t d = 0; d < n; ++d) {
    const auto normed = static_cast<A>(widen(narrow<T>(static_cast<double>(static_cast<A>(widen(x[d])) * inv))));
    x[d] = narrow<T>(static_cast<double>(static_cast<A>(w[d]) * normed));
  }
}

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
