// The multi-head attention layer's KV cache: incremental decoding (token by token and in chunks)
// against the full causal forward (layer/mha_reference.hpp), in f64, f32, bf16 and f16 and caches of
// a dtype of their own; capacity, truncate and the layer checks leaving the cache as it was; the
// exact capacity (a regression).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <random>
#include <tuple>
#include <type_traits>
#include <string>
#include <vector>

#include "layer/mha_reference.hpp"
#include "support/test_util.hpp"

using namespace simdattn;
using namespace mha_test;

TEST_CASE("KV cache: decoding token by token and in chunks of 3 equals the full causal forward") {
  std::mt19937_64 rng(test::base_seed() + 34);
  const std::int64_t d = 16, H = 4, Hkv = 2, hd = 4;
  const Model m = random_model(rng, d, H, Hkv, hd, d, d, true);
  const MultiHeadAttention layer(m.cfg, m.w);
  // Two sequences of different lengths: prompts of 5 and 9 tokens, then 7 generated tokens each.
  const std::int64_t prompt[2] = {5, 9}, gen = 7, P = 9;
  std::vector<std::vector<double>> tokens(2);
  for (auto& t : tokens) t = randn(rng, std::size_t((P + gen) * d));
  // Expected: the full causal forward of each sequence alone.
  std::vector<std::vector<double>> full(2);
  for (int s = 0; s < 2; ++s) {
    const std::int64_t n = prompt[s] + gen;
    const std::vector<double> x(tokens[s].begin(), tokens[s].begin() + n * d);
    full[s] = mha_reference(m, x, x, x, 1, n, n, Causal::top_left);
  }
  for (std::int64_t chunk : {1, 3}) {
    CAPTURE(chunk);
    KvCache cache(layer, 2, 32);
    // Prefill both prompts right-padded to P tokens, then drop the padding from sequence 0.
    std::vector<double> x(std::size_t(2 * P * d), 0.0), y(std::size_t(2 * P * d));
    for (int s = 0; s < 2; ++s)
      std::copy(tokens[s].begin(), tokens[s].begin() + prompt[s] * d, x.begin() + s * P * d);
    layer.forward(ConstSeqView(x.data(), 2, P, d), cache, SeqView(y.data(), 2, P, d));
    cache.truncate(0, prompt[0]);
    for (int s = 0; s < 2; ++s)
      for (std::int64_t t = 0; t < prompt[s]; ++t)
        for (std::int64_t e = 0; e < d; ++e)
          CHECK(std::abs(y[std::size_t((s * P + t) * d + e)] - full[s][std::size_t(t * d + e)]) <= 1e-12);
    // Generate in steps of `chunk` tokens (the last step may be shorter).
    for (std::int64_t done = 0; done < gen; done += chunk) {
      const std::int64_t T = std::min(chunk, gen - done);
      std::vector<double> xs(std::size_t(2 * T * d)), ys(std::size_t(2 * T * d));
      for (int s = 0; s < 2; ++s)
        std::copy(tokens[s].begin() + (prompt[s] + done) * d, tokens[s].begin() + (prompt[s] + done + T) * d,
                  xs.begin() + s * T * d);
      layer.forward(ConstSeqView(xs.data(), 2, T, d), cache, SeqView(ys.data(), 2, T, d));
      for (int s = 0; s < 2; ++s) {
        CHECK(cache.lengths()[std::size_t(s)] == prompt[s] + done + T);
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t e = 0; e < d; ++e)
            CHECK(std::abs(ys[std::size_t((s * T + t) * d + e)] - full[s][std::size_t((prompt[s] + done + t) * d + e)]) <=
                  1e-12);
      }
    }
  }
}

TEST_CASE("KV cache: capacity, truncate and layer checks leave the cache as it was") {
  std::mt19937_64 rng(test::base_seed() + 35);
  const Model m = random_model(rng, 8, 2, 1, 4, 8, 8, false);
  const MultiHeadAttention layer(m.cfg, m.w);
  KvCache cache(layer, 1, 4);
  const auto x = randn(rng, 3 * 8);
  std::vector<double> y(3 * 8);
  layer.forward(ConstSeqView(x.data(), 1, 3, 8), cache, SeqView(y.data(), 1, 3, 8));
  CHECK(cache.lengths()[0] == 3);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 2, 8), cache, SeqView(y.data(), 1, 2, 8)),
                       doctest::Contains("capacity"), Error);
  CHECK(cache.lengths()[0] == 3);
  MhaOptions opt;
  opt.causal = Causal::top_left;
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 1, 8), cache, SeqView(y.data(), 1, 1, 8), opt),
                       doctest::Contains("options.causal"), Error);
  CHECK(cache.lengths()[0] == 3);
  const auto lengths = cache.lengths();  // a span taken before a step sees the step's lengths
  layer.forward(ConstSeqView(x.data(), 1, 0, 8), cache, SeqView(y.data(), 1, 0, 8));
  CHECK(lengths[0] == 3);
  CHECK_THROWS_WITH_AS(KvCache(layer, 1, std::int64_t{1} << 60), doctest::Contains("capacity"), Error);
  CHECK_THROWS_AS(cache.truncate(0, 4), Error);
  CHECK_THROWS_AS(cache.truncate(1, 0), Error);
  cache.truncate(0, 1);
  CHECK(cache.lengths()[0] == 1);
  cache.reset();
  CHECK(cache.lengths()[0] == 0);
  const Model other = random_model(rng, 8, 2, 2, 4, 8, 8, false);
  const MultiHeadAttention layer2(other.cfg, other.w);
  CHECK_THROWS_WITH_AS(layer2.forward(ConstSeqView(x.data(), 1, 1, 8), cache, SeqView(y.data(), 1, 1, 8)),
                       doctest::Contains("cache"), Error);
}

TEST_CASE("KV cache in bf16/f16, and caches of a dtype of their own: decode steps equal the full forward") {
  std::mt19937_64 rng(test::base_seed() + 37);
  const std::int64_t d = 32, heads = 4, kv = 2, n = 9, prompt = 4;
  const Model m = random_model(rng, d, heads, kv, d / heads, d, d, true);
  const auto [mb, wb] = rounded_model<bfloat16>(m);
  const auto [mh, wh] = rounded_model<float16>(m);
  const auto x = randn(rng, std::size_t(n * d));
  const MultiHeadAttention f32(m.cfg, weights_as<float>(m.w)), bf16(mb.cfg, wb), f16(mh.cfg, wh);
  // Runs the prompt then one token at a time through a cache of `dtype`; returns the outputs.
  auto decode = [&]<class T>(const MultiHeadAttention& layer, DType dtype, std::vector<T> xt) {
    KvCache cache(layer, 1, 16, dtype);
    CHECK(cache.dtype() == dtype);
    std::vector<T> y(xt.size());
    layer.forward(ConstSeqView(xt.data(), 1, prompt, d), cache, SeqView(y.data(), 1, prompt, d));
    for (std::int64_t t = prompt; t < n; ++t)
      layer.forward(ConstSeqView(xt.data() + t * d, 1, 1, d), cache, SeqView(y.data() + t * d, 1, 1, d));
    CHECK(cache.lengths()[0] == n);
    return y;
  };
  // bf16 and f16 layers with caches in their dtype: the full forward's roundings.
  {
    const auto xb = conv<bfloat16>(x);
    const auto want = mha_reference(mb, conv<double>(xb), conv<double>(xb), conv<double>(xb), 1, n, n, Causal::top_left, {}, {},
                                    &round_to<bfloat16>);
    CHECK(max_rel_err(decode(bf16, DType::bf16, xb), want) <= kTol16<bfloat16>);
    // ... and with an f32 cache (K and V kept as the layer rounded them): the same numbers.
    CHECK(max_rel_err(decode(bf16, DType::f32, xb), want) <= kTol16<bfloat16>);
    const auto xh = conv<float16>(x);
    const auto want16 = mha_reference(mh, conv<double>(xh), conv<double>(xh), conv<double>(xh), 1, n, n, Causal::top_left, {}, {},
                                      &round_to<float16>);
    CHECK(max_rel_err(decode(f16, DType::f16, xh), want16) <= kTol16<float16>);
  }
  // An f32 layer with bf16 and f16 caches (as llama.cpp keeps f16 caches beside f32
  // activations): within each format's tolerance of the f64 forward.
  const auto want = mha_reference(m, x, x, x, 1, n, n, Causal::top_left);
  const auto xf = conv<float>(x);
  CHECK(max_rel_err(decode(f32, DType::bf16, xf), want) <= kTol16<bfloat16>);
  CHECK(max_rel_err(decode(f32, DType::f16, xf), want) <= kTol16<float16>);
  CHECK(max_rel_err(decode(f32, DType::f32, xf), want) <= 2e-5);
  CHECK_THROWS_WITH_AS(KvCache(f32, 1, 4, DType::u8), doctest::Contains("dtype: expected f32, f64, bf16, f16, int8, fp8_e4m3 or fp8_e5m2, got u8"), Error);
}

TEST_CASE("regression: KV cache: a step that exactly fills the capacity succeeds, one token more is refused") {
  std::mt19937_64 rng(test::base_seed() + 74);
  const std::int64_t d = 8;
  MhaWeights<float> w;
  w.wq = test::normal(rng, std::size_t(d * d), 0.3f), w.wk = test::normal(rng, std::size_t(d * d), 0.3f);
  w.wv = test::normal(rng, std::size_t(d * d), 0.3f), w.wo = test::normal(rng, std::size_t(d * d), 0.3f);
  const MultiHeadAttention layer(MhaConfig{.d_model = d, .heads = 2}, w);
  const std::vector<float> x = test::normal(rng, std::size_t(4 * d), 1.f);
  std::vector<float> y(x.size());
  // First, two sequences, the first full and the second not: a step is refused for the first.
  // (Were the bound off by one, the first sequence's extra row would land inside the cache, in
  // the next head's first row: this REQUIRE then ends the case with a failed assertion before
  // the single-sequence steps below would write past the buffer.)
  KvCache two(layer, 2, 4);
  std::vector<float> x2(static_cast<std::size_t>(2 * 4 * d)), y2(x2.size());
  for (std::size_t i = 0; i < x2.size(); ++i) x2[i] = x[i % x.size()];
  layer.forward(ConstSeqView(x2.data(), 2, 4, d), two, SeqView(y2.data(), 2, 4, d));
  two.truncate(1, 2);
  REQUIRE_THROWS_WITH_AS(layer.forward(ConstSeqView(x2.data(), 2, 1, d), two, SeqView(y2.data(), 2, 1, d)),
                         doctest::Contains("capacity"), Error);
  CHECK(two.lengths()[0] == 4);
  CHECK(two.lengths()[1] == 2);
  for (std::int64_t first : {4, 3}) {  // one step of 4 tokens, or 3 then 1
    CAPTURE(first);
    KvCache cache(layer, 1, 4);
    CHECK_NOTHROW(layer.forward(ConstSeqView(x.data(), 1, first, d), cache, SeqView(y.data(), 1, first, d)));
    if (first < 4)
      CHECK_NOTHROW(layer.forward(ConstSeqView(x.data(), 1, 4 - first, d), cache, SeqView(y.data(), 1, 4 - first, d)));
    CHECK(cache.lengths()[0] == 4);
    CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 1, d), cache, SeqView(y.data(), 1, 1, d)),
                         doctest::Contains("capacity"), Error);
    CHECK(cache.lengths()[0] == 4);
  }
}
