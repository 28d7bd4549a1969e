// The engine's one way to run work in parallel.
//
// parallel_for(n, threads, min_per_thread, fn) calls fn(begin, end) over a partition of [0, n)
// into contiguous, balanced chunks (thread t gets [n*t/T, n*(t+1)/T)), so the partition is a pure
// function of (n, T). It runs on the calling thread's team (team.hpp) only when that can help:
// never for threads == 1, never inside another parallel region (no nesting), and never with more
// threads than chunks of `min_per_thread` items. fn must not throw.
//
// parallel_claims(n, threads, min_per_thread, worker): the same thread count, but items are
// claimed one at a time: worker(next) runs once on each thread, and next() returns the next
// unclaimed item (n or more once none is left), so a thread slowed down (a VM's noisy
// neighbour) leaves items to the others and a worker can keep state across the items it claims.
// For items whose result does not depend on which thread computes them. worker must not throw.
// parallel_for_each_claimed(n, threads, min_per_thread, fn): fn(i, i + 1) for each claimed item.
// parallel_shares (below): claimed runs of items of uneven cost, with stealing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <omp.h>

#include "runtime/team.hpp"
#include "runtime/thread_runtime.hpp"

namespace simdattn::detail {

// Below this many flops per thread a parallel region costs more than it saves (waking a worker
// and joining it takes a few microseconds; 4 MFLOP is ~16 us at a per-core peak of 250 GFLOP/s).
// perf/suite/bench_gemm.cpp's 128x768x768 and 1x4096x128 cases sit on either side of it.
constexpr double kMinFlopsPerThread = 4e6;

// Threads a call asks for: `requested`, or OpenMP's default (OMP_NUM_THREADS, else the CPUs the
// process may use) for 0; 1 inside an OpenMP parallel region of the caller's or on a team's
// worker (no nesting).
inline int resolve_threads(int requested) {
  if (omp_in_parallel() || in_team_worker()) return 1;
  return requested > 0 ? requested : std::max(1, std::min(omp_get_max_threads(), thread_budget()));
}

// Threads for n items of which each thread should get at least min_per_thread (1: no region).
inline std::int64_t threads_for(std::int64_t n, int threads, std::int64_t min_per_thread) {
  const std::int64_t nt = resolve_threads(threads);
  return std::min(nt, std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, min_per_thread)));
}

// While alive, the calling thread's parallel loops run on OpenMP's threads instead of its
// team: for a call that also runs oneDNN, which computes on OpenMP's threads, so that the call
// does not keep two sets of threads waiting against each other on the same cores (an MHA layer
// whose attention core runs on the onednn backend; guarded by mha/onednn/bert-layer/t2).
class OpenMpScope {
 public:
  explicit OpenMpScope(bool enable = true) : saved_(active()) { active() = active() || enable; }
  ~OpenMpScope() { active() = saved_; }
  OpenMpScope(const OpenMpScope&) = delete;
  OpenMpScope& operator=(const OpenMpScope&) = delete;
  static bool& active() {
    thread_local bool on = false;
    return on;
  }

 private:
  bool saved_;
};

// body(t, T) on T threads, t = 0 on the caller: the calling thread's team (team.hpp), or
// OpenMP's threads under the openmp runtime (thread_runtime.hpp) or inside an OpenMpScope. T may be less than nt: the process-wide thread budget
// (ThreadClaim) leaves a call the threads other calls do not hold, and the system may refuse a
// thread.
template <class Body>
void run_parallel(int nt, Body&& body) {
  const ThreadClaim claim(nt);  // within the process-wide budget (team.hpp)
  if (OpenMpScope::active() || current_thread_runtime() == ThreadRuntime::openmp) {
#pragma omp parallel num_threads(claim.threads())
    body(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
  run_on_team(claim.threads(), body);
}

template <class Fn>
void parallel_for(std::int64_t n, int threads, std::int64_t min_per_thread, Fn&& fn) {
  if (n <= 0) return;
  const std::int64_t nt = threads_for(n, threads, min_per_thread);
  if (nt <= 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  run_parallel(static_cast<int>(nt), [&](int t, int T) { fn(n * t / T, n * (t + 1) / T); });
}

template <class Worker>
void parallel_claims(std::int64_t n, int threads, std::int64_t min_per_thread, Worker&& worker) {
  if (n <= 0) return;
  const std::int64_t nt = threads_for(n, threads, min_per_thread);
  if (nt <= 1) {
    std::int64_t next = 0;
    worker([&] { return next++; });
    return;
  }
  std::atomic<std::int64_t> next{0};
  run_parallel(static_cast<int>(nt), [&](int, int) { worker([&] { return next.fetch_add(1, std::memory_order_relaxed); }); });
}

template <class Fn>
void parallel_for_each_claimed(std::int64_t n, int threads, std::int64_t min_per_thread, Fn&& fn) {
  parallel_claims(n, threads, min_per_thread, [&](auto next) {
    for (std::int64_t i = next(); i < n; i = next()) fn(i, i + 1);
  });
}

// parallel_shares(prefix, nt, worker): items 0 .. n-1 of uneven cost, given as prefix sums of
// their costs (prefix.size() == n + 1, prefix[0] == 0), on nt threads (1: the calling thread, no
// region). Each thread owns the items whose cost prefix starts in its equal share of the total
// and takes them from the front in runs of about an eighth of the share; a thread whose share is
// done takes the back half of what is left of the fullest other share. worker(next) runs once
// on each thread; next() returns the next run [begin, end) of items, begin >= end once none is
// left. A thread slowed down (another process on its core, a VM's noisy neighbour) so leaves
// work to the others instead of keeping them waiting at the join, while each share is still
// walked in order (neighbouring items share data: the fused attention kernel's packed K/V
// blocks). For items whose result does not depend on which thread computes them. worker must
// not throw.
template <class Worker>
void parallel_shares(const std::vector<std::int64_t>& prefix, int nt, Worker&& worker) {
  const std::int64_t n = static_cast<std::int64_t>(prefix.size()) - 1;
  if (n <= 0) return;
  if (nt <= 1) {
    bool done = false;
    worker([&] {
      const std::pair<std::int64_t, std::int64_t> all{done ? n : 0, n};
      done = true;
      return all;
    });
    return;
  }
  // [3t]: next item of share t, [3t + 1]: its end, [3t + 2]: its run length. Storage of the
  // calling thread, reached by the team through this reference; set before the team starts.
  thread_local std::vector<std::int64_t> share_storage;
  std::vector<std::int64_t>& share = share_storage;
  share.assign(3 * static_cast<std::size_t>(nt), 0);
  const std::int64_t total = prefix.back();
  for (std::size_t t = 0; t < static_cast<std::size_t>(nt); ++t) {
    const auto begin = static_cast<std::int64_t>(t), end = begin + 1;
    share[3 * t] = std::lower_bound(prefix.begin(), prefix.end() - 1, total * begin / nt) - prefix.begin();
    share[3 * t + 1] = std::lower_bound(prefix.begin(), prefix.end() - 1, total * end / nt) - prefix.begin();
    share[3 * t + 2] = std::max<std::int64_t>(1, (share[3 * t + 1] - share[3 * t]) / 8);
  }
  std::mutex claims;
  run_parallel(nt, [&](int tid, int) {
    const auto t = static_cast<std::size_t>(tid);
    worker([&] {
      std::pair<std::int64_t, std::int64_t> claimed{0, 0};
      const std::lock_guard<std::mutex> lock(claims);
      std::int64_t& own = share[3 * t];
      if (own < share[3 * t + 1]) {
        claimed = {own, std::min(share[3 * t + 1], own + share[3 * t + 2])};
        own = claimed.second;
      } else {  // steal the back half of the fullest share (a share no thread runs included)
        std::size_t victim = 0;
        std::int64_t most = 0;
        for (std::size_t v = 0; v < static_cast<std::size_t>(nt); ++v)
          if (share[3 * v + 1] - share[3 * v] > most) most = share[3 * v + 1] - share[3 * v], victim = v;
        if (most > 0) {
          claimed = {share[3 * victim + 1] - (most + 1) / 2, share[3 * victim + 1]};
          share[3 * victim + 1] = claimed.first;
        }
      }
      return claimed;
    });
  });
}

// An exception must not leave a parallel region: a thread runs its part under guard(), which
// records a std::bad_alloc (a scratch buffer that could not grow), and the caller calls
// rethrow() after the region.
class RegionFailure {
 public:
  template <class Body>
  void guard(Body&& body) noexcept {
    try {
      body();
    } catch (const std::bad_alloc&) {
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (failed_.load(std::memory_order_relaxed)) throw std::bad_alloc();
  }

 private:
  std::atomic<bool> failed_{false};
};

}  // namespace simdattn::detail
