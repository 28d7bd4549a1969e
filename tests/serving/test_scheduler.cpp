// Batched decode across requests: MultiHeadAttention::forward_batch against the same steps run
// one by one, and DecodeScheduler with many request threads, streams joining and leaving,
// errors and cancellation.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
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

MultiHeadAttention random_layer(std::mt19937_64& rng, bool rope = true) { return test::serving_layer(rng, rope); }
std::vector<float> tokens(std::mt19937_64& rng, std::int64_t n) { return test::serving_tokens(rng, n); }

// |a - b| <= 1e-5 * max(1, |b|) everywhere (a GEMM of another shape sums in another order).
bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= 1e-5f * std::max(1.f, std::abs(b[i])))) return false;
  return true;
}

}  // namespace

TEST_CASE("forward_batch equals each step run alone (streams of different lengths, batch sizes and token counts)") {
  std::mt19937_64 rng(test::base_seed() + 61);
  const MultiHeadAttention layer = random_layer(rng);
  // Five requests: caches of 1 or 2 sequences, prompts of different lengths, steps of 1 or 3 tokens.
  const std::int64_t batch[5] = {1, 2, 1, 1, 2}, prompt[5] = {3, 7, 1, 12, 5}, step_tokens[5] = {1, 1, 3, 1, 3};
  std::vector<KvCache> a, b;  // the batched run's caches and the one-by-one run's
  for (int i = 0; i < 5; ++i) {
    a.emplace_back(layer, batch[i], 32);
    b.emplace_back(layer, batch[i], 32);
    const std::vector<float> x = tokens(rng, batch[i] * prompt[i]);
    std::vector<float> y(x.size());
    layer.forward(ConstSeqView(x.data(), batch[i], prompt[i], kD), a.back(), SeqView(y.data(), batch[i], prompt[i], kD));
    layer.forward(ConstSeqView(x.data(), batch[i], prompt[i], kD), b.back(), SeqView(y.data(), batch[i], prompt[i], kD));
  }
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    std::vector<std::vector<float>> x(5), ya(5), yb(5);
    std::vector<DecodeStep> steps;
    for (int i = 0; i < 5; ++i) {
      x[i] = tokens(rng, batch[i] * step_tokens[i]);
      ya[i].assign(x[i].size(), -7.f);
      yb[i].assign(x[i].size(), 0.f);
      steps.push_back({ConstSeqView(x[i].data(), batch[i], step_tokens[i], kD), &a[i],
                       SeqView(ya[i].data(), batch[i], step_tokens[i], kD)});
    }
    // Round 2: request 1 leaves (not in the batch); round 3: it is back.
    if (round == 2) steps.erase(steps.begin() + 1);
    layer.forward_batch(steps);
    for (int i = 0; i < 5; ++i) {
      if (round == 2 && i == 1) continue;
      layer.forward(ConstSeqView(x[i].data(), batch[i], step_tokens[i], kD), b[i],
                    SeqView(yb[i].data(), batch[i], step_tokens[i], kD));
      CAPTURE(i);
      CHECK(close(ya[i], yb[i]));
      CHECK(std::equal(a[i].lengths().begin(), a[i].lengths().end(), b[i].lengths().begin(), b[i].lengths().end()));
    }
    if (round == 2) CHECK(a[1].lengths()[0] == b[1].lengths()[0]);  // untouched while away
  }
}

TEST_CASE("forward_batch: a bad step is named and nothing changes") {
  std::mt19937_64 rng(test::base_seed() + 62);
  const MultiHeadAttention layer = random_layer(rng);
  KvCache c0(layer, 1, 8), c1(layer, 1, 2), c2(layer, 1, 8);
  const std::vector<float> x1 = tokens(rng, 1), x3 = tokens(rng, 3);
  std::vector<float> y0(x1.size(), -7.f), y1(x3.size(), -7.f), y2(x1.size(), -7.f);
  auto step = [&](const std::vector<float>& x, KvCache* c, std::vector<float>& y) {
    const std::int64_t T = static_cast<std::int64_t>(x.size()) / kD;
    return DecodeStep{ConstSeqView(x.data(), 1, T, kD), c, SeqView(y.data(), 1, T, kD)};
  };
  auto untouched = [&] {
    return c0.lengths()[0] == 0 && c1.lengths()[0] == 0 && c2.lengths()[0] == 0 &&
           std::all_of(y0.begin(), y0.end(), [](float v) { return v == -7.f; }) &&
           std::all_of(y2.begin(), y2.end(), [](float v) { return v == -7.f; });
  };
  SUBCASE("capacity") {  // 3 tokens into a cache of 2
    const std::vector<DecodeStep> steps{step(x1, &c0, y0), step(x3, &c1, y1), step(x1, &c2, y2)};
    check_error([&] { layer.forward_batch(steps); }, "steps[1].cache");
  }
  SUBCASE("one cache twice") {
    const std::vector<DecodeStep> steps{step(x1, &c0, y0), step(x1, &c2, y2), step(x1, &c0, y1)};
    check_error([&] { layer.forward_batch(steps); }, "steps[2].cache");
  }
  SUBCASE("a query of another width") {
    const std::vector<float> wide(2 * kD, 0.f);
    std::vector<DecodeStep> steps{step(x1, &c0, y0), step(x1, &c2, y2)};
    steps[1].query = ConstSeqView(wide.data(), 1, 1, 2 * kD);
    check_error([&] { layer.forward_batch(steps); }, "steps[1].query");
  }
  SUBCASE("a cache of another layer") {
    MhaWeights<float> w;
    w.wq = w.wk = w.wv = w.wo = std::vector<float>(64, 0.f);
    const MultiHeadAttention small(MhaConfig{.d_model = 8, .heads = 2}, w);
    KvCache foreign(small, 1, 8);
    const std::vector<DecodeStep> steps{step(x1, &c0, y0), step(x1, &foreign, y2)};
    check_error([&] { layer.forward_batch(steps); }, "steps[1].cache");
  }
  CHECK(untouched());
}

TEST_CASE("DecodeScheduler: concurrent streams joining and leaving get their own outputs") {
  std::mt19937_64 rng(test::base_seed() + 63);
  const MultiHeadAttention layer = random_layer(rng);
  constexpr int kStreams = 8;
  // Stream s: a prompt of 2 + s tokens, then 4 + 2 s single-token steps; streams start at
  // different times (so they join running batches and leave at different steps).
  struct Stream {
    std::vector<float> prompt, steps, expected, got;
    std::int64_t P, G;
  };
  std::vector<Stream> st(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    Stream& t = st[s];
    t.P = 2 + s, t.G = 4 + 2 * s;
    t.prompt = tokens(rng, t.P);
    t.steps = tokens(rng, t.G);
    // Expected: the stream alone, step by step.
    KvCache c(layer, 1, 64);
    std::vector<float> y(t.prompt.size());
    layer.forward(ConstSeqView(t.prompt.data(), 1, t.P, kD), c, SeqView(y.data(), 1, t.P, kD));
    t.expected.resize(t.steps.size());
    for (std::int64_t g = 0; g < t.G; ++g)
      layer.forward(ConstSeqView(t.steps.data() + g * kD, 1, 1, kD), c, SeqView(t.expected.data() + g * kD, 1, 1, kD));
    t.got.assign(t.steps.size(), 0.f);
  }
  DecodeScheduler scheduler(layer, {.max_wait = std::chrono::microseconds(300)});
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int s = 0; s < kStreams; ++s)
    threads.emplace_back([&, s] {
      Stream& t = st[s];
      std::this_thread::sleep_for(std::chrono::microseconds(200 * (s % 3)));
      KvCache c(layer, 1, 64);
      std::vector<float> y(t.prompt.size());
      // The prompt goes through the scheduler too (a 1-sequence step of P tokens).
      const DecodeStep prefill{ConstSeqView(t.prompt.data(), 1, t.P, kD), &c, SeqView(y.data(), 1, t.P, kD)};
      if (!scheduler.step(prefill)) ++failures;
      for (std::int64_t g = 0; g < t.G; ++g) {
        const DecodeStep step{ConstSeqView(t.steps.data() + g * kD, 1, 1, kD), &c,
                              SeqView(t.got.data() + g * kD, 1, 1, kD)};
        if (!scheduler.step(step)) ++failures;
      }
      if (c.lengths()[0] != t.P + t.G) ++failures;
    });
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  for (int s = 0; s < kStreams; ++s) {
    CAPTURE(s);
    CHECK(close(st[s].got, st[s].expected));
  }
  std::size_t total = 0;
  for (const Stream& t : st) total += static_cast<std::size_t>(t.G + 1);
  CHECK(scheduler.steps_run() == total);
  CHECK(scheduler.batches() <= total);
  MESSAGE(scheduler.steps_run(), " steps in ", scheduler.batches(), " batches");
}

TEST_CASE("DecodeScheduler: a bad request fails alone, cancellation leaves the cache as it was") {
  std::mt19937_64 rng(test::base_seed() + 64);
  const MultiHeadAttention layer = random_layer(rng);
  DecodeScheduler scheduler(layer);
  KvCache c(layer, 1, 4);
  const std::vector<float> x = tokens(rng, 3);
  std::vector<float> y(x.size(), -7.f);
  SUBCASE("bad requests") {
    const std::vector<float> wide(2 * kD, 0.f);
    check_error([&] { scheduler.step({ConstSeqView(wide.data(), 1, 1, 2 * kD), &c, SeqView(y.data(), 1, 1, kD)}); },
                      "query");
    check_error([&] { scheduler.step({ConstSeqView(x.data(), 1, 1, kD), nullptr, SeqView(y.data(), 1, 1, kD)}); },
                      "cache");
    CHECK(scheduler.step({ConstSeqView(x.data(), 1, 3, kD), &c, SeqView(y.data(), 1, 3, kD)}));
    CHECK(c.lengths()[0] == 3);
    check_error([&] { scheduler.step({ConstSeqView(x.data(), 1, 2, kD), &c, SeqView(y.data(), 1, 2, kD)}); },
                      "cache");  // 3 + 2 > 4
    CHECK(c.lengths()[0] == 3);
  }
  SUBCASE("cancelled before it runs") {
    std::stop_source stop;
    stop.request_stop();
    CHECK_FALSE(scheduler.step({ConstSeqView(x.data(), 1, 1, kD), &c, SeqView(y.data(), 1, 1, kD)}, stop.get_token()));
    CHECK(c.lengths()[0] == 0);
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.f; }));
    CHECK(scheduler.steps_run() == 0);
  }
  SUBCASE("options") {
    check_error([&] { DecodeScheduler s(layer, {.max_batch = 0}); }, "options.max_batch");
    check_error([&] { DecodeScheduler s(layer, {.max_wait = std::chrono::microseconds(-1)}); }, "options.max_wait");
  }
}

TEST_CASE("DecodeScheduler: requests cancelled at random either ran whole or left no trace") {
  std::mt19937_64 rng(test::base_seed() + 65);
  const MultiHeadAttention layer = random_layer(rng, false);
  DecodeScheduler scheduler(layer, {.max_wait = std::chrono::microseconds(2000)});
  constexpr int kStreams = 6, kSteps = 30;
  std::atomic<int> inconsistent{0}, ran{0}, cancelled{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s)
    threads.emplace_back([&, s] {
      std::mt19937_64 r(test::base_seed() + 100 + static_cast<std::uint64_t>(s));
      KvCache c(layer, 1, kSteps);
      const std::vector<float> x = tokens(r, 1);
      for (int i = 0; i < kSteps; ++i) {
        std::vector<float> y(x.size(), -7.f);
        std::stop_source stop;
        // Some requests are cancelled from another thread after a random short delay.
        std::thread canceller;
        if (r() % 3 == 0)
          canceller = std::thread([&stop, d = r() % 400] {
            std::this_thread::sleep_for(std::chrono::microseconds(d));
            stop.request_stop();
          });
        const std::int64_t before = c.lengths()[0];
        const bool done = scheduler.step({ConstSeqView(x.data(), 1, 1, kD), &c, SeqView(y.data(), 1, 1, kD)},
                                         stop.get_token());
        if (canceller.joinable()) canceller.join();
        const bool written = std::none_of(y.begin(), y.end(), [](float v) { return v == -7.f; });
        if (done ? (c.lengths()[0] != before + 1 || !written) : (c.lengths()[0] != before || written)) ++inconsistent;
        ++(done ? ran : cancelled);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(inconsistent == 0);
  CHECK(ran + cancelled == kStreams * kSteps);
  CHECK(scheduler.steps_run() == static_cast<std::size_t>(ran.load()));
  MESSAGE(ran.load(), " ran, ", cancelled.load(), " cancelled");
}

TEST_CASE("DecodeScheduler: a batch forming for a step that is then cancelled runs nothing and does not hold up the destructor") {
  std::mt19937_64 rng(test::base_seed() + 66);
  const MultiHeadAttention layer = random_layer(rng, false);
  constexpr std::int64_t kLong = 3000;  // a long prefill: the scheduler's thread is busy with it a while
  const std::vector<float> prompt = tokens(rng, kLong), x = tokens(rng, 1);
  // Two single steps submitted while the prefill runs make the next batch two steps, so a third
  // step alone waits for a second one (up to max_wait) before its batch runs. Returns false if the
  // two did not land in one batch (the timing of the threads decides), to try again.
  auto run = [&](std::chrono::microseconds max_wait, bool destroy_while_forming) {
    auto scheduler = std::make_unique<DecodeScheduler>(layer, DecodeSchedulerOptions{.max_wait = max_wait});
    KvCache big(layer, 1, kLong), a(layer, 1, 4), b(layer, 1, 4);
    std::vector<float> y_big(prompt.size()), ya(x.size()), yb(x.size());
    std::thread t0([&] { scheduler->step({ConstSeqView(prompt.data(), 1, kLong, kD), &big, SeqView(y_big.data(), 1, kLong, kD)}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::thread t1([&] { scheduler->step({ConstSeqView(x.data(), 1, 1, kD), &a, SeqView(ya.data(), 1, 1, kD)}); });
    std::thread t2([&] { scheduler->step({ConstSeqView(x.data(), 1, 1, kD), &b, SeqView(yb.data(), 1, 1, kD)}); });
    t0.join(), t1.join(), t2.join();
    if (scheduler->batches() != 2) return false;
    std::stop_source stop;
    std::vector<float> y(x.size(), -7.f);
    bool ran = false;
    std::thread t3([&] {
      ran = scheduler->step({ConstSeqView(x.data(), 1, 1, kD), &a, SeqView(y.data(), 1, 1, kD)}, stop.get_token());
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its batch is forming
    stop.request_stop();
    t3.join();
    // It ran at once: the batch before held the prefill and one step (the scheduler's thread took
    // the prefill late), not the two single steps.
    if (ran) return false;
    CHECK(a.lengths()[0] == 1);
    CHECK(y[0] == -7.f);
    if (destroy_while_forming) {
      const auto t = std::chrono::steady_clock::now();
      scheduler.reset();
      // (before the fix, it waited out the whole max_wait of 60 s)
      CHECK(std::chrono::steady_clock::now() - t < std::chrono::seconds(30));
    } else {
      std::this_thread::sleep_for(2 * max_wait);  // the forming wait ends with nothing pending
      CHECK(scheduler->batches() == 2);  // no empty batch ran
      CHECK(scheduler->steps_run() == 3);
    }
    return true;
  };
  for (bool destroy : {true, false}) {
    CAPTURE(destroy);
    bool done = false;
    for (int attempt = 0; attempt < 10 && !done; ++attempt)
      done = run(destroy ? std::chrono::microseconds(60'000'000) : std::chrono::microseconds(100'000), destroy);
    CHECK(done);
  }
}
