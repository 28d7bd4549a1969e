// attention/<backend>/<workload>/t<threads>: docs/design.md's standard workloads on each backend;
// attention/<backend>/<workload>.bf16/t<threads> and .f16: the same inputs rounded to bf16 / f16,
// on the fast backends that take them here (simdattn::backend_takes).
// attention/native/gpt-{alibi,softcap,t5bias,sinks}/t<threads>: gpt with one score modifier
// (standard ALiBi slopes; Gemma 2's cap 50; T5's one-way bias, 32 buckets, max distance 128;
// a sink per head), f32.
// attention/native/decode.int8|.fp8_e4m3|.fp8_e5m2/t<threads>: decode with K and V quantized
// (quantize_kv) from the same draws, q and out f32; GB/s of the codes, scales, q and out read.
// Counters: GFLOP/s (causal counts visible pairs only); GB/s for decode (Sq = 1), which is bound by
// reading K and V. Every backend of the build is registered, the reference only for workloads it
// finishes in seconds.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"

namespace {

// Inputs of one workload in T (float, or bf16/f16 rounded from the same normal draws).
template <class T>
struct Inputs {
  std::vector<T> q, k, v, o;
};

using simdattn::perf::from_float;

template <class T>
Inputs<T> make_inputs(const simdattn::Workload& w) {
  std::mt19937 rng(42);
  std::normal_distribution<float> n(0.f, 1.f);
  Inputs<T> in;
  in.q.resize(std::size_t(w.B * w.H * w.Sq * w.D));
  in.k.resize(std::size_t(w.B * w.Hkv * w.Sk * w.D));
  in.v.resize(std::size_t(w.B * w.Hkv * w.Sk * w.D));
  in.o.resize(std::size_t(w.B * w.H * w.Sq * w.D));
  for (auto* vec : {&in.q, &in.k, &in.v})
    for (auto& x : *vec) x = from_float<T>(n(rng));
  return in;
}

enum class Modifier { none, alibi, softcap, t5bias, sinks };

template <class T>
void bench_attention(benchmark::State& state, const simdattn::Workload& w, simdattn::Backend backend,
                     int threads, Modifier mod = Modifier::none) {
  Inputs<T> in = make_inputs<T>(w);
  simdattn::AttentionOptions opt;
  opt.causal = w.causal;
  opt.backend = backend;
  opt.threads = threads;
  const std::vector<float> slopes = simdattn::standard_alibi_slopes(w.H);
  std::vector<float> table(std::size_t(32 * w.H)), sinks(std::size_t(w.H));
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& x : table) x = n(rng);
  for (auto& x : sinks) x = n(rng);
  if (mod == Modifier::alibi) opt.alibi_slopes = slopes;
  if (mod == Modifier::softcap) opt.softcap = 50.0;
  if (mod == Modifier::t5bias)
    opt.relative_bias = simdattn::RelativePositionBias{simdattn::ConstTensorView(table.data(), {1, 1, 32, w.H}), false, 128};
  if (mod == Modifier::sinks) opt.sinks = sinks;
  const simdattn::ConstTensorView q(in.q.data(), {w.B, w.H, w.Sq, w.D});
  const simdattn::ConstTensorView k(in.k.data(), {w.B, w.Hkv, w.Sk, w.D});
  const simdattn::ConstTensorView v(in.v.data(), {w.B, w.Hkv, w.Sk, w.D});
  const simdattn::TensorView o(in.o.data(), {w.B, w.H, w.Sq, w.D});
  const auto call = [&] { simdattn::attention(q, k, v, o, opt); };
  if (w.Sq == 1) {  // decode: bound by reading K and V, so measured in GB/s of K, V, Q and O
    const double bytes = double(sizeof(T)) * double(w.B * w.Hkv * w.Sk * 2 * w.D + w.B * w.H * w.Sq * 2 * w.D);
    simdattn::perf::timed_loop(state, bytes, "GB/s", call);
  } else {
    const double flops = simdattn::attention_flops(w.B, w.H, w.Sq, w.Sk, w.D, w.D, w.causal);
    simdattn::perf::timed_loop(state, flops, "GFLOP/s", call);
  }
}

// A workload over 8-bit K/V codes of dtype `code`.
void bench_codes(benchmark::State& state, const simdattn::Workload& w, simdattn::DType code, int threads) {
  Inputs<float> in = make_inputs<float>(w);
  const simdattn::Shape4 ks{w.B, w.Hkv, w.Sk, w.D}, ss{w.B, w.Hkv, w.Sk, 1};
  std::vector<std::uint8_t> kc(in.k.size()), vc(in.v.size());
  std::vector<float> kscale(std::size_t(w.B * w.Hkv * w.Sk)), vscale(kscale.size());
  simdattn::quantize_kv(simdattn::ConstTensorView(in.k.data(), ks), code, simdattn::TensorView(kc.data(), code, ks),
                        simdattn::TensorView(kscale.data(), ss));
  simdattn::quantize_kv(simdattn::ConstTensorView(in.v.data(), ks), code, simdattn::TensorView(vc.data(), code, ks),
                        simdattn::TensorView(vscale.data(), ss));
  simdattn::AttentionOptions opt;
  opt.causal = w.causal;
  opt.threads = threads;
  opt.k_scale = simdattn::ConstTensorView(kscale.data(), ss);
  opt.v_scale = simdattn::ConstTensorView(vscale.data(), ss);
  const simdattn::ConstTensorView q(in.q.data(), {w.B, w.H, w.Sq, w.D});
  const simdattn::ConstTensorView k(kc.data(), code, ks), v(vc.data(), code, ks);
  const simdattn::TensorView o(in.o.data(), {w.B, w.H, w.Sq, w.D});
  const double bytes = double(w.B * w.Hkv * w.Sk) * (2.0 * double(w.D) + 8.0) + 4.0 * double(w.B * w.H * w.Sq * 2 * w.D);
  simdattn::perf::timed_loop(state, bytes, "GB/s", [&] { simdattn::attention(q, k, v, o, opt); });
}

// FLOPs per call above which the reference backend is not registered (it would take minutes).
constexpr double kReferenceMaxFlops = 2e9;

int register_all() {
  for (const auto& w : simdattn::standard_workloads()) {
    for (simdattn::Backend b :
         {simdattn::Backend::reference, simdattn::Backend::native, simdattn::Backend::onednn}) {
      if (!simdattn::backend_available(b)) continue;
      const double flops = simdattn::attention_flops(w.B, w.H, w.Sq, w.Sk, w.D, w.D, w.causal);
      if (b == simdattn::Backend::reference && flops > kReferenceMaxFlops) continue;
      for (int t : {1, 2}) {
        if (b == simdattn::Backend::reference && t != 1) continue;  // reference is single-threaded
        const std::string name = "attention/" + std::string(simdattn::backend_name(b)) + "/" +
                                 std::string(w.name) + "/t" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), bench_attention<float>, w, b, t, Modifier::none)
            ->Unit(benchmark::kMillisecond)
            ;
        if (b == simdattn::Backend::native && t == 2)  // the same on OpenMP's threads
          benchmark::RegisterBenchmark(("attention/native/" + std::string(w.name) + ".openmp/t2").c_str(),
                                       [w](benchmark::State& s) {
                                         simdattn::perf::on_runtime(s, simdattn::ThreadRuntime::openmp, [&](auto& st) {
                                           bench_attention<float>(st, w, simdattn::Backend::native, 2, Modifier::none);
                                         });
                                       })
              ->Unit(benchmark::kMillisecond);
      }
    }
    // bf16 and f16 on the fast backends that take them here, named with the dtype after the
    // workload.
    for (simdattn::Backend b : {simdattn::Backend::native, simdattn::Backend::onednn})
      for (int t : {1, 2}) {
        const std::string base = "attention/" + std::string(simdattn::backend_name(b)) + "/" + std::string(w.name);
        if (simdattn::backend_takes(b, simdattn::DType::bf16))
          benchmark::RegisterBenchmark((base + ".bf16/t" + std::to_string(t)).c_str(),
                                       bench_attention<simdattn::bfloat16>, w, b, t, Modifier::none)
              ->Unit(benchmark::kMillisecond);
        if (simdattn::backend_takes(b, simdattn::DType::f16))
          benchmark::RegisterBenchmark((base + ".f16/t" + std::to_string(t)).c_str(),
                                       bench_attention<simdattn::float16>, w, b, t, Modifier::none)
              ->Unit(benchmark::kMillisecond);
      }
  }
  // decode over 8-bit K/V codes
  const simdattn::Workload& decode = *simdattn::find_workload("decode");
  for (simdattn::DType code : {simdattn::DType::int8, simdattn::DType::fp8_e4m3, simdattn::DType::fp8_e5m2})
    for (int t : {1, 2})
      benchmark::RegisterBenchmark(
          ("attention/native/decode." + std::string(simdattn::dtype_name(code)) + "/t" + std::to_string(t)).c_str(),
          bench_codes, decode, code, t)
          ->Unit(benchmark::kMillisecond);
  // gpt with one modifier each (native, f32)
  const simdattn::Workload& gpt = *simdattn::find_workload("gpt");
  for (auto [name, mod] : {std::pair{"alibi", Modifier::alibi}, std::pair{"softcap", Modifier::softcap},
                           std::pair{"t5bias", Modifier::t5bias}, std::pair{"sinks", Modifier::sinks}})
    for (int t : {1, 2})
      benchmark::RegisterBenchmark(("attention/native/gpt-" + std::string(name) + "/t" + std::to_string(t)).c_str(),
                                   bench_attention<float>, gpt, simdattn::Backend::native, t, mod)
          ->Unit(benchmark::kMillisecond);
  return 0;
}

const int registered = register_all();

}  // namespace
