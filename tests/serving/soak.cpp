// The serving soak: request threads on one PoolScheduler over a pool small enough to run out,
// for a given time. Each request opens a sequence (half of them forked from a registered prefix),
// runs a prompt and decode steps, and at random submits a bad step (its Error, nothing changed),
// cancels a step (before it is submitted, or from another thread while it runs: false, the
// sequence as it was), meets a full pool (Error("pool"), the sequence as it was) or drafts a
// speculative tree (2-6 tokens at their depths' positions, one step with its tree mask), keeps
// one root-to-node path of it and accepts it (PoolScheduler::accept). Batches of forks take the
// cascade (SIMDATTN_CASCADE's always mode: every group sharing a block). Every step that
// completed (a tree step: its kept tokens) is checked against a sequential reference (the same
// tokens through a KvCache), every length after every step, and at the end the pool's free count
// against its size. Exits 0 when all hold and each kind of event happened, 1 otherwise.
//
//   simdattn_soak [seconds (default 180)] [threads (default 16)]
//   SIMDATTN_SOAK_SECONDS overrides the time (the bounded runs of CI and the sanitizers)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "layer/cache/pool_core.hpp"
#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t kD = test::kServingD, kPrefix = 20;

MultiHeadAttention make_layer() {
  std::mt19937_64 rng(11);
  return test::serving_layer(rng);
}
std::vector<float> tokens(std::mt19937_64& rng, std::int64_t n) { return test::serving_tokens(rng, n); }

struct Counts {
  std::atomic<long> requests{0}, steps{0}, cancelled{0}, pool_full{0}, bad{0}, trees{0}, failures{0};
};

std::mutex print_mutex;
void failure(Counts& c, const std::string& what) {
  ++c.failures;
  std::lock_guard<std::mutex> lock(print_mutex);
  std::fprintf(stderr, "soak: FAILED: %s\n", what.c_str());
}

bool close(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= 1e-4f * std::max(1.f, std::abs(b[i])))) return false;
  return a.size() == b.size();
}

// One request thread until the deadline.
void request_thread(int id, std::chrono::steady_clock::time_point deadline, const MultiHeadAttention& layer,
                    PoolScheduler& sched, KvPool::Sequence prefix, const std::vector<float>& prefix_x, Counts& c) {
  std::mt19937_64 rng(1000 + static_cast<unsigned>(id));
  std::uniform_int_distribution<int> pct(0, 99);
  while (std::chrono::steady_clock::now() < deadline) {
    ++c.requests;
    const bool forked = pct(rng) < 50;
    const KvPool::Sequence seq = sched.open(forked ? std::optional<KvPool::Sequence>(prefix) : std::nullopt);
    std::vector<std::vector<float>> step_x, step_y;  // the completed steps (after the prefix)
    std::int64_t expected = forked ? kPrefix : 0;     // the sequence's length
    const int steps = 1 + std::uniform_int_distribution<int>(0, 12)(rng);
    bool open = true;
    for (int k = 0; k < steps && open; ++k) {
      const std::int64_t t = k == 0 ? std::uniform_int_distribution<std::int64_t>(1, 40)(rng) : 1;
      const std::vector<float> x = tokens(rng, t);
      std::vector<float> y(x.size(), 0.f);
      PoolStep st{ConstSeqView(x.data(), 1, t, kD), seq, SeqView(y.data(), 1, t, kD)};
      const int event = pct(rng);
      try {
        if (k > 0 && event >= 90) {  // a draft tree, verified in one step; one path of it accepted
          const std::int64_t n = 2 + std::uniform_int_distribution<std::int64_t>(0, 4)(rng);
          const std::vector<float> drafts = tokens(rng, n);
          std::vector<float> out(drafts.size(), 0.f);
          std::vector<std::int64_t> parent(static_cast<std::size_t>(n), -1), depth(parent.size(), 0), pos;
          std::vector<std::uint8_t> mask(static_cast<std::size_t>(n * n), 0);
          for (std::int64_t j = 0; j < n; ++j) {
            if (j > 0) parent[j] = std::uniform_int_distribution<std::int64_t>(0, j - 1)(rng), depth[j] = depth[parent[j]] + 1;
            for (std::int64_t a = j; a >= 0; a = parent[a]) mask[j * n + a] = 1;
            pos.push_back(expected + depth[j]);
          }
          PoolStep tree{ConstSeqView(drafts.data(), 1, n, kD), seq, SeqView(out.data(), 1, n, kD), pos};
          tree.tree_mask = mask;
          sched.step(tree);
          std::vector<std::int64_t> kept;  // the path from the root to a random draft (or none)
          for (std::int64_t a = std::uniform_int_distribution<std::int64_t>(-1, n - 1)(rng); a >= 0; a = parent[a])
            kept.insert(kept.begin(), a);
          sched.accept(seq, expected, kept);
          std::vector<float> kx, ky;
          for (const std::int64_t j : kept) {
            kx.insert(kx.end(), drafts.begin() + j * kD, drafts.begin() + (j + 1) * kD);
            ky.insert(ky.end(), out.begin() + j * kD, out.begin() + (j + 1) * kD);
          }
          if (!kept.empty()) step_x.push_back(kx), step_y.push_back(ky);
          expected += static_cast<std::int64_t>(kept.size());
          ++c.trees;
        } else if (event < 4) {  // a bad step: its own Error, nothing changed
          st.query.E = kD + 1;
          try {
            sched.step(st);
            failure(c, "a bad step ran");
          } catch (const Error& e) {
            if (e.argument() != "query") failure(c, std::string("a bad step's error names ") + e.argument());
            ++c.bad;
          }
        } else if (event < 10) {  // cancelled before or while it runs
          std::stop_source stop;
          std::jthread canceller;  // joined however the step ends
          if (event < 6) stop.request_stop();
          else
            canceller = std::jthread([&stop, wait = std::uniform_int_distribution<int>(0, 300)(rng)] {
              std::this_thread::sleep_for(std::chrono::microseconds(wait));
              stop.request_stop();
            });
          const bool ran = sched.step(st, stop.get_token());
          if (canceller.joinable()) canceller.join();
          if (ran) {
            step_x.push_back(x), step_y.push_back(y);
            expected += t;
            ++c.steps;
          } else {
            ++c.cancelled;
          }
        } else {
          sched.step(st);
          step_x.push_back(x), step_y.push_back(y);
          expected += t;
          ++c.steps;
        }
      } catch (const Error& e) {
        if (e.argument() != "pool") failure(c, std::string("unexpected error: ") + e.what());
        ++c.pool_full;
        open = false;  // the request ends
      }
      if (sched.length(seq) != expected)
        failure(c, "length " + std::to_string(sched.length(seq)) + ", expected " + std::to_string(expected));
    }
    // the sequential reference: the same tokens, step by step, through a KvCache
    KvCache cache(layer, 1, 1024);
    if (forked) {
      std::vector<float> p(prefix_x.size());
      layer.forward(ConstSeqView(prefix_x.data(), 1, kPrefix, kD), cache, SeqView(p.data(), 1, kPrefix, kD));
    }
    for (std::size_t k = 0; k < step_x.size(); ++k) {
      const auto t = static_cast<std::int64_t>(step_x[k].size()) / kD;
      std::vector<float> want(step_x[k].size());
      layer.forward(ConstSeqView(step_x[k].data(), 1, t, kD), cache, SeqView(want.data(), 1, t, kD));
      if (!close(step_y[k], want)) failure(c, "request " + std::to_string(id) + ": a step's output differs");
    }
    sched.close(seq);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 180.0;
  if (const char* env = std::getenv("SIMDATTN_SOAK_SECONDS")) seconds = std::atof(env);
  const int threads = argc > 2 ? std::atoi(argv[2]) : 16;
  const MultiHeadAttention layer = make_layer();
  detail::set_cascade_mode(detail::CascadeMode::always);  // the forks' batches take the cascade
  const std::uint64_t cascades_before = detail::cascades_run();
  KvPool pool(layer, 96, 4);  // 384 tokens for 16 requests of up to 20 + 40 + 12: it runs out
  Counts c;
  {
    PoolSchedulerOptions o;
    o.token_budget = 48;
    PoolScheduler sched(layer, pool, o);
    std::mt19937_64 rng(7);
    const std::vector<float> prefix_x = tokens(rng, kPrefix);
    std::vector<float> prefix_y(prefix_x.size());
    const KvPool::Sequence prefix = sched.open();
    sched.step({ConstSeqView(prefix_x.data(), 1, kPrefix, kD), prefix, SeqView(prefix_y.data(), 1, kPrefix, kD)});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::vector<std::thread> pool_threads;
    for (int i = 0; i < threads; ++i)
      pool_threads.emplace_back(request_thread, i, std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline),
                                std::cref(layer), std::ref(sched), prefix, std::cref(prefix_x), std::ref(c));
    for (auto& t : pool_threads) t.join();
    sched.close(prefix);
    if (sched.free_blocks() != pool.num_blocks())
      failure(c, "the pool has " + std::to_string(sched.free_blocks()) + " of " + std::to_string(pool.num_blocks()) +
                     " blocks free at the end");
    std::printf("soak: %.0f s, %d threads: %ld requests, %ld steps, %ld cancelled, %ld pool full, %ld bad, %ld trees, "
                "%zu batches, %llu cascades\n",
                seconds, threads, c.requests.load(), c.steps.load(), c.cancelled.load(), c.pool_full.load(), c.bad.load(),
                c.trees.load(), sched.batches(), static_cast<unsigned long long>(detail::cascades_run() - cascades_before));
  }
  if (c.steps == 0 || c.cancelled == 0 || c.pool_full == 0 || c.bad == 0 || c.trees == 0 ||
      detail::cascades_run() == cascades_before)
    failure(c, "an event never happened (each of steps, cancelled, pool full, bad, trees and cascades must)");
  if (c.failures != 0) {
    std::fprintf(stderr, "soak: %ld failures\n", c.failures.load());
    return 1;
  }
  std::printf("soak: every completed step equals its sequential reference; the pool is full again\n");
  return 0;
}
