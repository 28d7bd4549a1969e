// Multi-head Latent Attention layers (MhaConfig::mla, MlaWeights): the f32, bf16 and f16 forwards
// agree with the f64 one of the same weights (the float64 oracle of transformers' DeepSeek
// attention is tests/cli/checkpoints/model_families.py's, run by tests/python/layers/test_layer.py and
// tests/cli/test_models.py), bitwise at 1, 2 and 3 threads; a q LoRA or a plain q_proj, biases;
// every weight and configuration error named; the latent cache's size and views, a cache of the
// other kind refused, cross-attention refused, forward_batch as forward step by step; a pool of
// latent rows (batched steps, a fork, an accepted draft) against the prefill.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "layer/mla/mla.hpp"
#include "support/serving_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t kD = 24, kH = 3;

MhaConfig mla_config(std::int64_t q_lora) {
  MhaConfig c{.d_model = kD, .heads = kH};
  c.mla = MlaConfig{.q_lora_rank = q_lora, .kv_lora_rank = 10, .qk_nope_head_dim = 6, .qk_rope_head_dim = 4, .v_head_dim = 5};
  c.rope = RopeConfig{.theta = 10000.0, .style = RopeStyle::interleaved};
  c.causal = true;
  return c;
}

template <class T>
MlaWeights<T> mla_weights(const MhaConfig& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 0.3);
  auto v = [&](std::int64_t k) {
    std::vector<T> x(static_cast<std::size_t>(k));
    for (auto& e : x) e = test::value<T>(n(rng));
    return x;
  };
  auto norm = [&](std::int64_t k) {
    std::vector<float> x(static_cast<std::size_t>(k));
    for (auto& e : x) e = static_cast<float>(1.0 + n(rng));
    return x;
  };
  const MlaConfig& m = *c.mla;
  const std::int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  MlaWeights<T> w;
  if (m.q_lora_rank > 0) {
    w.wq_a = v(m.q_lora_rank * kD), w.bq_a = v(m.q_lora_rank), w.q_a_norm = norm(m.q_lora_rank);
    w.wq_b = v(kH * qk * m.q_lora_rank);
  } else {
    w.wq = v(kH * qk * kD);
  }
  w.wkv_a = v((m.kv_lora_rank + m.qk_rope_head_dim) * kD), w.bkv_a = v(m.kv_lora_rank + m.qk_rope_head_dim);
  w.kv_a_norm = norm(m.kv_lora_rank);
  w.wkv_b = v(kH * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank);
  w.wo = v(kD * kH * m.v_head_dim), w.bo = v(kD);
  return w;
}

template <class T>
std::vector<double> run(const MultiHeadAttention& layer, const std::vector<double>& x, std::int64_t B, std::int64_t S,
                        int threads) {
  std::vector<T> xin(x.size()), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xin[i] = test::value<T>(x[i]);
  MhaOptions o;
  o.threads = threads;
  layer.forward(ConstSeqView(xin.data(), B, S, kD), SeqView(y.data(), B, S, kD), o);
  std::vector<double> out(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) out[i] = test::as_double(y[i]);
  return out;
}

}  // namespace

TEST_CASE("MLA layer: f32, bf16 and f16 forwards agree with f64's, bitwise at any thread count") {
  for (const std::int64_t q_lora : {0, 8}) {
    INFO("q_lora_rank ", q_lora);
    const MhaConfig c = mla_config(q_lora);
    const MultiHeadAttention f64(c, mla_weights<double>(c, 5));
    const MultiHeadAttention f32(c, mla_weights<float>(c, 5));
    const MultiHeadAttention bf16(c, mla_weights<bfloat16>(c, 5));
    const MultiHeadAttention f16(c, mla_weights<float16>(c, 5));
    CHECK(f64.config().head_dim == 10);
    CHECK(f64.config().kv_heads == kH);
    CHECK(f64.config().mla->v_head_dim == 5);
    std::mt19937_64 rng(9);
    std::normal_distribution<double> n;
    const std::int64_t B = 2, S = 9;
    std::vector<double> x(static_cast<std::size_t>(B * S * kD));
    for (double& e : x) e = n(rng);
    const std::vector<double> want = run<double>(f64, x, B, S, 2);
    double scale = 1.0;
    for (double e : want) scale = std::max(scale, std::abs(e));
    auto max_diff = [&](const std::vector<double>& got) {
      double m = 0;
      for (std::size_t i = 0; i < got.size(); ++i) m = std::max(m, std::abs(got[i] - want[i]));
      return m / scale;
    };
    // the weights were drawn in each dtype from the same normals: f32 within its rounding; the
    // 16-bit layers' weights and activations are rounded, so within their tolerance of the f64 layer
    CHECK(max_diff(run<float>(f32, x, B, S, 2)) < 1e-4);
    CHECK(max_diff(run<bfloat16>(bf16, x, B, S, 2)) < 6e-2);
    CHECK(max_diff(run<float16>(f16, x, B, S, 2)) < 1e-2);
    const std::vector<double> one = run<float>(f32, x, B, S, 1);
    for (int t : {2, 3}) CHECK(run<float>(f32, x, B, S, t) == one);
  }
}

TEST_CASE("MLA layer: bad weights and configurations are named, the latent cache's size and views, other kinds refused") {
  const MhaConfig c = mla_config(8);
  using test::check_error;
  auto with = [&](auto edit) {
    MlaWeights<float> w = mla_weights<float>(c, 1);
    edit(w);
    return w;
  };
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.wq_b.pop_back(); })); }, "weights.wq_b");
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.wq.assign(3, 0.f); })); }, "weights.wq");
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.q_a_norm.pop_back(); })); }, "weights.q_a_norm");
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.kv_a_norm[0] = NAN; })); }, "weights.kv_a_norm");
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.wkv_a.push_back(0.f); })); }, "weights.wkv_a");
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.bkv_a.pop_back(); })); }, "weights.bkv_a");
  check_error([&] { MultiHeadAttention(c, with([](MlaWeights<float>& w) { w.wo.pop_back(); })); }, "weights.wo");
  MhaConfig bad = c;
  bad.mla->qk_rope_head_dim = 3;
  check_error([&] { MultiHeadAttention(bad, mla_weights<float>(c, 1)); }, "config.mla.qk_rope_head_dim");
  bad = c, bad.kv_heads = 1;
  check_error([&] { MultiHeadAttention(bad, mla_weights<float>(c, 1)); }, "config.kv_heads");
  bad = c, bad.rope.reset();
  check_error([&] { MultiHeadAttention(bad, mla_weights<float>(c, 1)); }, "config.rope");
  bad = c, bad.rope->rotary_dim = 2;
  check_error([&] { MultiHeadAttention(bad, mla_weights<float>(c, 1)); }, "config.rope.rotary_dim");
  check_error([&] { MultiHeadAttention(c, MhaWeights<float>{}); }, "config.mla");
  const MultiHeadAttention layer(c, mla_weights<float>(c, 1));
  // a latent cache holds kv_lora_rank + qk_rope_head_dim values a token, and only this layer's kind
  const KvCache latent(layer, 1, 8);
  CHECK(latent.bytes_per_token() == (10 + 4) * 4);
  CHECK(KvCache(layer, 1, 8, DType::int8).bytes_per_token() == 14 + 4);
  CHECK(latent.keys().shape == Shape4{1, 1, 8, 14});
  CHECK(latent.values().shape == Shape4{1, 1, 8, 10});
  CHECK(latent.values().data == latent.keys().data);
  {
    MhaConfig plain{.d_model = kD, .heads = kH};
    const MultiHeadAttention other(plain, MhaWeights<float>{std::vector<float>(kD * kD), std::vector<float>(kD * kD),
                                                            std::vector<float>(kD * kD), std::vector<float>(kD * kD), {}, {}, {}, {}});
    CHECK(KvCache(other, 1, 8).bytes_per_token() == 2 * kD * 4);
    KvCache mine(other, 1, 8), theirs(layer, 1, 8);
    KvPool plain_pool(other, 8, 4), latent_pool(layer, 8, 4);
    const KvPool::Sequence ps = plain_pool.add(), ls = latent_pool.add();
    std::vector<float> q1(static_cast<std::size_t>(kD)), r1(q1.size());
    const PoolStep to_plain{ConstSeqView(q1.data(), 1, 1, kD), ps, SeqView(r1.data(), 1, 1, kD)};
    const PoolStep to_latent{ConstSeqView(q1.data(), 1, 1, kD), ls, SeqView(r1.data(), 1, 1, kD)};
    check_error([&] { layer.forward_pool({&to_plain, 1}, plain_pool); }, "pool");
    check_error([&] { other.forward_pool({&to_latent, 1}, latent_pool); }, "pool");
    CHECK(plain_pool.length(ps) == 0);
    std::vector<float> q(static_cast<std::size_t>(kD)), r(q.size());
    check_error([&] { other.forward(ConstSeqView(q.data(), 1, 1, kD), theirs, SeqView(r.data(), 1, 1, kD)); }, "cache");
    check_error([&] { layer.forward(ConstSeqView(q.data(), 1, 1, kD), mine, SeqView(r.data(), 1, 1, kD)); }, "cache");
  }
  std::vector<float> x(static_cast<std::size_t>(2 * kD)), y(x.size());
  check_error([&] { layer.forward(ConstSeqView(x.data(), 1, 2, kD), ConstSeqView(x.data(), 1, 2, kD), ConstSeqView(x.data(), 1, 2, kD),
                                  SeqView(y.data(), 1, 2, kD)); },
              "layer");
  {  // forward_batch: each step over its latent cache as forward does it; a bad step named, nothing changed
    KvCache c1(layer, 1, 8), c2(layer, 1, 8), c3(layer, 1, 8);
    std::vector<float> y1(x.size()), y2(x.size()), want(x.size());
    layer.forward(ConstSeqView(x.data(), 1, 2, kD), c3, SeqView(want.data(), 1, 2, kD));
    std::vector<DecodeStep> steps = {{ConstSeqView(x.data(), 1, 2, kD), &c1, SeqView(y1.data(), 1, 2, kD)},
                                     {ConstSeqView(x.data(), 1, 1, kD), &c2, SeqView(y2.data(), 1, 1, kD)}};
    layer.forward_batch(steps);
    CHECK(y1 == want);
    CHECK(c1.lengths()[0] == 2);
    CHECK(c2.lengths()[0] == 1);
    steps[1].out = SeqView(y2.data(), 1, 2, kD);  // the wrong shape
    check_error([&] { layer.forward_batch(steps); }, "steps[1].out");
    CHECK(c1.lengths()[0] == 2);  // unchanged
  }
  MhaOptions o;
  std::vector<float> weights(static_cast<std::size_t>(kH * 4));
  o.attn_weights = TensorView(weights.data(), {1, kH, 2, 2});
  check_error([&] { layer.forward(ConstSeqView(x.data(), 1, 2, kD), SeqView(y.data(), 1, 2, kD), o); }, "options.attn_weights");
}

TEST_CASE("MLA layer: steps over the latent cache (absorbed form) equal the whole sequence's forward (expanded)") {
  for (const std::int64_t q_lora : {0, 8})
    for (const DType cache_dtype : {DType::f32, DType::bf16, DType::int8}) {
      INFO("q_lora_rank ", q_lora, ", cache ", dtype_name(cache_dtype));
      const MhaConfig c = mla_config(q_lora);
      const MultiHeadAttention layer(c, mla_weights<float>(c, 13));
      const std::int64_t B = 2, S = 10;
      std::mt19937_64 rng(21);
      std::normal_distribution<float> n;
      std::vector<float> x(static_cast<std::size_t>(B * S * kD)), full(x.size());
      for (float& e : x) e = n(rng);
      layer.forward(ConstSeqView(x.data(), B, S, kD), SeqView(full.data(), B, S, kD));
      KvCache cache(layer, B, 12, cache_dtype);
      const double tol = cache_dtype == DType::f32 ? 1e-4 : 6e-2;
      double scale = 1.0;
      for (float e : full) scale = std::max(scale, double(std::abs(e)));
      std::int64_t at = 0;
      for (const std::int64_t t : {4, 1, 3, 2}) {
        std::vector<float> step(static_cast<std::size_t>(B * t * kD)), got(step.size());
        for (std::int64_t b = 0; b < B; ++b)
          std::copy_n(x.begin() + (b * S + at) * kD, t * kD, step.begin() + b * t * kD);
        layer.forward(ConstSeqView(step.data(), B, t, kD), cache, SeqView(got.data(), B, t, kD));
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t i = 0; i < t * kD; ++i)
            CHECK(std::abs(got[static_cast<std::size_t>(b * t * kD + i)] - full[static_cast<std::size_t>((b * S + at) * kD + i)]) <=
                  tol * scale);
        at += t;
      }
      CHECK(cache.lengths()[0] == S);
      std::vector<float> more(static_cast<std::size_t>(B * 3 * kD)), out(more.size());
      test::check_error([&] { layer.forward(ConstSeqView(more.data(), B, 3, kD), cache, SeqView(out.data(), B, 3, kD)); }, "cache");
      CHECK(cache.lengths()[0] == S);  // unchanged
    }
}

TEST_CASE("MLA layer: a pool of latent rows (batched steps, a fork, accepted drafts) equals the prefill") {
  for (const DType pool_dtype : {DType::f32, DType::int8}) {
    INFO("pool ", dtype_name(pool_dtype));
    const MhaConfig c = mla_config(8);
    const MultiHeadAttention layer(c, mla_weights<float>(c, 17));
    KvPool pool(layer, 24, 4, 1, pool_dtype);
    CHECK(pool.bytes_per_token() == (pool_dtype == DType::f32 ? 14 * 4 : 14 + 4));
    CHECK(pool.keys(0).shape[3] == 14);
    CHECK(pool.values(0).shape[3] == 10);
    const std::int64_t S = 9;
    std::mt19937_64 rng(31);
    std::normal_distribution<float> n;
    std::vector<float> x(static_cast<std::size_t>(2 * S * kD)), full(x.size());
    for (float& e : x) e = n(rng);
    layer.forward(ConstSeqView(x.data(), 2, S, kD), SeqView(full.data(), 2, S, kD));
    double scale = 1.0;
    for (float e : full) scale = std::max(scale, double(std::abs(e)));
    const double tol = (pool_dtype == DType::f32 ? 1e-4 : 6e-2) * scale;
    const KvPool::Sequence a = pool.add(), b = pool.add();
    std::int64_t at = 0;
    for (const std::int64_t t : {5, 1, 3}) {
      std::vector<float> ya(static_cast<std::size_t>(t * kD)), yb(ya.size());
      const std::vector<PoolStep> steps = {
          {ConstSeqView(x.data() + at * kD, 1, t, kD), a, SeqView(ya.data(), 1, t, kD)},
          {ConstSeqView(x.data() + (S + at) * kD, 1, t, kD), b, SeqView(yb.data(), 1, t, kD)}};
      layer.forward_pool(steps, pool);
      for (std::int64_t i = 0; i < t * kD; ++i) {
        CHECK(std::abs(ya[static_cast<std::size_t>(i)] - full[static_cast<std::size_t>(at * kD + i)]) <= tol);
        CHECK(std::abs(yb[static_cast<std::size_t>(i)] - full[static_cast<std::size_t>((S + at) * kD + i)]) <= tol);
      }
      at += t;
    }
    // a fork of a with two drafts as a tree (siblings), the second accepted: as a causal step of it
    const KvPool::Sequence f = pool.fork(a);
    std::vector<float> d(static_cast<std::size_t>(2 * kD)), yd(d.size());
    for (float& e : d) e = n(rng);
    const std::vector<std::uint8_t> tree = {1, 0, 0, 1};
    const std::vector<std::int64_t> pos = {S, S};
    PoolStep drafts{ConstSeqView(d.data(), 1, 2, kD), f, SeqView(yd.data(), 1, 2, kD), pos};
    drafts.tree_mask = tree;
    layer.forward_pool({&drafts, 1}, pool);
    const std::vector<std::int64_t> kept = {1};
    pool.accept(f, S, kept);
    std::vector<float> x2(static_cast<std::size_t>((S + 1) * kD)), y2(x2.size());
    std::copy_n(x.begin(), S * kD, x2.begin());
    std::copy_n(d.begin() + kD, kD, x2.begin() + S * kD);
    layer.forward(ConstSeqView(x2.data(), 1, S + 1, kD), SeqView(y2.data(), 1, S + 1, kD));
    for (std::int64_t i = 0; i < kD; ++i)
      CHECK(std::abs(yd[static_cast<std::size_t>(kD + i)] - y2[static_cast<std::size_t>(S * kD + i)]) <= tol);
    CHECK(pool.length(f) == S + 1);
    CHECK(pool.length(a) == S);
    for (const KvPool::Sequence s : {a, b, f}) pool.release(s);
    CHECK(pool.free_blocks() == pool.num_blocks());
  }
}

TEST_CASE("MLA layer: chunks of kMlaExpandedMinTokens or more run the expanded form over the cache, mixed with decode steps in one batch") {
  for (const DType dtype : {DType::f32, DType::int8}) {
    INFO("store ", dtype_name(dtype));
    const MhaConfig c = mla_config(8);
    const MultiHeadAttention layer(c, mla_weights<float>(c, 19));
    const std::int64_t S = 2 * detail::kMlaExpandedMinTokens + 40, E = detail::kMlaExpandedMinTokens;
    std::mt19937_64 rng(37);
    std::normal_distribution<float> n;
    std::vector<float> x(static_cast<std::size_t>(2 * S * kD)), full(x.size());
    for (float& e : x) e = n(rng);
    layer.forward(ConstSeqView(x.data(), 2, S, kD), SeqView(full.data(), 2, S, kD));
    double scale = 1.0;
    for (float e : full) scale = std::max(scale, double(std::abs(e)));
    const double tol = (dtype == DType::f32 ? 1e-4 : 6e-2) * scale;
    // a KvCache: E + 6 tokens (expanded), 1 (absorbed), the rest (expanded)
    KvCache cache(layer, 1, S, dtype);
    std::int64_t at = 0;
    for (const std::int64_t t : {E + 6, std::int64_t{1}, S - E - 7}) {
      std::vector<float> y(static_cast<std::size_t>(t * kD));
      layer.forward(ConstSeqView(x.data() + at * kD, 1, t, kD), cache, SeqView(y.data(), 1, t, kD));
      for (std::int64_t i = 0; i < t * kD; ++i) CHECK(std::abs(y[static_cast<std::size_t>(i)] - full[static_cast<std::size_t>(at * kD + i)]) <= tol);
      at += t;
    }
    // a pool batch: sequence a's chunk of E + 20 tokens (expanded) beside b's decode steps (absorbed)
    KvPool pool(layer, 2 * S / 4 + 8, 4, 1, dtype);
    const KvPool::Sequence a = pool.add(), b = pool.add();
    const std::int64_t chunk = E + 20;
    std::vector<float> ya(static_cast<std::size_t>(chunk * kD)), yb(static_cast<std::size_t>(kD));
    for (std::int64_t step = 0; step < 2; ++step) {
      const std::int64_t ta = step == 0 ? chunk : 1;
      const std::vector<PoolStep> steps = {
          {ConstSeqView(x.data() + (step == 0 ? 0 : chunk) * kD, 1, ta, kD), a, SeqView(ya.data(), 1, ta, kD)},
          {ConstSeqView(x.data() + (S + step) * kD, 1, 1, kD), b, SeqView(yb.data(), 1, 1, kD)}};
      layer.forward_pool(steps, pool);
      const std::int64_t a0 = step == 0 ? 0 : chunk;
      for (std::int64_t i = 0; i < ta * kD; ++i) CHECK(std::abs(ya[static_cast<std::size_t>(i)] - full[static_cast<std::size_t>(a0 * kD + i)]) <= tol);
      for (std::int64_t i = 0; i < kD; ++i) CHECK(std::abs(yb[static_cast<std::size_t>(i)] - full[static_cast<std::size_t>((S + step) * kD + i)]) <= tol);
    }
  }
}
