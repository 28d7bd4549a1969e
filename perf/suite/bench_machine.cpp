// The machine's limits, measured in the same run as everything else:
//   peak/fma/t<N>        FP32 FMA throughput of the dispatched ISA (independent FMA chains)
//   peak/amx-bf16/t<N>   AMX tile throughput (four independent tdpbf16ps on resident tiles), on
//                        CPUs with AMX (registered only where the dispatched table has it)
//   peak/vdpbf16ps/t<N>  vdpbf16ps throughput (16 independent chains), on CPUs with AVX512-BF16
//                        (registered where the dispatched table has it; the bf16 attention's
//                        products run on it on AMD's cores)
//   bandwidth/read/t<N>  streaming read of a 1 GiB buffer
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/simd/kernels.hpp"

namespace {

void peak_fma(benchmark::State& state, int threads) {
  const auto& probe = simdattn::simd::kernels().probe;
  constexpr std::int64_t kIters = 1 << 22;
  float sink = 0.f;
  const double flops = double(kIters) * probe.flops_per_iter * threads;
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += probe.fma_chains(kIters, 0.5f + float(omp_get_thread_num()));
  });
  benchmark::DoNotOptimize(sink);
}

void peak_amx(benchmark::State& state, int threads) {
  const auto& probe = simdattn::simd::kernels().probe;
  constexpr std::int64_t kIters = 1 << 18;
  constexpr double kFlopsPerIter = 4.0 * 2 * 16 * 16 * 32;  // four tdpbf16ps
  float sink = 0.f;
  simdattn::perf::timed_loop(state, double(kIters) * kFlopsPerIter * threads, "GFLOP/s", [&] {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += probe.amx_peak(kIters);
  });
  benchmark::DoNotOptimize(sink);
}

void peak_pairs(benchmark::State& state, int threads) {
  const auto& probe = simdattn::simd::kernels().probe;
  constexpr std::int64_t kIters = 1 << 20;
  constexpr double kFlopsPerIter = 16.0 * 64;  // 16 chains, 64 FLOPs a vdpbf16ps
  float sink = 0.f;
  simdattn::perf::timed_loop(state, double(kIters) * kFlopsPerIter * threads, "GFLOP/s", [&] {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += probe.pairs_peak(kIters);
  });
  benchmark::DoNotOptimize(sink);
}

void bandwidth_read(benchmark::State& state, int threads) {
  constexpr std::int64_t kBytes = std::int64_t{1} << 30;
  constexpr std::int64_t n = kBytes / sizeof(float);
  std::unique_ptr<float[]> buf(new float[n]);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) buf[i] = 1.f;  // first touch by the reading thread
  const auto& vec = simdattn::simd::kernels().vec_f32;
  float sink = 0.f;
  simdattn::perf::timed_loop(state, double(kBytes), "GB/s", [&] {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      const std::int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
      const std::int64_t b = n * t / T, e = n * (t + 1) / T;
      sink += vec.sum(buf.get() + b, e - b);
    }
  });
  benchmark::DoNotOptimize(sink);
}

int register_all() {
  for (int t : {1, 2}) {
    benchmark::RegisterBenchmark(("peak/fma/t" + std::to_string(t)).c_str(), peak_fma, t)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("bandwidth/read/t" + std::to_string(t)).c_str(), bandwidth_read, t)
        ->Unit(benchmark::kMillisecond);
    if (simdattn::simd::kernels().probe.amx_peak != nullptr)
      benchmark::RegisterBenchmark(("peak/amx-bf16/t" + std::to_string(t)).c_str(), peak_amx, t)
          ->Unit(benchmark::kMillisecond);
    if (simdattn::simd::kernels().probe.pairs_peak != nullptr)
      benchmark::RegisterBenchmark(("peak/vdpbf16ps/t" + std::to_string(t)).c_str(), peak_pairs, t)
          ->Unit(benchmark::kMillisecond);
  }
  return 0;
}

const int registered = register_all();

}  // namespace
