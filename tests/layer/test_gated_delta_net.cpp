// GatedDeltaNet (simdattn/gated_delta_net.hpp) from weights in memory: a sequence run whole equals
// it run in pieces with a GatedDeltaNetState carried (the conv window across pieces shorter than
// the kernel, the recurrent state across chunk boundaries); the state's bytes and reset; threads
// bitwise; bad weights, inputs and states named with nothing changed. Its values against
// transformers' code: tests/python/layers/test_qwen3_next.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t kD = 24, kH = 2, kHv = 4, kDk = 8, kDv = 6, kK = 4;

GatedDeltaNetConfig config() {
  return {.hidden_size = kD, .key_heads = kH, .value_heads = kHv, .key_head_dim = kDk, .value_head_dim = kDv,
          .conv_kernel = kK, .norm_eps = 1e-6};
}

GatedDeltaNetWeights<float> weights(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.3f);
  auto fill = [&](std::int64_t count) {
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = n(rng);
    return v;
  };
  GatedDeltaNetWeights<float> w;
  const std::int64_t conv_dim = 2 * kH * kDk + kHv * kDv;
  w.in_proj_qkvz = fill((2 * kH * kDk + 2 * kHv * kDv) * kD);
  w.in_proj_ba = fill(2 * kHv * kD);
  w.conv = fill(conv_dim * kK);
  w.dt_bias = fill(kHv), w.A_log = fill(kHv), w.norm = fill(kDv);
  w.out_proj = fill(kD * kHv * kDv);
  return w;
}

std::vector<float> run(const GatedDeltaNet& g, const std::vector<float>& x, std::int64_t B, std::int64_t S,
                       GatedDeltaNetState* state, int threads = 0) {
  std::vector<float> y(x.size());
  g.forward(ConstSeqView(x.data(), B, S, kD), SeqView(y.data(), B, S, kD), state, threads);
  return y;
}

}  // namespace

TEST_CASE("GatedDeltaNet: whole equals pieces with the state carried, bytes, reset, threads bitwise") {
  const GatedDeltaNet g(config(), weights(1));
  const std::int64_t B = 2, S = 75;
  std::mt19937 rng(2);
  std::normal_distribution<float> n;
  std::vector<float> x(static_cast<std::size_t>(B * S * kD));
  for (float& v : x) v = n(rng);
  const std::vector<float> whole = run(g, x, B, S, nullptr, 1);
  for (int threads : {2, 3}) CHECK(run(g, x, B, S, nullptr, threads) == whole);
  GatedDeltaNetState st(g, B);
  CHECK(st.bytes() == B * (kHv * kDk * kDv * 4 + (kK - 1) * (2 * kH * kDk + kHv * kDv) * 4));
  for (int pass = 0; pass < 2; ++pass) {  // the second after reset(): the same again
    std::vector<float> pieces(x.size());
    std::int64_t t = 0;
    for (std::int64_t len : {1, 2, 40, 1, 31}) {  // the first pieces shorter than the conv's window
      std::vector<float> xs(static_cast<std::size_t>(B * len * kD));
      for (std::int64_t b = 0; b < B; ++b)
        std::copy_n(x.begin() + (b * S + t) * kD, len * kD, xs.begin() + b * len * kD);
      const std::vector<float> ys = run(g, xs, B, len, &st);
      for (std::int64_t b = 0; b < B; ++b) std::copy_n(ys.begin() + b * len * kD, len * kD, pieces.begin() + (b * S + t) * kD);
      t += len;
    }
    CHECK(st.tokens() == S);
    for (std::size_t i = 0; i < whole.size(); ++i) CHECK(std::abs(pieces[i] - whole[i]) <= 1e-4f * std::max(1.0f, std::abs(whole[i])));
    st.reset();
    CHECK(st.tokens() == 0);
  }
  // without the state the second piece differs: the state is what carries it
  std::vector<float> x2(x.begin(), x.begin() + 3 * kD), with(3 * kD), alone(3 * kD);
  GatedDeltaNetState one(g, 1);
  run(g, std::vector<float>(x.begin(), x.begin() + 5 * kD), 1, 5, &one);
  g.forward(ConstSeqView(x2.data(), 1, 3, kD), SeqView(with.data(), 1, 3, kD), &one);
  g.forward(ConstSeqView(x2.data(), 1, 3, kD), SeqView(alone.data(), 1, 3, kD));
  CHECK(with != alone);
}

TEST_CASE("GatedDeltaNet: bad configurations, weights, inputs and states are named, nothing changed") {
  using test::check_error;
  check_error([] { GatedDeltaNetConfig c = config(); c.value_heads = 3; GatedDeltaNet(c, weights(1)); }, "config.value_heads");
  check_error([] { GatedDeltaNetConfig c = config(); c.conv_kernel = 0; GatedDeltaNet(c, weights(1)); }, "config.conv_kernel");
  check_error([] { auto w = weights(1); w.conv.pop_back(); GatedDeltaNet(config(), std::move(w)); }, "weights.conv");
  check_error([] { auto w = weights(1); w.norm.push_back(1.f); GatedDeltaNet(config(), std::move(w)); }, "weights.norm");
  check_error([] { auto w = weights(1); w.A_log[1] = 200.f; GatedDeltaNet(config(), std::move(w)); }, "weights.A_log");
  check_error([] { auto w = weights(1); w.out_proj[3] = std::numeric_limits<float>::quiet_NaN(); GatedDeltaNet(config(), std::move(w)); },
              "weights.out_proj");
  const GatedDeltaNet g(config(), weights(3));
  GatedDeltaNetState st(g, 2);
  std::vector<float> x(static_cast<std::size_t>(2 * 4 * kD), 0.5f), y(x.size(), 7.f);
  x[static_cast<std::size_t>(kD + 5)] = std::numeric_limits<float>::infinity();
  check_error([&] { g.forward(ConstSeqView(x.data(), 2, 4, kD), SeqView(y.data(), 2, 4, kD), &st); }, "x");
  CHECK(st.tokens() == 0);
  for (float v : y) CHECK(v == 7.f);
  x[static_cast<std::size_t>(kD + 5)] = 0.f;
  GatedDeltaNetState three(g, 3);
  check_error([&] { g.forward(ConstSeqView(x.data(), 2, 4, kD), SeqView(y.data(), 2, 4, kD), &three); }, "state");
  check_error([&] { g.forward(ConstSeqView(x.data(), 2, 4, kD - 1), SeqView(y.data(), 2, 4, kD), &st); }, "x");
  check_error([&] { g.forward(ConstSeqView(x.data(), 2, 4, kD), SeqView(y.data(), 2, 3, kD), &st); }, "out");
  const GatedDeltaNet other(GatedDeltaNetConfig{.hidden_size = kD, .key_heads = kH, .value_heads = kHv, .key_head_dim = kDk,
                                                .value_head_dim = kDv, .conv_kernel = 3},
                            [] { auto w = weights(4); w.conv.resize(static_cast<std::size_t>((2 * kH * kDk + kHv * kDv) * 3)); return w; }());
  check_error([&] { other.forward(ConstSeqView(x.data(), 2, 4, kD), SeqView(y.data(), 2, 4, kD), &st); }, "state");
  check_error([&] { GatedDeltaNetState bad(g, 0); }, "batch");
  CHECK(st.tokens() == 0);
}
