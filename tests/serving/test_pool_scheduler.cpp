// PoolScheduler: request threads' prompts (cut into chunks) and decode steps against each stream
// run alone through a KvCache; a shared prefix forked by many requests and stored once; a bad
// step, a cancelled step and a pool too small for a request reach only that request.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t kD = test::kServingD;
using test::check_error;

MultiHeadAttention random_layer(std::mt19937_64& rng) { return test::serving_layer(rng); }
std::vector<float> tokens(std::mt19937_64& rng, std::int64_t n) { return test::serving_tokens(rng, n); }

// |a - b| <= 1e-4 * max(1, |b|): chunks of other sizes run GEMMs and key splits of other shapes.
bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= 1e-4f * std::max(1.f, std::abs(b[i])))) return false;
  return true;
}

PoolStep step_of(KvPool::Sequence s, const std::vector<float>& x, std::vector<float>& y) {
  const auto t = static_cast<std::int64_t>(x.size()) / kD;
  return {ConstSeqView(x.data(), 1, t, kD), s, SeqView(y.data(), 1, t, kD)};
}

}  // namespace

TEST_CASE("PoolScheduler: prompts in chunks beside decode steps equal each stream alone") {
  std::mt19937_64 rng(test::base_seed() + 70);
  const MultiHeadAttention layer = random_layer(rng);
  KvPool pool(layer, 256, 8);
  PoolSchedulerOptions o;
  o.token_budget = 24;  // a prompt of 100 takes several batches
  PoolScheduler sched(layer, pool, o);
  constexpr int kStreams = 6, kDecode = 8;
  const std::int64_t prompt_len[kStreams] = {100, 1, 37, 5, 64, 12};
  std::vector<std::vector<float>> inputs(kStreams);
  for (int s = 0; s < kStreams; ++s) inputs[static_cast<std::size_t>(s)] = tokens(rng, prompt_len[s] + kDecode);
  std::vector<int> ok(kStreams, 0);
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s)
    threads.emplace_back([&, s] {
      const auto& x = inputs[static_cast<std::size_t>(s)];
      KvCache cache(layer, 1, 256);
      const KvPool::Sequence seq = sched.open();
      bool all = true;
      std::int64_t at = 0;
      for (int k = 0; k <= kDecode; ++k) {
        const std::int64_t t = k == 0 ? prompt_len[s] : 1;
        const std::vector<float> in(x.begin() + at * kD, x.begin() + (at + t) * kD);
        std::vector<float> y(in.size()), want(in.size());
        all = all && sched.step(step_of(seq, in, y));
        layer.forward(ConstSeqView(in.data(), 1, t, kD), cache, SeqView(want.data(), 1, t, kD));
        all = all && close(y, want) && sched.length(seq) == at + t;
        at += t;
      }
      sched.close(seq);
      ok[static_cast<std::size_t>(s)] = all;
    });
  for (auto& t : threads) t.join();
  for (int s = 0; s < kStreams; ++s) CHECK(ok[static_cast<std::size_t>(s)] == 1);
  CHECK(sched.free_blocks() == pool.num_blocks());
  CHECK(sched.tokens_run() == static_cast<std::size_t>(100 + 1 + 37 + 5 + 64 + 12 + kStreams * kDecode));
  CHECK(sched.batches() >= 100 / 24);
}

TEST_CASE("PoolScheduler: requests forked from a shared prefix store its blocks once") {
  std::mt19937_64 rng(test::base_seed() + 71);
  const MultiHeadAttention layer = random_layer(rng);
  KvPool pool(layer, 128, 8);
  PoolScheduler sched(layer, pool);
  const auto prefix_x = tokens(rng, 40);  // 5 full blocks
  std::vector<float> prefix_y(prefix_x.size());
  const KvPool::Sequence prefix = sched.open();
  REQUIRE(sched.step(step_of(prefix, prefix_x, prefix_y)));
  const std::int64_t after_prefix = sched.free_blocks();
  CHECK(after_prefix == 128 - 5);
  constexpr int kForks = 8;
  std::vector<KvPool::Sequence> seqs;
  for (int i = 0; i < kForks; ++i) seqs.push_back(sched.open(prefix));
  CHECK(sched.free_blocks() == after_prefix);  // nothing copied yet
  std::vector<int> ok(kForks, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kForks; ++i)
    threads.emplace_back([&, i, x = tokens(rng, 3)] {
      KvCache cache(layer, 1, 64);
      std::vector<float> y(x.size()), want(x.size()), p(prefix_y.size());
      layer.forward(ConstSeqView(prefix_x.data(), 1, 40, kD), cache, SeqView(p.data(), 1, 40, kD));
      const bool ran = sched.step(step_of(seqs[static_cast<std::size_t>(i)], x, y));
      layer.forward(ConstSeqView(x.data(), 1, 3, kD), cache, SeqView(want.data(), 1, 3, kD));
      ok[static_cast<std::size_t>(i)] = ran && close(y, want);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kForks; ++i) CHECK(ok[static_cast<std::size_t>(i)] == 1);
  CHECK(sched.free_blocks() == after_prefix - kForks);  // one new block each; the prefix's 5 shared
  for (auto s : seqs) sched.close(s);
  sched.close(prefix);
  CHECK(sched.free_blocks() == 128);
}

TEST_CASE("PoolScheduler: a bad step, a cancelled step and a pool too small reach only their request") {
  std::mt19937_64 rng(test::base_seed() + 72);
  const MultiHeadAttention layer = random_layer(rng);
  KvPool pool(layer, 6, 4);  // 24 tokens
  PoolScheduler sched(layer, pool);
  const KvPool::Sequence a = sched.open(), b = sched.open();
  const auto x = tokens(rng, 12);
  std::vector<float> y(x.size());
  PoolStep bad = step_of(a, x, y);
  bad.query.E = kD - 1;
  check_error([&] { sched.step(bad); }, "query");
  std::stop_source stopped;
  stopped.request_stop();
  CHECK(!sched.step(step_of(a, x, y), stopped.get_token()));
  CHECK(sched.length(a) == 0);
  REQUIRE(sched.step(step_of(a, x, y)));  // 3 blocks
  const auto big = tokens(rng, 16);       // 4 more blocks: 3 are free
  std::vector<float> big_y(big.size());
  check_error([&] { sched.step(step_of(b, big, big_y)); }, "pool");
  CHECK(sched.length(b) == 0);  // the 12 tokens that fit ran; then the sequence went back
  CHECK(sched.free_blocks() == 3);
  const auto one = tokens(rng, 1);
  std::vector<float> one_y(one.size());
  CHECK(sched.step(step_of(a, one, one_y)));  // a goes on
  CHECK(sched.length(a) == 13);
  check_error([&] { sched.step(step_of(99, one, one_y)); }, "sequence");
  sched.close(a);
  sched.close(b);
  CHECK(sched.free_blocks() == 6);
  check_error([&] { PoolScheduler(layer, pool, PoolSchedulerOptions{.token_budget = 0}); }, "options.token_budget");
}
