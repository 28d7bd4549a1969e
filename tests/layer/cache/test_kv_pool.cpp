// The KV pool: sequences (add, fork, truncate, release) and their blocks' counts, running out of
// blocks without changing anything, MultiHeadAttention::forward_pool against the contiguous
// KvCache path step by step (decode steps and prefill chunks of mixed lengths in one batch, f32
// and bf16 layers, a pool of another dtype, several layers), and copy-on-write after a fork.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/serving_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t kD = 32, kHeads = 4, kKvHeads = 2, kHd = kD / kHeads;
using test::check_error;

template <class T>
MultiHeadAttention random_layer(std::mt19937_64& rng, bool qk_norm = false) {
  std::normal_distribution<double> n(0.0, 0.2);
  auto v = [&](std::int64_t k) {
    std::vector<T> x(static_cast<std::size_t>(k));
    for (auto& e : x) e = test::value<T>(n(rng));
    return x;
  };
  const std::int64_t nkv = kHd * kKvHeads;
  MhaConfig c{.d_model = kD, .heads = kHeads, .kv_heads = kKvHeads};
  c.rope = RopeConfig{.theta = 10000.0};
  if (qk_norm) c.q_norm.assign(kHd, 1.1f), c.k_norm.assign(kHd, 0.9f);
  return MultiHeadAttention(c, MhaWeights<T>{v(kD * kD), v(nkv * kD), v(nkv * kD), v(kD * kD), v(kD), v(nkv), v(nkv), v(kD)});
}

template <class T>
std::vector<T> tokens(std::mt19937_64& rng, std::int64_t n) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> x(static_cast<std::size_t>(n * kD));
  for (auto& e : x) e = test::value<T>(d(rng));
  return x;
}

template <class T>
double max_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(test::as_double(a[i]) - test::as_double(b[i])));
  return m;
}

// Runs the same steps through forward_pool (all sequences in one batch per round) and through
// one KvCache per sequence (each step alone): every round's outputs agree.
template <class T>
void pool_equals_cache(DType pool_dtype, std::int64_t block_size, double tol, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const MultiHeadAttention layer = random_layer<T>(rng, true);
  // rounds of (tokens per sequence): prefills of mixed lengths, a chunk, then decode steps; 0 skips
  const std::vector<std::vector<std::int64_t>> rounds = {
      {5, 40, 1, 0}, {1, 1, 33, 7}, {1, 0, 1, 1}, {1, 1, 1, 64}, {2, 1, 1, 1}};
  const std::size_t N = rounds[0].size();
  KvPool pool(layer, 256, block_size, 1, pool_dtype);
  std::vector<KvPool::Sequence> seqs;
  std::vector<KvCache> caches;
  for (std::size_t i = 0; i < N; ++i) {
    seqs.push_back(pool.add());
    caches.emplace_back(layer, 1, 256, pool_dtype);
  }
  for (const auto& round : rounds) {
    std::vector<std::vector<T>> x(N), y(N), want(N);
    std::vector<PoolStep> steps;
    for (std::size_t i = 0; i < N; ++i) {
      const std::int64_t t = round[i];
      x[i] = tokens<T>(rng, t);
      y[i].assign(x[i].size(), T{});
      want[i].assign(x[i].size(), T{});
      layer.forward(ConstSeqView(x[i].data(), 1, t, kD), caches[i], SeqView(want[i].data(), 1, t, kD));
      steps.push_back({ConstSeqView(x[i].data(), 1, t, kD), seqs[i], SeqView(y[i].data(), 1, t, kD)});
    }
    layer.forward_pool(steps, pool);
    for (std::size_t i = 0; i < N; ++i) {
      CAPTURE(i);
      CHECK(pool.length(seqs[i]) == caches[i].lengths()[0]);
      CHECK(max_diff(y[i], want[i]) <= tol);
    }
  }
  for (auto s : seqs) pool.release(s);
  CHECK(pool.free_blocks() == pool.num_blocks());
}

}  // namespace

TEST_CASE("KvPool: add, fork, truncate and release count every block once") {
  std::mt19937_64 rng(test::base_seed() + 60);
  const MultiHeadAttention layer = random_layer<float>(rng);
  KvPool pool(layer, 10, 4);
  CHECK(pool.dtype() == DType::f32);
  CHECK(pool.block_size() == 4);
  CHECK(pool.bytes() == 10 * 2 * kKvHeads * 4 * kHd * 4);
  const KvPool::Sequence a = pool.add();
  const auto x = tokens<float>(rng, 10);
  std::vector<float> y(x.size());
  const PoolStep step{ConstSeqView(x.data(), 1, 10, kD), a, SeqView(y.data(), 1, 10, kD)};
  layer.forward_pool({&step, 1}, pool);
  CHECK(pool.length(a) == 10);
  CHECK(pool.block_table(a).size() == 3);
  CHECK(pool.free_blocks() == 7);
  const KvPool::Sequence b = pool.fork(a);
  CHECK(pool.length(b) == 10);
  CHECK(pool.free_blocks() == 7);  // shared
  CHECK(std::equal(pool.block_table(a).begin(), pool.block_table(a).end(), pool.block_table(b).begin()));
  pool.truncate(b, 5);
  CHECK(pool.length(b) == 5);
  CHECK(pool.block_table(b).size() == 2);
  CHECK(pool.free_blocks() == 7);  // a still holds its third block
  pool.release(a);
  CHECK(pool.free_blocks() == 8);  // a's third block; the first two are b's
  CHECK(!pool.contains(a));
  check_error([&] { (void)pool.length(a); }, "sequence");
  check_error([&] { pool.fork(a); }, "parent");
  check_error([&] { pool.truncate(b, 6); }, "length");
  pool.release(b);
  CHECK(pool.free_blocks() == 10);
  CHECK(pool.sequences() == 0);
  check_error([&] { KvPool(layer, 0, 4); }, "num_blocks");
  check_error([&] { KvPool(layer, 4, 0); }, "block_size");
  check_error([&] { KvPool(layer, 4, 4, 0); }, "layers");
  check_error([&] { KvPool(layer, 4, 4, 1, DType::f64); }, "dtype");
  check_error([&] { (void)pool.keys(1); }, "layer");
}

TEST_CASE("KvPool: a batch that needs more blocks than are free is Error(\"pool\") and changes nothing") {
  std::mt19937_64 rng(test::base_seed() + 61);
  const MultiHeadAttention layer = random_layer<float>(rng);
  KvPool pool(layer, 4, 4);
  const KvPool::Sequence a = pool.add(), b = pool.add();
  const auto x = tokens<float>(rng, 13);
  std::vector<float> y(x.size(), 7.0f);
  std::vector<PoolStep> steps{{ConstSeqView(x.data(), 1, 13, kD), a, SeqView(y.data(), 1, 13, kD)},
                              {ConstSeqView(x.data(), 1, 2, kD), b, SeqView(y.data(), 1, 2, kD)}};
  check_error([&] { layer.forward_pool(steps, pool); }, "pool");  // 13 + 2 tokens need 4 + 1 blocks of 4
  CHECK(pool.free_blocks() == 4);
  CHECK(pool.length(a) == 0);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; }));
  // a fork's write into the shared last block needs a copy: counted too
  steps.resize(1);
  steps[0].query.S = 6, steps[0].out.S = 6;
  layer.forward_pool(steps, pool);  // a: 6 tokens, 2 blocks
  const KvPool::Sequence c = pool.fork(a);
  const auto z = tokens<float>(rng, 3);
  std::vector<float> w(z.size());
  const std::vector<PoolStep> grow{{ConstSeqView(z.data(), 1, 3, kD), c, SeqView(w.data(), 1, 3, kD)},
                                   {ConstSeqView(z.data(), 1, 3, kD), a, SeqView(w.data(), 1, 3, kD)}};
  // c: a copy of block 1 and a new block; a: block 1 is then its own, plus a new block: 3 > 2 free
  check_error([&] { layer.forward_pool(grow, pool); }, "pool");
  CHECK(pool.free_blocks() == 2);
  CHECK(pool.length(c) == 6);
  check_error([&] { layer.forward_pool(std::vector<PoolStep>{grow[0], grow[0]}, pool); }, "steps[1].sequence");
  check_error([&] { layer.forward_pool({&grow[0], 1}, pool, 1); }, "layer");
  PoolStep bad = grow[0];
  bad.query.B = 2;
  check_error([&] { layer.forward_pool({&bad, 1}, pool); }, "steps[0].query");
  bad = grow[0];
  bad.out.S = 2;
  check_error([&] { layer.forward_pool({&bad, 1}, pool); }, "steps[0].out");
  MhaOptions opt;
  opt.causal = Causal::top_left;
  check_error([&] { layer.forward_pool({&grow[0], 1}, pool, 0, opt); }, "options.causal");
  KvPool other(8, 4, 4, 4, 1, DType::f32);
  check_error([&] { layer.forward_pool({&grow[0], 1}, other); }, "pool");
}

TEST_CASE("forward_pool equals the KvCache path step by step (f32, block sizes 1, 4, 32)") {
  for (std::int64_t bs : {1, 4, 32}) {
    CAPTURE(bs);
    pool_equals_cache<float>(DType::f32, bs, 2e-5, test::base_seed() + 62);
  }
}

TEST_CASE("forward_pool: bf16 and f16 layers, and an f32 layer with a bf16 pool") {
  pool_equals_cache<bfloat16>(DType::bf16, 16, 3e-2, test::base_seed() + 63);
  pool_equals_cache<float16>(DType::f16, 16, 4e-3, test::base_seed() + 64);
  pool_equals_cache<float>(DType::bf16, 16, 3e-2, test::base_seed() + 65);  // both round the core's output to bf16
}

TEST_CASE("forward_pool: a write to a forked sequence never changes its parent") {
  std::mt19937_64 rng(test::base_seed() + 66);
  const MultiHeadAttention layer = random_layer<float>(rng);
  const auto prompt = tokens<float>(rng, 10), next = tokens<float>(rng, 1), other = tokens<float>(rng, 3);
  std::vector<float> y(prompt.size()), alone(kD), after(kD), w(other.size());
  auto step = [&](KvPool& pool, KvPool::Sequence s, const std::vector<float>& x, std::vector<float>& out) {
    const auto t = static_cast<std::int64_t>(x.size()) / kD;
    const PoolStep st{ConstSeqView(x.data(), 1, t, kD), s, SeqView(out.data(), 1, t, kD)};
    layer.forward_pool({&st, 1}, pool);
  };
  // the parent's next step alone
  KvPool lone(layer, 16, 4);
  const KvPool::Sequence p0 = lone.add();
  step(lone, p0, prompt, y);
  step(lone, p0, next, alone);
  // the same after a fork whose child writes into the shared, partly filled last block
  KvPool pool(layer, 16, 4);
  const KvPool::Sequence p = pool.add();
  step(pool, p, prompt, y);
  const std::vector<std::int32_t> before(pool.block_table(p).begin(), pool.block_table(p).end());
  const KvPool::Sequence c = pool.fork(p);
  step(pool, c, other, w);
  CHECK(std::equal(before.begin(), before.end(), pool.block_table(p).begin()));
  CHECK(pool.block_table(c)[2] != before[2]);  // its own copy of the third block
  CHECK(pool.block_table(c)[0] == before[0]);  // the full blocks still shared
  step(pool, p, next, after);
  CHECK(std::memcmp(after.data(), alone.data(), after.size() * sizeof(float)) == 0);
  // and the child sees the parent's prompt: its step equals a sequence that was given prompt + other
  KvPool fresh(layer, 16, 4);
  const KvPool::Sequence f = fresh.add();
  std::vector<float> w2(other.size());
  step(fresh, f, prompt, y);
  step(fresh, f, other, w2);
  CHECK(max_diff(w, w2) <= 1e-6);
}

TEST_CASE("KvPool with several layers: each layer's length grows with its own forward_pool") {
  std::mt19937_64 rng(test::base_seed() + 67);
  const MultiHeadAttention l0 = random_layer<float>(rng), l1 = random_layer<float>(rng);
  KvPool pool(l0, 8, 4, 2);
  KvCache c0(l0, 1, 32), c1(l1, 1, 32);
  const KvPool::Sequence s = pool.add();
  for (std::int64_t t : {6, 1, 1}) {
    const auto x = tokens<float>(rng, t);
    std::vector<float> h(x.size()), y(x.size()), hw(x.size()), yw(x.size());
    const PoolStep a{ConstSeqView(x.data(), 1, t, kD), s, SeqView(h.data(), 1, t, kD)};
    l0.forward_pool({&a, 1}, pool, 0);
    CHECK(pool.length(s, 0) == pool.length(s, 1) + t);
    const PoolStep b{ConstSeqView(h.data(), 1, t, kD), s, SeqView(y.data(), 1, t, kD)};
    l1.forward_pool({&b, 1}, pool, 1);
    CHECK(pool.length(s, 0) == pool.length(s, 1));
    l0.forward(ConstSeqView(x.data(), 1, t, kD), c0, SeqView(hw.data(), 1, t, kD));
    l1.forward(ConstSeqView(hw.data(), 1, t, kD), c1, SeqView(yw.data(), 1, t, kD));
    CHECK(max_diff(y, yw) <= 2e-5);
  }
}

// A sequence's K (kv 0) or V rows at one layer through the pool's views: [tokens][kv heads x head_dim].
std::vector<float> pool_rows(const KvPool& pool, KvPool::Sequence s, std::int64_t layer, int kv) {
  const ConstTensorView v = kv == 0 ? pool.keys(layer) : pool.values(layer);
  const auto table = pool.block_table(s);
  std::vector<float> out;
  for (std::int64_t t = 0; t < pool.length(s, layer); ++t)
    for (std::int64_t h = 0; h < pool.kv_heads(); ++h)
      for (std::int64_t d = 0; d < pool.head_dim(); ++d)
        out.push_back(static_cast<const float*>(v.data)[table[static_cast<std::size_t>(t / pool.block_size())] * v.strides[0] +
                                                        (t % pool.block_size()) * v.strides[1] + h * v.strides[2] + d * v.strides[3]]);
  return out;
}

TEST_CASE("KvPool::accept keeps the kept drafts in order in every layer, copies shared blocks, and names bad arguments") {
  std::mt19937_64 rng(test::base_seed() + 68);
  const MultiHeadAttention layer = random_layer<float>(rng);
  KvPool pool(layer, 16, 4, 2);
  const KvPool::Sequence s = pool.add();
  for (std::int64_t lay : {0, 1}) {
    const auto x = tokens<float>(rng, 11);
    std::vector<float> y(x.size());
    const PoolStep step{ConstSeqView(x.data(), 1, 11, kD), s, SeqView(y.data(), 1, 11, kD)};
    layer.forward_pool({&step, 1}, pool, lay);
  }
  const KvPool::Sequence fork = pool.fork(s);
  std::vector<std::vector<float>> before, fork_before;
  for (std::int64_t lay : {0, 1})
    for (int kv : {0, 1}) before.push_back(pool_rows(pool, s, lay, kv)), fork_before.push_back(pool_rows(pool, fork, lay, kv));
  const std::int64_t free_before = pool.free_blocks();
  const std::vector<std::int64_t> bad_order{2, 1}, out_of_range{7}, kept{0, 3, 6};
  check_error([&] { pool.accept(s, 4, bad_order); }, "kept");
  check_error([&] { pool.accept(s, 4, out_of_range); }, "kept");
  check_error([&] { pool.accept(s, 12, {}); }, "first");
  check_error([&] { pool.accept(fork + 5, 4, kept); }, "seq");
  CHECK(pool.length(s) == 11);
  CHECK(pool.free_blocks() == free_before);
  pool.accept(s, 4, kept);  // drafts 4 .. 10: keeps 4, 7 and 10
  CHECK(pool.length(s, 0) == 7);
  CHECK(pool.length(s, 1) == 7);
  const std::int64_t row = kKvHeads * kHd;
  int at = 0;
  for (std::int64_t lay : {0, 1})
    for (int kv : {0, 1}) {
      const std::vector<float> now = pool_rows(pool, s, lay, kv), &was = before[static_cast<std::size_t>(at)];
      CHECK(std::equal(now.begin(), now.begin() + 4 * row, was.begin()));
      for (std::size_t i = 0; i < kept.size(); ++i)
        CHECK(std::equal(now.begin() + (4 + static_cast<std::int64_t>(i)) * row, now.begin() + (5 + static_cast<std::int64_t>(i)) * row,
                         was.begin() + (4 + kept[i]) * row));
      CHECK(pool_rows(pool, fork, lay, kv) == fork_before[static_cast<std::size_t>(at)]);  // the fork never changes
      ++at;
    }
  pool.release(s);
  pool.release(fork);
  CHECK(pool.free_blocks() == pool.num_blocks());
}
