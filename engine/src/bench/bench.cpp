#include "simdattn/bench.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <string>

#include <omp.h>

#include "core/problem.hpp"
#include "core/validate/validate.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn {
namespace {

// docs/design.md's standard workloads. D == Dv and H == Hkv in all of them.
constexpr std::array<Workload, 7> kWorkloads{{
    {"bert", 1, 12, 12, 128, 128, 64, Causal::none},
    {"vit", 1, 12, 12, 197, 197, 64, Causal::none},
    {"gpt", 1, 16, 16, 2048, 2048, 64, Causal::top_left},
    {"long", 1, 8, 8, 8192, 8192, 128, Causal::top_left},
    {"decode", 1, 32, 32, 1, 4096, 128, Causal::none},
    {"sdcross", 2, 8, 8, 4096, 77, 40, Causal::none},
    {"batch", 8, 12, 12, 512, 512, 64, Causal::none},
}};

}  // namespace

std::span<const Workload> standard_workloads() noexcept { return kWorkloads; }

const Workload* find_workload(std::string_view name) noexcept {
  for (const auto& w : kWorkloads)
    if (w.name == name) return &w;
  return nullptr;
}

double attention_flops(std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                       std::int64_t D, std::int64_t Dv, Causal causal) {
  double pairs = 0.0;  // visible (query, key) pairs per (batch, head)
  if (causal == Causal::none) {
    pairs = double(Sq) * double(Sk);
  } else {
    for (std::int64_t i = 0; i < Sq; ++i) {
      const std::int64_t pos = causal == Causal::top_left ? i : i + Sk - Sq;
      pairs += double(std::clamp<std::int64_t>(pos + 1, 0, Sk));
    }
  }
  return 2.0 * double(B) * double(H) * pairs * double(D + Dv);
}

namespace {

// GFLOP/s of probe(t) (a run's value on thread t, which must be used) on `threads` threads, each
// run `flops_per_thread` FLOPs per thread: the best of at least 3 runs and about `seconds`.
template <class Probe>
double best_rate(int threads, double seconds, double flops_per_thread, Probe probe) {
  const auto start = std::chrono::steady_clock::now();
  double best = 0.0;
  float sink = 0.f;
  for (int run = 0; run < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += probe(omp_get_thread_num());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops_per_thread * threads / dt * 1e-9);
  }
  volatile float keep = sink;  // the probes' result must be used
  (void)keep;
  return best;
}

// tdpbf16ps's throughput on `threads` threads (the probe of peak/amx-bf16/t<N>).
double measure_amx_peak(int threads, double seconds) {
  const auto& probe = simd::kernels().probe;
  constexpr std::int64_t kIters = std::int64_t{1} << 16;  // ~1.2 ms per run at 4.75 ns a product
  constexpr double kFlopsPerIter = 4.0 * 2 * 16 * 16 * 32;  // four tdpbf16ps
  return best_rate(threads, seconds, double(kIters) * kFlopsPerIter, [&](int) { return probe.amx_peak(kIters); });
}

// vdpbf16ps's throughput on `threads` threads (the probe of peak/vdpbf16ps/t<N>).
double measure_pairs_peak(int threads, double seconds) {
  const auto& probe = simd::kernels().probe;
  constexpr std::int64_t kIters = std::int64_t{1} << 18;  // ~1.1 ms per run at one instruction a cycle
  constexpr double kFlopsPerIter = 16.0 * 64;              // 16 chains, 64 FLOPs an instruction
  return best_rate(threads, seconds, double(kIters) * kFlopsPerIter, [&](int) { return probe.pairs_peak(kIters); });
}

}  // namespace

double measure_fma_peak(int threads, double seconds) {
  if (threads < 1) throw Error("threads", "expected >= 1, got " + std::to_string(threads));
  detail::check_isa();
  const auto& probe = simd::kernels().probe;
  constexpr std::int64_t kIters = std::int64_t{1} << 20;  // ~3 ms per chain run at this peak
  return best_rate(threads, seconds, double(kIters) * probe.flops_per_iter,
                   [&](int t) { return probe.fma_chains(kIters, 0.5f + static_cast<float>(t)); });
}

Peak measure_peak(DType dtype, int threads, double seconds) {
  if (threads < 1) throw Error("threads", "expected >= 1, got " + std::to_string(threads));
  detail::check_isa();
  const simd::KernelTable& kt = simd::kernels();
  if (dtype == DType::bf16 && kt.probe.amx_peak != nullptr) return {"amx-bf16", measure_amx_peak(threads, seconds)};
  if (dtype == DType::bf16 && kt.tile_attention.block != nullptr && kt.probe.pairs_peak != nullptr)
    return {"vdpbf16ps-bf16", measure_pairs_peak(threads, seconds)};
  const double fma = measure_fma_peak(threads, seconds);
  if (dtype == DType::f64) return {"fma-f64", fma / 2};
  return {"fma-f32", fma};
}

}  // namespace simdattn
