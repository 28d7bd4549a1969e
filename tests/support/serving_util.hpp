// Helpers of the serving tests (forward_batch, the schedulers, the KV pool, the soak): a small
// random f32 layer, random token rows, and (with doctest) a check that a call throws Error naming
// an argument.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"

namespace simdattn::test {

// d_model 32, 4 query heads over 2 kv heads (head_dim 8), biases, RoPE unless rope = false;
// weights N(0, 0.2^2) from rng.
constexpr std::int64_t kServingD = 32, kServingHeads = 4, kServingKvHeads = 2;

inline MultiHeadAttention serving_layer(std::mt19937_64& rng, bool rope = true) {
  std::normal_distribution<float> n(0.f, 0.2f);
  auto v = [&](std::int64_t k) {
    std::vector<float> x(static_cast<std::size_t>(k));
    for (auto& e : x) e = n(rng);
    return x;
  };
  constexpr std::int64_t d = kServingD, nkv = kServingD / kServingHeads * kServingKvHeads;
  MhaConfig c{.d_model = d, .heads = kServingHeads, .kv_heads = kServingKvHeads};
  if (rope) c.rope = RopeConfig{.theta = 10000.0};
  return MultiHeadAttention(c, MhaWeights<float>{v(d * d), v(nkv * d), v(nkv * d), v(d * d), v(d), v(nkv), v(nkv), v(d)});
}

// n rows of kServingD values from N(0, 1).
inline std::vector<float> serving_tokens(std::mt19937_64& rng, std::int64_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(n * kServingD));
  for (auto& e : x) e = d(rng);
  return x;
}

#ifdef DOCTEST_VERSION
// f() throws simdattn::Error naming `argument`.
template <class F>
void check_error(F&& f, const std::string& argument) {
  try {
    f();
    FAIL("no error; expected one naming ", argument);
  } catch (const Error& e) {
    CHECK_MESSAGE(e.argument() == argument, e.what());
  }
}
#endif

}  // namespace simdattn::test
