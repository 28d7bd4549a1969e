// Shared helpers of the perf suite.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace simdattn::perf {

// 64-byte aligned storage for operands, as a framework allocates its tensors (PyTorch's CPU
// allocator aligns to 64 bytes), so a path that needs aligned rows (the GEMM's streaming stores)
// is measured as a service would see it, not lost to malloc's 16-byte alignment.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

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

}  // namespace simdattn::perf
