// The gpt-layer stand-in of the serving benchmarks (perf/suite/bench_pool.cpp, perf/serve/): d_model
// 1024, 16 heads, f32, random weights N(0, 1/32^2) and biases from a fixed seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "simdattn/mha.hpp"

namespace simdattn::perf {

inline constexpr std::int64_t kGptD = 1024, kGptHeads = 16;

inline MultiHeadAttention gpt_layer() {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 1.f / 32.f);
  auto v = [&](std::int64_t k) {
    std::vector<float> x(static_cast<std::size_t>(k));
    for (auto& e : x) e = n(rng);
    return x;
  };
  constexpr std::int64_t d = kGptD;
  return MultiHeadAttention(MhaConfig{.d_model = d, .heads = kGptHeads},
                            MhaWeights<float>{v(d * d), v(d * d), v(d * d), v(d * d), v(d), v(d), v(d), v(d)});
}

}  // namespace simdattn::perf
