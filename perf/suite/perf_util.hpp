// Shared helpers of the perf suite.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <type_traits>
#include <utility>

#include "simdattn/half.hpp"
#include "simdattn/runtime.hpp"

namespace simdattn::perf {

// Runs `body` once per benchmark iteration and sets a throughput counter from *wall-clock* time
// (the Time column is the main thread's CPU time, which undercounts waiting in multi-threaded
// runs). `per_iter` is FLOPs (counter "GFLOP/s") or bytes (counter "GB/s") per call. Benchmarks
// keep their plain `<op>/<backend>/<workload>/t<threads>` names (UseRealTime would append
// "/real_time").
// x as T: float itself, or rounded to bf16 / f16 (nearest even).
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, simdattn::bfloat16>) return simdattn::to_bfloat16(x);
  else if constexpr (std::is_same_v<T, simdattn::float16>) return simdattn::to_float16(x);
  else return x;
}

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
