// The thread runtime switch (set_thread_runtime, runtime/thread_runtime.hpp): under openmp every
// parallel loop runs in an OpenMP region and starts no team worker, under team on the calling
// thread's team; a loop started inside an OpenMP region runs on its calling thread under either;
// and the outputs are bitwise identical between the two.
#include <doctest/doctest.h>

#include <omp.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "runtime/team.hpp"
#include "runtime/threading.hpp"
#include "simdattn/runtime.hpp"
#include "support/serving_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn;
using test::Buffer;

namespace {

// Restores the runtime the case found (the ctest run under SIMDATTN_THREAD_RUNTIME=openmp too).
struct RuntimeScope {
  ThreadRuntime saved = thread_runtime();
  explicit RuntimeScope(ThreadRuntime r) { set_thread_runtime(r); }
  ~RuntimeScope() { set_thread_runtime(saved); }
};

// Where the shares of one parallel_for over 2 items on 2 threads ran, seen from a new thread
// (whose team has started no worker before).
struct Seen {
  int in_region = 0;      // shares that ran inside an OpenMP region
  int region_threads = 0; // the largest omp_get_num_threads() a share saw
  int on_workers = 0;     // shares on a team worker
  int workers_started = -1;
};

Seen where_a_loop_runs() {
  Seen s;
  std::atomic<int> in_region{0}, threads{0}, workers{0};
  std::thread([&] {
    detail::parallel_for(2, 2, 1, [&](std::int64_t, std::int64_t) {
      if (omp_in_parallel()) in_region.fetch_add(1);
      int expected = threads.load();
      while (omp_get_num_threads() > expected && !threads.compare_exchange_weak(expected, omp_get_num_threads())) {
      }
      if (detail::in_team_worker() && omp_get_thread_num() == 0 && !omp_in_parallel()) workers.fetch_add(1);
    });
    s.workers_started = detail::team_workers_started();
  }).join();
  s.in_region = in_region.load(), s.region_threads = threads.load(), s.on_workers = workers.load();
  return s;
}

}  // namespace

TEST_CASE("thread runtime: loops run in OpenMP regions under openmp, on the team under team") {
  {
    const RuntimeScope scope(ThreadRuntime::openmp);
    CHECK(thread_runtime() == ThreadRuntime::openmp);
    CHECK(runtime_info().thread_runtime == "openmp");
    const Seen s = where_a_loop_runs();
    CHECK(s.in_region == 2);
    CHECK(s.region_threads == 2);
    CHECK(s.workers_started == 0);
  }
  {
    const RuntimeScope scope(ThreadRuntime::team);
    CHECK(runtime_info().thread_runtime == "team");
    const Seen s = where_a_loop_runs();
    CHECK(s.in_region == 0);
    CHECK(s.workers_started >= 1);
  }
  CHECK_THROWS_AS(set_thread_runtime(static_cast<ThreadRuntime>(5)), Error);
}

TEST_CASE("thread runtime: a loop started inside an OpenMP region runs on its calling thread") {
  for (ThreadRuntime r : {ThreadRuntime::team, ThreadRuntime::openmp}) {
    CAPTURE(thread_runtime_name(r));
    const RuntimeScope scope(r);
    std::vector<int> level(3, -1), shares(3, 0), region_threads(3, -1);
    int outer = 0;
    std::thread([&] {
#pragma omp parallel num_threads(3)
      {
        const int t = omp_get_thread_num();
#pragma omp single
        outer = omp_get_num_threads();
        detail::parallel_for(8, 2, 1, [&](std::int64_t, std::int64_t) {
          level[static_cast<std::size_t>(t)] = omp_get_level();
          region_threads[static_cast<std::size_t>(t)] = omp_get_num_threads();
          shares[static_cast<std::size_t>(t)] += 1;
        });
      }
    }).join();
    REQUIRE(outer > 1);
    for (int t = 0; t < outer; ++t) {
      CAPTURE(t);
      CHECK(level[static_cast<std::size_t>(t)] == 1);  // no nested region
      CHECK(region_threads[static_cast<std::size_t>(t)] == outer);
      CHECK(shares[static_cast<std::size_t>(t)] == 1);  // the whole loop as one share on the caller
    }
  }
}

TEST_CASE("thread runtime: outputs are bitwise identical under team and openmp" * doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 41);
  const std::int64_t shapes[][6] = {{2, 3, 1, 37, 41, 24}, {1, 4, 2, 300, 420, 64}, {3, 8, 2, 1, 700, 64},
                                    {2, 4, 2, 200, 77, 40}};
  for (const auto& sh : shapes) {
    const auto [q, k, v] = test::random_qkv<float>(rng, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      for (int threads : {2, 3}) {
        AttentionOptions opt;
        opt.causal = causal;
        opt.threads = threads;
        Buffer<float> team, openmp;
        {
          const RuntimeScope scope(ThreadRuntime::team);
          team = test::run_attention(Backend::native, q, k, v, opt);
        }
        {
          const RuntimeScope scope(ThreadRuntime::openmp);
          openmp = test::run_attention(Backend::native, q, k, v, opt);
        }
        CAPTURE(sh[3]);
        CAPTURE(threads);
        CHECK(team.data == openmp.data);
      }
    }
  }
  // a layer's forward and a decode step over its cache
  const MultiHeadAttention layer = test::serving_layer(rng);
  const std::vector<float> x = test::serving_tokens(rng, 2 * 96), step = test::serving_tokens(rng, 2);
  std::vector<std::vector<float>> outs;
  for (ThreadRuntime r : {ThreadRuntime::team, ThreadRuntime::openmp}) {
    const RuntimeScope scope(r);
    MhaOptions o;
    o.threads = 2;
    o.causal = Causal::top_left;
    std::vector<float> y(x.size()), y1(step.size());
    layer.forward(ConstSeqView(x.data(), 2, 96, test::kServingD), SeqView(y.data(), 2, 96, test::kServingD), o);
    KvCache cache(layer, 2, 128);
    MhaOptions c;
    c.threads = 2;
    layer.forward(ConstSeqView(x.data(), 2, 96, test::kServingD), cache, SeqView(y.data(), 2, 96, test::kServingD), c);
    layer.forward(ConstSeqView(step.data(), 2, 1, test::kServingD), cache, SeqView(y1.data(), 2, 1, test::kServingD), c);
    y.insert(y.end(), y1.begin(), y1.end());
    outs.push_back(y);
  }
  CHECK(outs[0] == outs[1]);
}
