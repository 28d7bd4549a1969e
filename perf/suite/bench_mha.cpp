// mha/<backend>/{bert-layer,gpt-layer}/t<N>, mha/native/llama-layer/t<N>: the whole layer (four
// projections + attention core) on docs/design.md's layer workloads; GFLOP/s counts
// 2*B*S*d*(2*H*hd + 2*Hkv*hd) for the projections (8*B*S*d^2 without grouped heads) plus the
// core's visible-pair FLOPs. native: projections on the native GEMM; onednn: every product on
// oneDNN (projections and attention core).
//
// decode/<backend>/gpt-layer-kv<N>/t<N>, decode/native/llama-layer-kv4096/t<N>: one decode step
// (B=1, one new token) of that layer against a KV cache holding N tokens; the cache is truncated
// back to N after every step. GB/s counts the bytes a step must read (the four weight matrices
// and the cache's K and V); counters p50_ms, p90_ms, p99_ms give the latency distribution over
// all steps timed.
//
// mha/native/<layer>.bf16 and .f16, decode/native/gpt-layer-kv<N>.bf16 and .f16: the same
// layers with weights, inputs and cache rounded to that dtype (bytes counted in 2-byte elements).
// decode/native/gpt-layer-kv4096.int8 and .fp8_e4m3: the f32 layer over an 8-bit cache (a byte
// per element and a 4-byte scale per row counted); .bf16.int8: the bf16 layer over an int8 cache.
//
// prefill/native/gpt-layer-chunks256-kv4096.bf16[.int8]/t<N>: the bf16 gpt layer prefilling a
// 4096-token prompt in chunks of 256 into a bf16 (or int8) KvCache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"

namespace {

struct LayerWorkload {
  const char* name;
  std::int64_t B, S, d, H, Hkv;
  simdattn::Causal causal;
  bool rope = false;  // RoPE on q and k (theta 500000, rotate_half over the whole head)
};
constexpr LayerWorkload kLayers[] = {{"bert-layer", 1, 128, 768, 12, 12, simdattn::Causal::none},
                                     {"gpt-layer", 1, 1024, 1024, 16, 16, simdattn::Causal::top_left}};
// Llama 3.2 1B's attention layer (d_model 2048, 32 heads of 64, 8 kv heads), native only
constexpr LayerWorkload kLlama{"llama-layer", 1, 1024, 2048, 32, 8, simdattn::Causal::top_left, true};

using simdattn::perf::from_float;

template <class T>
simdattn::MultiHeadAttention make_layer(std::int64_t d, std::int64_t H, std::int64_t Hkv, bool rope = false,
                                        double theta = 10000.0) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 1.f / 32.f);
  auto v = [&](std::int64_t k) {
    std::vector<T> x(static_cast<std::size_t>(k));
    for (T& e : x) e = from_float<T>(n(rng));
    return x;
  };
  simdattn::MhaConfig cfg{.d_model = d, .heads = H, .kv_heads = Hkv};
  if (rope) cfg.rope = simdattn::RopeConfig{.theta = theta};  // rotate_half over the whole head
  const std::int64_t nkv = d / H * Hkv;
  return simdattn::MultiHeadAttention(cfg,
                                      simdattn::MhaWeights<T>{v(d * d), v(nkv * d), v(nkv * d), v(d * d), v(d), v(nkv),
                                                              v(nkv), v(d)});
}

// The projections' FLOPs of a layer: q and o d x d, k and v d x (Hkv * hd).
double projection_flops(const LayerWorkload& w) {
  const double nkv = double(w.d / w.H * w.Hkv);
  return 2.0 * double(w.B * w.S) * double(w.d) * (2.0 * double(w.d) + 2.0 * nkv);
}

template <class T>
void bench_layer(benchmark::State& state, LayerWorkload w, simdattn::Backend backend, int threads, bool rope = false) {
  const auto layer = make_layer<T>(w.d, w.H, w.Hkv, rope || w.rope, w.rope ? 500000.0 : 10000.0);
  std::vector<T> x(static_cast<std::size_t>(w.B * w.S * w.d), from_float<T>(0.1f)), y(x.size());
  simdattn::MhaOptions opt;
  opt.backend = backend;
  opt.threads = threads;
  opt.causal = w.causal;
  const double flops = projection_flops(w) + simdattn::attention_flops(w.B, w.H, w.S, w.S, w.d / w.H, w.d / w.H, w.causal);
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
    layer.forward(simdattn::ConstSeqView(x.data(), w.B, w.S, w.d), simdattn::SeqView(y.data(), w.B, w.S, w.d), opt);
  });
}

template <class T>
void bench_decode_cache(benchmark::State& state, LayerWorkload w, std::int64_t cached, simdattn::Backend backend,
                        int threads, simdattn::DType cache_dtype) {
  const std::int64_t d = w.d, nkv = w.d / w.H * w.Hkv;
  const auto layer = make_layer<T>(d, w.H, w.Hkv, w.rope, 500000.0);
  simdattn::KvCache cache(layer, 1, cached + 1, cache_dtype);
  simdattn::MhaOptions opt;
  opt.backend = backend;
  opt.threads = threads;
  {  // fill the cache with `cached` tokens
    std::vector<T> x(static_cast<std::size_t>(cached * d), from_float<T>(0.1f)), y(x.size());
    layer.forward(simdattn::ConstSeqView(x.data(), 1, cached, d), cache, simdattn::SeqView(y.data(), 1, cached, d), opt);
  }
  std::vector<T> x(static_cast<std::size_t>(d), from_float<T>(0.2f)), y(x.size());
  auto step = [&] {
    layer.forward(simdattn::ConstSeqView(x.data(), 1, 1, d), cache, simdattn::SeqView(y.data(), 1, 1, d), opt);
    cache.truncate(0, cached);
  };
  step();  // warm-up
  std::vector<double> ms;
  ms.reserve(100000);
  const bool codes = simdattn::is_kv_code(cache_dtype);  // a byte per element, a 4-byte scale per row
  const double cache_bytes = 2.0 * double(cached) *
                             (double(nkv) * double(simdattn::dtype_size(cache_dtype)) + (codes ? 4.0 * double(w.Hkv) : 0.0));
  const double bytes = double(sizeof(T)) * (2.0 * double(d) * double(d) + 2.0 * double(nkv) * double(d)) + cache_bytes;
  simdattn::perf::timed_loop(state, bytes, "GB/s", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  });
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(p * double(ms.size())))]; };
  state.counters["p50_ms"] = pct(0.50);
  state.counters["p90_ms"] = pct(0.90);
  state.counters["p99_ms"] = pct(0.99);
}

// A 4096-token prompt prefilled through the layer in chunks of 256 into a cache of cache_dtype
// (reset before each prefill); GFLOP/s counts the projections and the visible pairs.
template <class T>
void bench_chunked_prefill(benchmark::State& state, LayerWorkload w, simdattn::DType cache_dtype, int threads) {
  constexpr std::int64_t kPrompt = 4096, kChunk = 256;
  const std::int64_t d = w.d;
  const auto layer = make_layer<T>(d, w.H, w.Hkv, w.rope, 500000.0);
  simdattn::KvCache cache(layer, 1, kPrompt, cache_dtype);
  simdattn::MhaOptions opt;
  opt.threads = threads;
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<T> x(static_cast<std::size_t>(kPrompt * d)), y(static_cast<std::size_t>(kChunk * d));
  for (auto& e : x) e = from_float<T>(n(rng));
  LayerWorkload whole = w;
  whole.S = kPrompt;
  const double flops = projection_flops(whole) + simdattn::attention_flops(1, w.H, kPrompt, kPrompt, d / w.H, d / w.H,
                                                                             simdattn::Causal::top_left);
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
    cache.reset();
    for (std::int64_t t = 0; t < kPrompt; t += kChunk)
      layer.forward(simdattn::ConstSeqView(x.data() + t * d, 1, kChunk, d), cache, simdattn::SeqView(y.data(), 1, kChunk, d), opt);
  });
}

template <class T>
void bench_decode(benchmark::State& state, LayerWorkload w, std::int64_t cached, simdattn::Backend backend, int threads) {
  bench_decode_cache<T>(state, w, cached, backend, threads, simdattn::dtype_of<T>());
}

int register_all() {
  using simdattn::Backend;
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn}) {
    if (!simdattn::backend_available(b)) continue;
    const std::string be(simdattn::backend_name(b));
    for (int t : {1, 2}) {
      if (b == Backend::reference && t != 1) continue;  // the reference core is single-threaded
      const std::string ts = "/t" + std::to_string(t);
      for (const LayerWorkload& w : kLayers) {
        if (b == Backend::reference && std::string(w.name) != "bert-layer") continue;  // minutes otherwise
        benchmark::RegisterBenchmark(("mha/" + be + "/" + w.name + ts).c_str(), bench_layer<float>, w, b, t, false)
            ->Unit(benchmark::kMillisecond);
        if (b == Backend::native && t == 2)  // the same on OpenMP's threads
          benchmark::RegisterBenchmark(("mha/native/" + std::string(w.name) + ".openmp/t2").c_str(),
                                       [w](benchmark::State& s) {
                                         simdattn::perf::on_runtime(s, simdattn::ThreadRuntime::openmp, [&](auto& st) {
                                           bench_layer<float>(st, w, Backend::native, 2, false);
                                         });
                                       })
              ->Unit(benchmark::kMillisecond);
        if (b == Backend::native && std::string(w.name) == "gpt-layer")  // with RoPE on q and k
          benchmark::RegisterBenchmark(("mha/native/gpt-layer-rope" + ts).c_str(), bench_layer<float>, w, b, t, true)
              ->Unit(benchmark::kMillisecond);
        if (b != Backend::native) continue;
        benchmark::RegisterBenchmark(("mha/native/" + std::string(w.name) + ".bf16" + ts).c_str(),
                                     bench_layer<simdattn::bfloat16>, w, b, t, false)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("mha/native/" + std::string(w.name) + ".f16" + ts).c_str(),
                                     bench_layer<simdattn::float16>, w, b, t, false)
            ->Unit(benchmark::kMillisecond);
      }
      if (b == Backend::reference) continue;
      for (std::int64_t n : {512, 4096}) {
        const std::string name = "decode/" + be + "/gpt-layer-kv" + std::to_string(n);
        benchmark::RegisterBenchmark((name + ts).c_str(), bench_decode<float>, kLayers[1], n, b, t)
            ->Unit(benchmark::kMillisecond);
        if (b != Backend::native) continue;
        benchmark::RegisterBenchmark((name + ".bf16" + ts).c_str(), bench_decode<simdattn::bfloat16>, kLayers[1], n, b, t)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark((name + ".f16" + ts).c_str(), bench_decode<simdattn::float16>, kLayers[1], n, b, t)
            ->Unit(benchmark::kMillisecond);
        if (n != 4096) continue;  // the f32 layer over 8-bit caches
        for (simdattn::DType code : {simdattn::DType::int8, simdattn::DType::fp8_e4m3})
          benchmark::RegisterBenchmark((name + "." + std::string(simdattn::dtype_name(code)) + ts).c_str(),
                                       bench_decode_cache<float>, kLayers[1], n, b, t, code)
              ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark((name + ".bf16.int8" + ts).c_str(), bench_decode_cache<simdattn::bfloat16>, kLayers[1],
                                     n, b, t, simdattn::DType::int8)
            ->Unit(benchmark::kMillisecond);
      }
      if (b != Backend::native) continue;
      // chunked prefill of the bf16 gpt layer over a bf16 and an int8 cache
      benchmark::RegisterBenchmark(("prefill/native/gpt-layer-chunks256-kv4096.bf16" + ts).c_str(),
                                   bench_chunked_prefill<simdattn::bfloat16>, kLayers[1], simdattn::DType::bf16, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("prefill/native/gpt-layer-chunks256-kv4096.bf16.int8" + ts).c_str(),
                                   bench_chunked_prefill<simdattn::bfloat16>, kLayers[1], simdattn::DType::int8, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("mha/native/llama-layer" + ts).c_str(), bench_layer<float>, kLlama, b, t, false)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("mha/native/llama-layer.bf16" + ts).c_str(), bench_layer<simdattn::bfloat16>, kLlama,
                                   b, t, false)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decode/native/llama-layer-kv4096" + ts).c_str(), bench_decode<float>, kLlama, 4096,
                                   b, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decode/native/llama-layer-kv4096.bf16" + ts).c_str(),
                                   bench_decode<simdattn::bfloat16>, kLlama, 4096, b, t)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
