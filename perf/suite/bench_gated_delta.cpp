// The gated delta rule (docs/linear-attention.md):
//   linear/native/gdr-prefill8k/t<N>: one sequence of 8192 tokens, H 16, Hv 32, Dk = Dv 128, f32,
//     L2 norm, in chunks; GFLOP/s of the chunk form's count (6 Dk Dv + 4 C Dk + 3 C Dv a token and
//     value head, C = 64)
//   linear/native/gdr-decode-b8/t<N>: one decode step of 8 sequences, Hv 32, 128 x 128 f32 states
//     carried in place; GB/s of 2 x the states' bytes (each read and written once)
//   linear/native/gdr-step-b1/t<N>: one decode step of the prefill's shape (B 1): 8192 of them
//     against gdr-prefill8k is the chunked form's gain over token-by-token
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/simdattn.hpp"

namespace {

constexpr std::int64_t kH = 16, kHv = 32, kD = 128, kChunk = 64;

struct Inputs {
  std::int64_t B, T;
  std::vector<float> q, k, v, g, beta, out, state;
  Inputs(std::int64_t b, std::int64_t t) : B(b), T(t) {
    std::mt19937 rng(5);
    std::normal_distribution<float> n;
    std::uniform_real_distribution<float> u(0.f, 1.f);
    auto fill = [&](std::vector<float>& x, std::int64_t count, float lo, float hi, bool normal) {
      x.resize(static_cast<std::size_t>(count));
      for (float& e : x) e = normal ? n(rng) : lo + (hi - lo) * u(rng);
    };
    fill(q, B * T * kH * kD, 0, 0, true), fill(k, B * T * kH * kD, 0, 0, true), fill(v, B * T * kHv * kD, 0, 0, true);
    fill(g, B * T * kHv, -0.1f, 0.f, false), fill(beta, B * T * kHv, 0.f, 1.f, false);
    out.assign(static_cast<std::size_t>(B * T * kHv * kD), 0.f);
    state.assign(static_cast<std::size_t>(B * kHv * kD * kD), 0.f);
  }
  void run(int threads, bool carry) {
    simdattn::GatedDeltaRuleOptions o;
    o.use_qk_l2norm = true;
    o.threads = threads;
    if (carry) {
      o.initial_state = simdattn::ConstTensorView(state.data(), {B, kHv, kD, kD});
      o.final_state = simdattn::TensorView(state.data(), {B, kHv, kD, kD});
    }
    simdattn::gated_delta_rule(simdattn::ConstTensorView(q.data(), {B, T, kH, kD}), simdattn::ConstTensorView(k.data(), {B, T, kH, kD}),
                               simdattn::ConstTensorView(v.data(), {B, T, kHv, kD}),
                               simdattn::ConstTensorView(g.data(), {B, T, kHv, 1}),
                               simdattn::ConstTensorView(beta.data(), {B, T, kHv, 1}),
                               simdattn::TensorView(out.data(), {B, T, kHv, kD}), o);
  }
};

void bench_prefill(benchmark::State& state, int threads) {
  static Inputs in(1, 8192);
  const double flops = double(6 * kD * kD + 4 * kChunk * kD + 3 * kChunk * kD) * double(in.T * kHv);
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] { in.run(threads, false); });
}

void bench_decode(benchmark::State& state, std::int64_t B, int threads) {
  Inputs in(B, 1);
  const double bytes = 2.0 * double(B * kHv * kD * kD) * 4.0;
  simdattn::perf::timed_loop(state, bytes, "GB/s", [&] { in.run(threads, true); });
}

int register_all() {
  for (int t : {1, 2}) {
    const std::string tn = "/t" + std::to_string(t);
    benchmark::RegisterBenchmark(("linear/native/gdr-prefill8k" + tn).c_str(), bench_prefill, t)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("linear/native/gdr-decode-b8" + tn).c_str(), bench_decode, std::int64_t{8}, t)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("linear/native/gdr-step-b1" + tn).c_str(), bench_decode, std::int64_t{1}, t)
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}
const int registered = register_all();

}  // namespace
