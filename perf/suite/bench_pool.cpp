// mha/native/pool-step/s<S>-kv<N>/t<T>: one MultiHeadAttention::forward_pool call of S decode
// steps of the gpt-layer stand-in (d_model 1024, 16 heads, f32), each sequence holding N tokens
// in a KvPool of kDefaultBlockSize blocks (filled once per (S, N) by a prefill through the layer; each step's
// token is truncated away again). Counter GB/s: the bytes a step reads, the layer's weights once
// (4 x 1024^2 f32, 16 MiB) and every stream's K and V (S x N x 2 x 1024 x 4 bytes); against
// bandwidth/read/t<T> of the same run. .int8: the same over an int8 pool (a byte per element and a
// 4-byte scale per row counted).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpt_layer.hpp"
#include "perf_util.hpp"
#include "simdattn/simdattn.hpp"

namespace {

constexpr std::int64_t kD = simdattn::perf::kGptD;
using simdattn::perf::gpt_layer;


// The pool of the last (S, N) asked for, filled once (the next configuration replaces it).
struct Filled {
  std::int64_t streams = 0, kv = 0;
  simdattn::DType dtype = simdattn::DType::f32;
  std::unique_ptr<simdattn::KvPool> pool;
  std::vector<simdattn::KvPool::Sequence> seqs;
};

Filled& filled(const simdattn::MultiHeadAttention& layer, std::int64_t S, std::int64_t N, simdattn::DType dtype) {
  static Filled f;
  if (f.streams == S && f.kv == N && f.dtype == dtype) return f;
  f.pool.reset();
  f.seqs.clear();
  f.pool = std::make_unique<simdattn::KvPool>(layer, S * (N / simdattn::kDefaultBlockSize + 2), simdattn::kDefaultBlockSize,
                                              1, dtype);
  f.dtype = dtype;
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(N * kD)), y(x.size());
  for (std::int64_t s = 0; s < S; ++s) {
    for (auto& e : x) e = n(rng);
    f.seqs.push_back(f.pool->add());
    const simdattn::PoolStep prompt{simdattn::ConstSeqView(x.data(), 1, N, kD), f.seqs.back(),
                                    simdattn::SeqView(y.data(), 1, N, kD)};
    layer.forward_pool({&prompt, 1}, *f.pool);
  }
  f.streams = S, f.kv = N;
  return f;
}

void bench_pool_step(benchmark::State& state, std::int64_t S, std::int64_t N, int threads, simdattn::DType dtype) {
  static const simdattn::MultiHeadAttention layer = gpt_layer();
  Filled& f = filled(layer, S, N, dtype);
  std::vector<float> x(static_cast<std::size_t>(S * kD), 0.5f), y(x.size());
  std::vector<simdattn::PoolStep> steps;
  for (std::int64_t s = 0; s < S; ++s)
    steps.push_back({simdattn::ConstSeqView(x.data() + s * kD, 1, 1, kD), f.seqs[static_cast<std::size_t>(s)],
                     simdattn::SeqView(y.data() + s * kD, 1, 1, kD)});
  simdattn::MhaOptions opt;
  opt.threads = threads;
  const double row = simdattn::is_kv_code(dtype) ? kD + 4.0 * simdattn::perf::kGptHeads : 4.0 * kD;  // a token's K or V
  const double bytes = 4.0 * kD * kD * 4 + double(S) * double(N) * 2 * row;
  simdattn::perf::timed_loop(state, bytes, "GB/s", [&] {
    layer.forward_pool(steps, *f.pool, 0, opt);
    for (auto s : f.seqs) f.pool->truncate(s, N);
  });
}

int register_all() {
  for (std::int64_t S : {8, 32})
    for (std::int64_t N : {256, 1024, 4096})
      for (int t : {1, 2}) {
        const std::string name = "mha/native/pool-step/s" + std::to_string(S) + "-kv" + std::to_string(N),
                          ts = "/t" + std::to_string(t);
        benchmark::RegisterBenchmark((name + ts).c_str(), bench_pool_step, S, N, t, simdattn::DType::f32)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark((name + ".int8" + ts).c_str(), bench_pool_step, S, N, t, simdattn::DType::int8)
            ->Unit(benchmark::kMillisecond);
      }
  return 0;
}

const int registered = register_all();

}  // namespace
