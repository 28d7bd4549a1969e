// Shared helpers of the perf suite.
#pragma once

#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

#include "simdattn/half.hpp"
#include "simdattn/runtime.hpp"

namespace simdattn::perf {

// x as T: float itself, or rounded to bf16 / f16 (nearest even).
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, simdattn::bfloat16>) return simdattn::to_bfloat16(x);
  else if constexpr (std::is_same_v<T, simdattn::float16>) return simdattn::to_float16(x);
  else return x;
}

// n elements on transparent huge pages, as a KvPool keeps its blocks: a pool-layout cache's rows
// of one kv head lie Hkv * D elements apart (4 KiB for 8 heads of 128 f32), each on its own 4 KiB
// page, so on small pages its K and V rows would cost a TLB miss each that a pool does not pay.
template <class T>
struct HugeArray {
  T* p = nullptr;
  std::size_t n = 0;
  HugeArray() = default;
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  ~HugeArray() { std::free(p); }
  void resize(std::size_t count) {
    constexpr std::size_t kPage = std::size_t{2} << 20;
    std::free(p);
    n = count;
    const std::size_t bytes = (n * sizeof(T) + kPage - 1) / kPage * kPage;
    p = static_cast<T*>(std::aligned_alloc(kPage, bytes));
    if (p == nullptr) throw std::bad_alloc();
    (void)madvise(p, bytes, MADV_HUGEPAGE);
  }
  std::size_t size() const { return n; }
  T* data() { return p; }
  const T* data() const { return p; }
  T* begin() { return p; }
  T* end() { return p + n; }
  T& operator[](std::size_t i) { return p[i]; }
};

// Runs `body` once per benchmark iteration and sets a throughput counter from *wall-clock* time
// (the Time column is the main thread's CPU time, which undercounts waiting in multi-threaded
// runs). `per_iter` is FLOPs (counter "GFLOP/s") or bytes (counter "GB/s") per call. Benchmarks
// keep their plain `<op>/<backend>/<workload>/t<threads>` names (UseRealTime would append
// "/real_time").
template <class Body>
void timed_loop(benchmark::State& state, double per_iter, const char* counter, Body&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double iters = static_cast<double>(state.iterations());
  state.counters[counter] = per_iter * iters / wall * 1e-9;
  state.counters["wall_ms"] = wall / iters * 1e3;
}

// bench(state) with every parallel loop on the thread runtime r (restored after): the rows named
// `.openmp` beside their team twins, so that one run compares the two runtimes interleaved.
template <class Bench>
void on_runtime(benchmark::State& state, simdattn::ThreadRuntime r, Bench&& bench) {
  const simdattn::ThreadRuntime saved = simdattn::thread_runtime();
  simdattn::set_thread_runtime(r);
  bench(state);
  simdattn::set_thread_runtime(saved);
}

}  // namespace simdattn::perf
