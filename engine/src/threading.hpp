// The engine's one way to run work in parallel.
//
// parallel_for(n, threads, min_per_thread, fn) calls fn(begin, end) over a partition of [0, n)
// into contiguous, balanced chunks (thread t gets [n*t/T, n*(t+1)/T)), so the partition is a pure
// function of (n, T). It opens an OpenMP region only when that can help: never for threads == 1,
// never inside another parallel region (no nesting), and never with more threads than chunks of
// `min_per_thread` items. fn must not throw.
//
// parallel_claims(n, threads, min_per_thread, worker): the same thread count, but items are
// claimed one at a time: worker(next) runs once on each thread, and next() returns the next
// unclaimed item (n or more once none is left), so a thread slowed down (a VM's noisy
// neighbour) leaves items to the others and a worker can keep state across the items it claims.
// For items whose result does not depend on which thread computes them. worker must not throw.
// parallel_for_each_claimed(n, threads, min_per_thread, fn): fn(i, i + 1) for each claimed item.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace simdattn::detail {

// Below this many flops per thread a parallel region costs more than it saves (an OpenMP
// fork/join is a few microseconds; 4 MFLOP is ~16 us at this machine's per-core peak).
// perf/bench_gemm.cpp's 128x768x768 and 1x4096x128 cases sit on either side of it.
constexpr double kMinFlopsPerThread = 4e6;

inline int resolve_threads(int requested) {
  if (omp_in_parallel()) return 1;
  return requested > 0 ? requested : std::max(1, omp_get_max_threads());
}

// Threads for n items of which each thread should get at least min_per_thread (1: no region).
inline std::int64_t threads_for(std::int64_t n, int threads, std::int64_t min_per_thread) {
  const std::int64_t nt = resolve_threads(threads);
  return std::min(nt, std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, min_per_thread)));
}

template <class Fn>
void parallel_for(std::int64_t n, int threads, std::int64_t min_per_thread, Fn&& fn) {
  if (n <= 0) return;
  const std::int64_t nt = threads_for(n, threads, min_per_thread);
  if (nt <= 1) {
    fn(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t T = omp_get_num_threads();
    fn(n * t / T, n * (t + 1) / T);
  }
}

template <class Worker>
void parallel_claims(std::int64_t n, int threads, std::int64_t min_per_thread, Worker&& worker) {
  if (n <= 0) return;
  const std::int64_t nt = threads_for(n, threads, min_per_thread);
  std::int64_t next = 0;
  if (nt <= 1) {
    worker([&] { return next++; });
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(nt))
  worker([&] {
    std::int64_t i;
#pragma omp atomic capture
    i = next++;
    return i;
  });
}

template <class Fn>
void parallel_for_each_claimed(std::int64_t n, int threads, std::int64_t min_per_thread, Fn&& fn) {
  parallel_claims(n, threads, min_per_thread, [&](auto next) {
    for (std::int64_t i = next(); i < n; i = next()) fn(i, i + 1);
  });
}

}  // namespace simdattn::detail
