// The gated delta rule (docs/linear-attention.md):
//   linear/native/gdr-prefill8k/t<N>: one sequence of 8192 tokens, H 16, Hv 32, Dk = Dv 128, f32,
//     L2 norm, in chunks; GFLOP/s of the chunk form's count (6 Dk Dv + 4 C Dk + 3 C Dv a token and
//     value head, C = 32)
//   linear/native/gdr-decode-b8/t<N>: one decode step of 8 sequences, Hv 32, 128 x 128 f32 states
//     carried in place; GB/s of 2 x the states' bytes (each read and written once)
//   linear/native/gdr-step-b1/t<N>: one decode step of the prefill's shape (B 1): 8192 of them
//     against gdr-prefill8k is the chunked form's gain over token-by-token
//   linear/native/gdn-layer4k(.bf16)/t2: Qwen3-Next's linear-attention layer (GatedDeltaNet, hidden
//     2048, the shapes above, conv 4) on a 4096-token prompt; GFLOP/s of its projections and the
//     rule's chunk form
//   linear/native/gdn-core4k(.bf16)/t2: the layer's gated delta rule alone at those shapes (the
//     conv's output as q, k, v): its time over gdn-layer4k's is the core's share of the layer
//   linear/native/gdn-core4k.bf16-widened/t2: the same bf16 inputs with the chunks' products on
//     the f32 kernels (widened), where gdn-core4k.bf16 takes the bf16 pair kernels (on the CPUs
//     that prefer them: simd::bf16_pairs_preferred): the two are the choice's measure
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "linear_attention/gated_delta.hpp"
#include "perf_util.hpp"
#include "simdattn/simdattn.hpp"

namespace {

constexpr std::int64_t kH = 16, kHv = 32, kD = 128, kChunk = 32;  // the rule's chunk (gated_delta.cpp)

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

// Qwen3-Next's linear-attention layer at hidden 2048, random weights of its published shapes.
constexpr std::int64_t kHidden = 2048, kPrompt = 4096;

template <class T>
struct Layer {
  simdattn::GatedDeltaNet gdn;
  std::vector<T> x, y;
  static simdattn::GatedDeltaNet make() {
    std::mt19937 rng(9);
    std::normal_distribution<float> n(0.f, 0.02f);
    auto fill = [&](std::int64_t count) {
      std::vector<T> v(static_cast<std::size_t>(count));
      for (T& e : v) e = simdattn::detail::narrow<T>(n(rng));
      return v;
    };
    simdattn::GatedDeltaNetConfig c{.hidden_size = kHidden, .key_heads = kH, .value_heads = kHv, .key_head_dim = kD,
                                    .value_head_dim = kD, .conv_kernel = 4, .norm_eps = 1e-6};
    simdattn::GatedDeltaNetWeights<T> w;
    const std::int64_t conv_dim = 2 * kH * kD + kHv * kD;
    w.in_proj_qkvz = fill((2 * kH * kD + 2 * kHv * kD) * kHidden);
    w.in_proj_ba = fill(2 * kHv * kHidden);
    w.conv = fill(conv_dim * 4);
    w.out_proj = fill(kHidden * kHv * kD);
    w.dt_bias.assign(kHv, 1.f);
    w.A_log.assign(kHv, 0.5f);
    w.norm.assign(kD, 1.f);
    return simdattn::GatedDeltaNet(c, std::move(w));
  }
  Layer() : gdn(make()) {
    std::mt19937 rng(3);
    std::normal_distribution<float> n;
    x.resize(static_cast<std::size_t>(kPrompt * kHidden));
    for (T& e : x) e = simdattn::detail::narrow<T>(n(rng));
    y.resize(x.size());
  }
};

// The chunk form's FLOPs (bench_prefill's count) a token.
constexpr double kRuleFlopsPerToken = double(6 * kD * kD + 4 * kChunk * kD + 3 * kChunk * kD) * double(kHv);

template <class T>
void bench_layer(benchmark::State& state, int threads) {
  static Layer<T> in;
  const double proj = 2.0 * double(kHidden) * double(2 * kH * kD + 2 * kHv * kD + 2 * kHv + kHv * kD);
  simdattn::perf::timed_loop(state, (proj + kRuleFlopsPerToken) * kPrompt, "GFLOP/s", [&] {
    in.gdn.forward(simdattn::ConstSeqView(in.x.data(), 1, kPrompt, kHidden), simdattn::SeqView(in.y.data(), 1, kPrompt, kHidden),
                   nullptr, threads);
  });
}

template <class T>
void bench_core(benchmark::State& state, int threads, simdattn::detail::GdrProducts products) {
  // q, k, v read from one row of the conv's output a token, as the layer passes them
  static std::vector<T> qkv = [] {
    std::mt19937 rng(4);
    std::normal_distribution<float> n;
    std::vector<T> v(static_cast<std::size_t>(kPrompt * (2 * kH * kD + kHv * kD)));
    for (T& e : v) e = simdattn::detail::narrow<T>(n(rng));
    return v;
  }();
  static std::vector<float> gb = [] {
    std::vector<float> v(static_cast<std::size_t>(kPrompt * 2 * kHv));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = (i / kHv) % 2 == 0 ? -0.05f : 0.5f;
    return v;
  }();
  static std::vector<T> out(static_cast<std::size_t>(kPrompt * kHv * kD));
  const std::int64_t cd = 2 * kH * kD + kHv * kD;
  const auto dt = simdattn::dtype_of<T>();
  simdattn::GatedDeltaRuleOptions o;
  o.use_qk_l2norm = true;
  o.threads = threads;
  simdattn::perf::timed_loop(state, kRuleFlopsPerToken * kPrompt, "GFLOP/s", [&] {
    simdattn::detail::gated_delta_rule_on(
        products, simdattn::ConstTensorView(qkv.data(), dt, {1, kPrompt, kH, kD}, {0, cd, kD, 1}),
        simdattn::ConstTensorView(qkv.data() + kH * kD, dt, {1, kPrompt, kH, kD}, {0, cd, kD, 1}),
        simdattn::ConstTensorView(qkv.data() + 2 * kH * kD, dt, {1, kPrompt, kHv, kD}, {0, cd, kD, 1}),
        simdattn::ConstTensorView(gb.data(), simdattn::DType::f32, {1, kPrompt, kHv, 1}, {0, 2 * kHv, 1, 1}),
        simdattn::ConstTensorView(gb.data() + kHv, simdattn::DType::f32, {1, kPrompt, kHv, 1}, {0, 2 * kHv, 1, 1}),
        simdattn::TensorView(out.data(), dt, {1, kPrompt, kHv, kD}, {0, kHv * kD, kD, 1}), o);
  });
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
  for (const char* suffix : {"", ".bf16"}) {
    const bool bf16 = suffix[0] != '\0';
    const std::string sfx = std::string(suffix) + "/t2";
    benchmark::RegisterBenchmark(("linear/native/gdn-layer4k" + sfx).c_str(), bf16 ? bench_layer<simdattn::bfloat16> : bench_layer<float>, 2)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("linear/native/gdn-core4k" + sfx).c_str(), bf16 ? bench_core<simdattn::bfloat16> : bench_core<float>, 2,
                                 simdattn::detail::GdrProducts::automatic)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("linear/native/gdn-core4k.bf16-widened/t2", bench_core<simdattn::bfloat16>, 2,
                               simdattn::detail::GdrProducts::f32)
      ->Unit(benchmark::kMillisecond);
  return 0;
}
const int registered = register_all();

}  // namespace
