// Cascade attention in forward_pool (layer/cache/pool_core.hpp, docs/serving.md "Shared
// prefixes"): forks of one prompt in a batch attend the shared blocks once and merge their own
// keys in. Each fork's output equals, within its dtype's rounding, the same step of an unshared
// twin (a sequence fed the same rows, holding its own copy of the prompt, which the plain path
// serves): several groups in one batch, an unrelated sequence, a tree step, partial blocks,
// contexts 0-300, block sizes 1/16/32, f32/bf16/f16/int8/fp8 pools, softcap and sinks, GQA.
// Bitwise the same at 1, 2 and 3 threads. The rule (cascade_pays) at its bounds; never under a
// window or ALiBi or SIMDATTN_CASCADE=never.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "layer/cache/pool_core.hpp"
#include "support/test_util.hpp"

using namespace simdattn;
using detail::CascadeMode;

namespace {

constexpr std::int64_t kD = 48, kHeads = 6, kKvHeads = 2, kHd = kD / kHeads;

struct Modifiers {
  bool softcap = false, sinks = false;
};

MultiHeadAttention layer_of(std::mt19937_64& rng, Modifiers m) {
  std::normal_distribution<float> n(0.f, 0.2f);
  auto v = [&](std::int64_t k) {
    std::vector<float> x(static_cast<std::size_t>(k));
    for (auto& e : x) e = n(rng);
    return x;
  };
  const std::int64_t nkv = kHd * kKvHeads;
  MhaConfig c{.d_model = kD, .heads = kHeads, .kv_heads = kKvHeads};
  c.rope = RopeConfig{.theta = 10000.0};
  if (m.softcap) c.softcap = 2.0;
  if (m.sinks) c.sinks = {0.5f, -1.f, 2.f, 0.f, 1.5f, -0.5f};
  return MultiHeadAttention(c, MhaWeights<float>{v(kD * kD), v(nkv * kD), v(nkv * kD), v(kD * kD), v(kD), v(nkv), v(nkv), v(kD)});
}

std::vector<float> rows(std::mt19937_64& rng, std::int64_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(n * kD));
  for (auto& e : x) e = d(rng);
  return x;
}

// The process's cascade mode for one scope.
struct ModeScope {
  explicit ModeScope(CascadeMode m) { detail::set_cascade_mode(m); }
  ~ModeScope() { detail::set_cascade_mode(std::nullopt); }
};

void feed(const MultiHeadAttention& layer, KvPool& pool, KvPool::Sequence s, const std::vector<float>& x) {
  const std::int64_t n = static_cast<std::int64_t>(x.size()) / kD;
  if (n == 0) return;
  std::vector<float> y(x.size());
  const PoolStep step{ConstSeqView(x.data(), 1, n, kD), s, SeqView(y.data(), 1, n, kD)};
  layer.forward_pool({&step, 1}, pool);
}

// One batch's steps (sequence, rows, optional tree mask) through forward_pool; the outputs, and
// the pool truncated back to the lengths before.
std::vector<std::vector<float>> step(const MultiHeadAttention& layer, KvPool& pool, const std::vector<KvPool::Sequence>& seqs,
                                     const std::vector<std::vector<float>>& x, const std::vector<std::vector<std::uint8_t>>& trees,
                                     int threads) {
  std::vector<std::vector<float>> y(seqs.size());
  std::vector<std::vector<std::int64_t>> pos(seqs.size());
  std::vector<PoolStep> steps;
  std::vector<std::int64_t> before;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const std::int64_t n = static_cast<std::int64_t>(x[i].size()) / kD, at = pool.length(seqs[i]);
    before.push_back(at);
    y[i].assign(x[i].size(), 0.f);
    for (std::int64_t t = 0; t < n; ++t) pos[i].push_back(at + t);
    PoolStep s{ConstSeqView(x[i].data(), 1, n, kD), seqs[i], SeqView(y[i].data(), 1, n, kD), pos[i]};
    s.tree_mask = trees[i];
    steps.push_back(s);
  }
  MhaOptions o;
  o.threads = threads;
  layer.forward_pool(steps, pool, 0, o);
  for (std::size_t i = 0; i < seqs.size(); ++i) pool.truncate(seqs[i], before[i]);
  return y;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

// Two prompts (of ctx_a and ctx_b tokens) with forks (each with own tokens), an unrelated
// sequence, a tree step on one fork; the batch through the cascade (CascadeMode::always) against
// the same steps of unshared twins.
void cascade_equals_twins(DType pool_dtype, std::int64_t block_size, std::int64_t ctx_a, std::int64_t ctx_b, Modifiers m,
                          double tol, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const MultiHeadAttention layer = layer_of(rng, m);
  KvPool pool(layer, 4096 / block_size + 64, block_size, 1, pool_dtype);
  const std::vector<float> prompt_a = rows(rng, ctx_a), prompt_b = rows(rng, ctx_b);
  const KvPool::Sequence a = pool.add(), b = pool.add();
  feed(layer, pool, a, prompt_a);
  feed(layer, pool, b, prompt_b);
  // forks: (prompt, own tokens); the twins hold the same rows unshared
  const std::vector<std::pair<int, std::int64_t>> plan = {{0, 0}, {0, 7}, {0, 40}, {1, 3}, {1, 0}, {0, 16}};
  std::vector<KvPool::Sequence> forks, twins;
  for (const auto& [which, own] : plan) {
    const std::vector<float> mine = rows(rng, own);
    forks.push_back(pool.fork(which == 0 ? a : b));
    feed(layer, pool, forks.back(), mine);
    twins.push_back(pool.add());
    feed(layer, pool, twins.back(), which == 0 ? prompt_a : prompt_b);
    feed(layer, pool, twins.back(), mine);
  }
  const KvPool::Sequence lone = pool.add();
  feed(layer, pool, lone, rows(rng, 21));
  // the step: 1-5 tokens a fork (fork 2 a draft tree of 5), 2 for the lone sequence
  std::vector<std::vector<float>> x;
  std::vector<std::vector<std::uint8_t>> trees;
  for (std::size_t i = 0; i < forks.size(); ++i) {
    const std::int64_t n = i == 2 ? 5 : 1 + static_cast<std::int64_t>(rng() % 4);
    x.push_back(rows(rng, n));
    std::vector<std::uint8_t> tree;
    if (i == 2) tree = {1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1};  // 0; 1<-0; 2<-0; 3<-1; 4<-2
    trees.push_back(tree);
  }
  std::vector<KvPool::Sequence> batch = forks, twin_batch = twins;
  batch.push_back(lone), twin_batch.push_back(lone);
  x.push_back(rows(rng, 2)), trees.emplace_back();
  std::vector<std::vector<float>> got, want;
  {
    const ModeScope always(CascadeMode::always);
    got = step(layer, pool, batch, x, trees, 2);
    for (int threads : {1, 3}) CHECK(step(layer, pool, batch, x, trees, threads) == got);  // bitwise
  }
  {
    const ModeScope never(CascadeMode::never);
    want = step(layer, pool, twin_batch, x, trees, 2);
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    CHECK_MESSAGE(max_diff(got[i], want[i]) <= tol, "sequence " << i << " differs by " << max_diff(got[i], want[i]));
  }
  CHECK(pool.length(forks[1]) == ctx_a + 7);
}

}  // namespace

TEST_CASE("cascade: each fork's step equals its unshared twin's (f32 pools, block sizes 1, 16, 32)") {
  for (std::int64_t bs : {1, 16, 32})
    for (const auto& prompts : {std::pair<std::int64_t, std::int64_t>{300, 64}, {47, 33}, {16, 200}}) {
      const std::int64_t ca = prompts.first, cb = prompts.second;  // named: INFO captures them
      INFO("block size ", bs, ", prompts ", ca, " and ", cb);
      cascade_equals_twins(DType::f32, bs, ca, cb, {}, 2e-5, static_cast<std::uint64_t>(bs * 1000 + ca));
    }
}

TEST_CASE("cascade: softcap and sinks, and a prompt of no whole block (no cascade: the plain path)") {
  cascade_equals_twins(DType::f32, 16, 100, 70, {.softcap = true, .sinks = true}, 2e-5, 5);
  cascade_equals_twins(DType::f32, 16, 9, 0, {.softcap = false, .sinks = true}, 0.0, 6);  // nothing shared: bitwise
}

TEST_CASE("cascade: 16-bit and 8-bit pools within their rounding") {
  cascade_equals_twins(DType::bf16, 16, 130, 40, {.sinks = true}, 2e-2, 7);
  cascade_equals_twins(DType::f16, 16, 130, 40, {}, 3e-3, 8);
  cascade_equals_twins(DType::int8, 32, 130, 40, {}, 2e-5, 9);
  cascade_equals_twins(DType::fp8_e4m3, 16, 77, 40, {.softcap = true}, 2e-5, 10);
}

TEST_CASE("cascade_pays: two sequences, 256 shared keys, 4 tokens each on average, 16 MiB of shared rows") {
  using detail::cascade_pays;
  const ModeScope automatic(CascadeMode::automatic);
  const std::int64_t row = 8 * 2 * 128 * 4;  // f32, 8 kv heads, d 128: 8 KiB a key
  CHECK(cascade_pays(4, 512, 4, row));       // 4 x 512 x 8 KiB = 16 MiB
  CHECK_FALSE(cascade_pays(4, 511, 4, row));
  CHECK(cascade_pays(4, 512, 16, row));  // 4 tokens each
  CHECK_FALSE(cascade_pays(4, 512, 17, row));
  CHECK_FALSE(cascade_pays(1, 1 << 20, 1, row));  // one sequence shares nothing
  CHECK(cascade_pays(2, 1024, 2, row));
  CHECK_FALSE(cascade_pays(64, 255, 64, row));     // too few keys, whatever the bytes
  CHECK_FALSE(cascade_pays(4, 512, 4, row / 2));  // bf16: 8 MiB
  CHECK(cascade_pays(4, 1024, 4, row / 2));
  {
    const ModeScope always(CascadeMode::always);
    CHECK(cascade_pays(2, 1, 1, 1));
    CHECK_FALSE(cascade_pays(2, 1, 3, 1));  // more tokens than shared keys
    CHECK_FALSE(cascade_pays(1, 64, 1, 1));
  }
}
