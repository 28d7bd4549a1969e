// Decode shapes of grouped heads, and a prompt chunk over a paged cache (docs/performance.md,
// "Decode shapes and their roofline"; perf/suite/decode_roofline.py turns a run into roofline shares):
//   attention/native/<shape>-decode[.bf16|.int8]/t<N>: one sequence's decode step, f32, bf16 or
//     int8 K/V (q and out f32 with int8), GB/s of the K and V read:
//       mha8     H 8,   Hkv 8, 16384 keys, D 128   (the byte rate of gqa4 / gqa8's K and V)
//       gqa4     H 32,  Hkv 8, 16384 keys, D 128   (Llama 3, Mistral)
//       gqa8     H 64,  Hkv 8, 16384 keys, D 128
//       mha1     H 1,   Hkv 1, 131072 keys, D 128  (the byte rate of mqa's)
//       mqa      H 32,  Hkv 1, 131072 keys, D 128
//       mqa32k   H 32,  Hkv 1, 32768 keys, D 128   (t1 and t2: the key split over threads)
//       mla16    H 16,  Hkv 1, 8192 keys, D 576, Dv 512, V a view of K's first 512 columns
//       mla128   H 128, the same                   (DeepSeek's absorbed latent decode)
//       mla1     H 1,   Hkv 1, 8192 keys, D 576, V a view of K (the byte rate of mla's)
//       mla128k4 H 128, 4096 keys (DeepSeek-V3's decode step at 4096 tokens; t1 and t2), and its
//       mla1k4   byte-rate row H 1
//   attention/native/chunk512-{dense,paged16}[.bf16]/t<N>: 512 query tokens over 4096 keys (a
//     prompt chunk after 3584 cached tokens), H 32, Hkv 8, D 128, bottom-right causal: dense
//     views, and the same keys in blocks of 16 tokens of a KvPool-layout cache, shuffled.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"

namespace {

using simdattn::perf::from_float;

struct DecodeShape {
  const char* name;
  std::int64_t H, Hkv, Sk, D, Dv;
  bool v_of_k;  // V a view of K's first Dv columns (MLA's latent cache)
};

constexpr DecodeShape kShapes[] = {
    {"mha8", 8, 8, 16384, 128, 128, false},    {"gqa4", 32, 8, 16384, 128, 128, false},
    {"gqa8", 64, 8, 16384, 128, 128, false},   {"mha1", 1, 1, 131072, 128, 128, false},
    {"mqa", 32, 1, 131072, 128, 128, false},   {"mqa32k", 32, 1, 32768, 128, 128, false},
    {"mla1", 1, 1, 8192, 576, 512, true},      {"mla16", 16, 1, 8192, 576, 512, true},
    {"mla128", 128, 1, 8192, 576, 512, true},  {"mla1k4", 1, 1, 4096, 576, 512, true},
    {"mla128k4", 128, 1, 4096, 576, 512, true},
};

std::vector<float> normal(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& e : x) e = d(rng);
  return x;
}

// The K and V bytes a step reads: V's own only when it is not a view of K.
double kv_bytes(const DecodeShape& s, double elem) {
  return double(s.Hkv) * double(s.Sk) * (double(s.D) + (s.v_of_k ? 0.0 : double(s.Dv))) * elem;
}

template <class T>
void bench_decode(benchmark::State& state, DecodeShape s, int threads) {
  const auto qf = normal(std::size_t(s.H * s.D), 1), kf = normal(std::size_t(s.Hkv * s.Sk * s.D), 2),
             vf = normal(std::size_t(s.Hkv * s.Sk * s.Dv), 3);
  std::vector<T> q(qf.size()), k(kf.size()), v(s.v_of_k ? 0 : vf.size()), o(std::size_t(s.H * s.Dv));
  std::transform(qf.begin(), qf.end(), q.begin(), from_float<T>);
  std::transform(kf.begin(), kf.end(), k.begin(), from_float<T>);
  if (!s.v_of_k) std::transform(vf.begin(), vf.end(), v.begin(), from_float<T>);
  const simdattn::ConstTensorView kv(k.data(), {1, s.Hkv, s.Sk, s.D});
  const simdattn::ConstTensorView vv = s.v_of_k ? simdattn::ConstTensorView(k.data(), {1, s.Hkv, s.Sk, s.Dv}, kv.strides)
                                                : simdattn::ConstTensorView(v.data(), {1, s.Hkv, s.Sk, s.Dv});
  simdattn::AttentionOptions opt;
  opt.threads = threads;
  simdattn::perf::timed_loop(state, kv_bytes(s, sizeof(T)), "GB/s", [&] {
    simdattn::attention(simdattn::ConstTensorView(q.data(), {1, s.H, 1, s.D}), kv, vv,
                        simdattn::TensorView(o.data(), {1, s.H, 1, s.Dv}), opt);
  });
}

// The same over int8 codes of K and V (one f32 scale a row), q and out f32.
void bench_decode_int8(benchmark::State& state, DecodeShape s, int threads) {
  const auto q = normal(std::size_t(s.H * s.D), 1), kf = normal(std::size_t(s.Hkv * s.Sk * s.D), 2),
             vf = normal(std::size_t(s.Hkv * s.Sk * s.Dv), 3);
  std::vector<float> o(std::size_t(s.H * s.Dv)), ks(std::size_t(s.Hkv * s.Sk)), vs(ks.size());
  std::vector<std::uint8_t> kc(kf.size()), vc(s.v_of_k ? 0 : vf.size());
  const simdattn::DType i8 = simdattn::DType::int8;
  const simdattn::Shape4 kshape{1, s.Hkv, s.Sk, s.D}, vshape{1, s.Hkv, s.Sk, s.Dv}, sshape{1, s.Hkv, s.Sk, 1};
  simdattn::quantize_kv(simdattn::ConstTensorView(kf.data(), kshape), i8, simdattn::TensorView(kc.data(), i8, kshape),
                        simdattn::TensorView(ks.data(), sshape));
  if (!s.v_of_k)
    simdattn::quantize_kv(simdattn::ConstTensorView(vf.data(), vshape), i8, simdattn::TensorView(vc.data(), i8, vshape),
                          simdattn::TensorView(vs.data(), sshape));
  const simdattn::ConstTensorView kv(kc.data(), i8, kshape);
  const simdattn::ConstTensorView vv = s.v_of_k ? simdattn::ConstTensorView(kc.data(), i8, vshape, kv.strides)
                                                : simdattn::ConstTensorView(vc.data(), i8, vshape);
  simdattn::AttentionOptions opt;
  opt.threads = threads;
  opt.k_scale = simdattn::ConstTensorView(ks.data(), sshape);
  opt.v_scale = simdattn::ConstTensorView(s.v_of_k ? ks.data() : vs.data(), sshape);
  simdattn::perf::timed_loop(state, kv_bytes(s, 1.0) + double(s.Hkv * s.Sk) * 8.0, "GB/s", [&] {
    simdattn::attention(simdattn::ConstTensorView(q.data(), {1, s.H, 1, s.D}), kv, vv,
                        simdattn::TensorView(o.data(), {1, s.H, 1, s.Dv}), opt);
  });
}

// A prompt chunk: 512 queries over 4096 keys, dense or in shuffled blocks of 16 (a KvPool's
// layout: a block's kv heads one after another, each block_size rows of D).
constexpr std::int64_t kChunkH = 32, kChunkHkv = 8, kChunkD = 128, kChunkQ = 512, kChunkKeys = 4096, kChunkBlock = 16;

template <class T>
void bench_chunk(benchmark::State& state, bool paged, int threads) {
  const std::int64_t blocks = kChunkKeys / kChunkBlock;
  const auto qf = normal(std::size_t(kChunkQ * kChunkH * kChunkD), 4), kf = normal(std::size_t(kChunkKeys * kChunkHkv * kChunkD), 5),
             vf = normal(std::size_t(kChunkKeys * kChunkHkv * kChunkD), 6);
  std::vector<T> q(qf.size()), k(kf.size()), v(vf.size()), o(q.size());
  std::transform(qf.begin(), qf.end(), q.begin(), from_float<T>);
  std::transform(kf.begin(), kf.end(), k.begin(), from_float<T>);
  std::transform(vf.begin(), vf.end(), v.begin(), from_float<T>);
  const double flops = simdattn::attention_flops(1, kChunkH, kChunkQ, kChunkKeys, kChunkD, kChunkD, simdattn::Causal::bottom_right);
  if (!paged) {  // q and out [1, H, Sq, D] as views of the tokens' rows [Sq, H, D]; K and V [1, Hkv, Sk, D]
    const simdattn::Shape4 qs{kChunkQ * kChunkH * kChunkD, kChunkD, kChunkH * kChunkD, 1};
    simdattn::AttentionOptions opt;
    opt.causal = simdattn::Causal::bottom_right;
    opt.threads = threads;
    simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
      simdattn::attention(simdattn::ConstTensorView(q.data(), {1, kChunkH, kChunkQ, kChunkD}, qs),
                          simdattn::ConstTensorView(k.data(), {1, kChunkHkv, kChunkKeys, kChunkD}),
                          simdattn::ConstTensorView(v.data(), {1, kChunkHkv, kChunkKeys, kChunkD}),
                          simdattn::TensorView(o.data(), {1, kChunkH, kChunkQ, kChunkD}, qs), opt);
    });
    return;
  }
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  const simdattn::Shape4 st{kChunkHkv * kChunkBlock * kChunkD, kChunkD, kChunkBlock * kChunkD, 1};
  const std::int64_t lens[1] = {kChunkKeys}, starts[2] = {0, kChunkQ};
  simdattn::PagedAttentionOptions opt;
  opt.query_start = starts;
  opt.threads = threads;
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
    simdattn::attention_paged(simdattn::ConstTensorView(q.data(), {1, kChunkQ, kChunkH, kChunkD}),
                              simdattn::ConstTensorView(k.data(), {blocks, kChunkBlock, kChunkHkv, kChunkD}, st),
                              simdattn::ConstTensorView(v.data(), {blocks, kChunkBlock, kChunkHkv, kChunkD}, st),
                              {table.data(), 1, blocks, blocks}, lens,
                              simdattn::TensorView(o.data(), {1, kChunkQ, kChunkH, kChunkD}), opt);
  });
}

int register_all() {
  for (const DecodeShape& s : kShapes)
    for (int t : {1, 2}) {
      const std::string base = "attention/native/" + std::string(s.name) + "-decode", tn = "/t" + std::to_string(t);
      benchmark::RegisterBenchmark((base + tn).c_str(), bench_decode<float>, s, t)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + ".bf16" + tn).c_str(), bench_decode<simdattn::bfloat16>, s, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + ".int8" + tn).c_str(), bench_decode_int8, s, t)->Unit(benchmark::kMillisecond);
    }
  for (bool paged : {false, true})
    for (int t : {1, 2}) {
      const std::string base = std::string("attention/native/chunk512-") + (paged ? "paged16" : "dense"), tn = "/t" + std::to_string(t);
      benchmark::RegisterBenchmark((base + tn).c_str(), bench_chunk<float>, paged, t)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + ".bf16" + tn).c_str(), bench_chunk<simdattn::bfloat16>, paged, t)
          ->Unit(benchmark::kMillisecond);
    }
  return 0;
}

const int registered = register_all();

}  // namespace
