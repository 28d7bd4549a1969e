// Threading contract: results do not depend on the thread count, concurrent calls are safe and
// keep to the thread budget, and calls from inside a parallel region run on the calling thread
// (the last two seen through the workers each calling thread's team started, team.hpp).
#include <doctest/doctest.h>

#include <omp.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "simdattn/runtime.hpp"
#include "support/test_util.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"

using namespace simdattn;
using test::Buffer;

TEST_CASE("parallel_for covers every index exactly once, in balanced chunks") {
  for (std::int64_t n : {1, 2, 3, 7, 100, 1001}) {
    for (int threads : {1, 2, 3, 7}) {
      std::vector<int> hits(static_cast<std::size_t>(n), 0);
      detail::parallel_for(n, threads, 1, [&](std::int64_t b, std::int64_t e) {
        CHECK(e - b <= (n + threads - 1) / threads);
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)] += 1;
      });
      for (int h : hits) CHECK(h == 1);
    }
  }
}

TEST_CASE("native output is bitwise identical for 1, 2, 3 and 7 threads" * doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 20);
  // Small, multi-block (several query and key blocks, causal work to balance), decode-like
  // (one query per head, grouped-query heads), and short key rows (without causal: the
  // transposed form).
  const std::int64_t shapes[][6] = {{2, 3, 1, 37, 41, 24}, {1, 4, 2, 400, 520, 64}, {3, 8, 2, 1, 700, 64},
                                    {1, 2, 2, 2, 3000, 32}, {2, 4, 2, 700, 77, 40}};
  for (const auto& sh : shapes) {
    const std::int64_t B = sh[0], H = sh[1], Hkv = sh[2], Sq = sh[3], Sk = sh[4], D = sh[5];
    const auto [q, k, v] = test::random_qkv<float>(rng, B, H, Hkv, Sq, Sk, D);
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      AttentionOptions opt;
      opt.causal = causal;
      opt.threads = 1;
      const Buffer<float> one = test::run_attention(Backend::native, q, k, v, opt);
      for (int t : {2, 3, 7}) {
        opt.threads = t;
        const Buffer<float> out = test::run_attention(Backend::native, q, k, v, opt);
        CAPTURE(Sq);
        CAPTURE(Sk);
        CHECK(out.data == one.data);
      }
    }
  }
}

namespace {

// The two cases below: one call of attention() on 2 threads over these sizes is 4 B H Sq Sk D =
// 67 MFLOP, 8 times kMinFlopsPerThread on each thread, so a call that nothing holds to its own
// thread takes a worker (checked at the start of each case). Smaller, the calls run on their
// thread anyway and the cases could not see a call take a worker it should not.
constexpr std::int64_t kB = 1, kH = 4, kS = 256, kD = 64;
static_assert(4.0 * kB * kH * kS * kS * kD / 2 >= 8 * detail::kMinFlopsPerThread);

AttentionOptions two_threads() {
  AttentionOptions opt;
  opt.threads = 2;
  return opt;
}

// Workers a thread's team has started (team.hpp): a thread's team is its own and starts its
// workers on first use, so a new thread that has made calls has started none if and only if
// every share of every one of its calls' parallel loops ran on it.
using detail::team_workers_started;

// After a call that began while another was running, calls take no workers for
// kOverlapWindowMicros (team.hpp): waits that out, so that a call here that gets its caller
// alone does so for the rule under test, not because of an earlier case's calls.
void past_any_overlap() {
  std::this_thread::sleep_for(std::chrono::microseconds(detail::kOverlapWindowMicros) + std::chrono::milliseconds(5));
}

// Workers started by a new thread making one call (on 2 threads) alone.
int workers_of_a_lone_call(const test::Qkv<float>& in) {
  int started = -1;
  std::thread([&] {
    Buffer<float> out({kB, kH, kS, kD});
    attention(in.q.cview(), in.k.cview(), in.v.cview(), out.view(), two_threads());
    started = team_workers_started();
  }).join();
  return started;
}

}  // namespace

TEST_CASE("concurrent calls from many threads") {
  std::mt19937_64 rng(test::base_seed() + 21);
  // A named struct, not a structured binding: its members are used in lambdas.
  const test::Qkv<float> in = test::random_qkv<float>(rng, kB, kH, kH, kS, kS, kD);
  const Buffer<float> expect = test::run_attention(Backend::native, in.q, in.k, in.v);
  past_any_overlap();
  REQUIRE(workers_of_a_lone_call(in) >= 1);  // alone, a call takes a worker

  // Four new threads calling at once, 20 calls each, into outs[t]; returns the workers each
  // thread's team started.
  auto calls_from_four_threads = [&](std::vector<Buffer<float>>& outs) {
    std::vector<int> started(4, -1);
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&, t] {
        for (int rep = 0; rep < 20; ++rep)
          attention(in.q.cview(), in.k.cview(), in.v.cview(), outs[t].view(), two_threads());
        started[t] = team_workers_started();
      });
    for (auto& th : pool) th.join();
    return started;
  };
  // The tests' budget (64 threads, main.cpp): calls take workers as the budget and the overlap
  // rule allow, and each gets the same result.
  std::vector<Buffer<float>> outs(4, Buffer<float>({kB, kH, kS, kD}));
  calls_from_four_threads(outs);
  for (const auto& o : outs) CHECK(o.data == expect.data);
  // A budget of one thread (set_thread_budget: the most threads all concurrent calls use
  // together, each call's own thread included): no call takes a worker, alone (which nothing
  // else would stop) or however many run at once, so no calling thread's team starts one; the
  // results are the same.
  const int saved = thread_budget();
  set_thread_budget(1);
  past_any_overlap();
  const int alone = workers_of_a_lone_call(in);
  std::vector<Buffer<float>> outs1(4, Buffer<float>({kB, kH, kS, kD}));
  const std::vector<int> started1 = calls_from_four_threads(outs1);
  set_thread_budget(saved);
  CHECK(alone == 0);
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    CHECK(outs1[t].data == expect.data);
    CHECK(started1[t] == 0);
  }
}

TEST_CASE("calls inside an OpenMP parallel region run on the calling thread") {
  std::mt19937_64 rng(test::base_seed() + 21);
  const test::Qkv<float> in = test::random_qkv<float>(rng, kB, kH, kH, kS, kS, kD);
  const Buffer<float> expect = test::run_attention(Backend::native, in.q, in.k, in.v);
  past_any_overlap();
  REQUIRE(workers_of_a_lone_call(in) >= 1);  // outside a region, a call takes a worker

  // The region on a new thread, so that its threads (that thread and the OpenMP threads of its
  // region) have started no worker before. Inside, one call at a time (omp critical), so that no call overlaps
  // another: neither the thread budget nor the overlap rule holds a call to its thread, only the
  // rule under test (no nesting) does. Each thread's team must then have started no worker.
  std::vector<Buffer<float>> nested(3, Buffer<float>({kB, kH, kS, kD}));
  std::vector<int> started(3, -1);
  int in_parallel_threads = 0;
  std::thread([&] {
#pragma omp parallel num_threads(3)
    {
#pragma omp single
      in_parallel_threads = omp_get_num_threads();
      const int t = omp_get_thread_num();
#pragma omp critical
      attention(in.q.cview(), in.k.cview(), in.v.cview(), nested[t].view(), two_threads());  // must not nest
      started[t] = team_workers_started();
    }
  }).join();
  REQUIRE(in_parallel_threads > 1);  // an active region (a region of one thread is no nesting)
  for (int t = 0; t < in_parallel_threads; ++t) {
    CAPTURE(t);
    CHECK(nested[t].data == expect.data);
    CHECK(started[t] == 0);  // every share of its call ran on the calling thread
  }
}

TEST_CASE("concurrent forward and decode steps of one MHA layer from many threads") {
  std::mt19937_64 rng(test::base_seed() + 22);
  const std::int64_t d = 64, heads = 4, kv_heads = 2, hd = 16, B = 2, S = 24;
  std::normal_distribution<float> n(0.f, 0.2f);
  auto randn = [&](std::int64_t count) {
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = n(rng);
    return v;
  };
  MhaWeights<float> w{randn(heads * hd * d), randn(kv_heads * hd * d), randn(kv_heads * hd * d),
                      randn(d * heads * hd), randn(heads * hd), {}, randn(kv_heads * hd), randn(d)};
  const MultiHeadAttention layer(MhaConfig{.d_model = d, .heads = heads, .kv_heads = kv_heads, .head_dim = hd},
                                 std::move(w));
  const std::vector<float> x = randn(B * S * d);
  MhaOptions opt;
  opt.causal = Causal::top_left;
  opt.threads = 2;
  MhaOptions step = opt;  // over a cache: bottom-right alignment
  step.causal = Causal::bottom_right;
  std::vector<float> expect(x.size()), expect_decode(static_cast<std::size_t>(B * d));
  layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(expect.data(), B, S, d), opt);
  // A prompt of S - 1 tokens into a new cache, then one decode step whose output goes to y1.
  auto prompt_then_step = [&](float* y1) {
    KvCache cache(layer, B, S);
    std::vector<float> prompt(static_cast<std::size_t>(B * (S - 1) * d)), last(static_cast<std::size_t>(B * d));
    for (std::int64_t b = 0; b < B; ++b) {
      std::copy_n(x.begin() + b * S * d, (S - 1) * d, prompt.begin() + b * (S - 1) * d);
      std::copy_n(x.begin() + (b * S + S - 1) * d, d, last.begin() + b * d);
    }
    std::vector<float> y(prompt.size());
    layer.forward(ConstSeqView(prompt.data(), B, S - 1, d), cache, SeqView(y.data(), B, S - 1, d), step);
    layer.forward(ConstSeqView(last.data(), B, 1, d), cache, SeqView(y1, B, 1, d), step);
  };
  prompt_then_step(expect_decode.data());
  std::vector<std::vector<float>> outs(4, std::vector<float>(x.size())), steps(4, expect_decode);
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(outs[t].data(), B, S, d), opt);
        prompt_then_step(steps[t].data());  // each thread its own cache
      }
    });
  for (auto& th : pool) th.join();
  for (int t = 0; t < 4; ++t) {
    CHECK(outs[t] == expect);
    CHECK(steps[t] == expect_decode);
  }
  // The decode step's output is the full forward's last row of every sequence (f32 tolerance).
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t c = 0; c < d; ++c)
      CHECK(expect_decode[b * d + c] == doctest::Approx(expect[(b * S + S - 1) * d + c]).epsilon(1e-4));
}
