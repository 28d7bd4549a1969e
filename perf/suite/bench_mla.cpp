// DeepSeek's Multi-head Latent Attention layers decoding over a KvPool of latent rows (bf16):
//   mha/native/mla-v2lite-decode8.bf16/t<N>: DeepSeek-V2-Lite's shape (hidden 2048, 16 heads, no q
//     LoRA, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128)
//   mha/native/mla-v3-decode8.bf16/t<N>: DeepSeek-V3's (hidden 7168, 128 heads, q_lora_rank 1536)
// one decode step of 8 sequences with 4096 cached tokens each, one forward_pool batch (the
// absorbed form), blocks of 64. Counters: GB/s of the bytes the step must read (the attention
// weights as the layer keeps them, W_UK and W_UV in place of kv_b, and the 8 x 4096 latent rows)
// and GFLOP/s of its multiply-adds (projections and attention); perf/suite/mla_roofline.py holds
// the step to max(bytes / bandwidth/read/t2, FLOPs / (0.4 x peak/fma/t2)) of the same run. The
// pool is filled by a small MLA layer of the same latent widths (the timed layer's latent rows
// would be as many bytes; their values do not change the time).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/simdattn.hpp"

namespace {

using simdattn::bfloat16;
using simdattn::perf::from_float;

constexpr std::int64_t kStreams = 8, kCached = 4096, kBlock = 64, kKvLora = 512, kRope = 64;

struct MlaShape {
  const char* name;
  std::int64_t d, H, q_lora, nope, v;
};
constexpr MlaShape kV2Lite{"mla-v2lite", 2048, 16, 0, 128, 128}, kV3{"mla-v3", 7168, 128, 1536, 128, 128};

simdattn::MhaConfig config_of(const MlaShape& s) {
  simdattn::MhaConfig c{.d_model = s.d, .heads = s.H};
  c.mla = simdattn::MlaConfig{.q_lora_rank = s.q_lora, .kv_lora_rank = kKvLora, .qk_nope_head_dim = s.nope,
                              .qk_rope_head_dim = kRope, .v_head_dim = s.v};
  c.rope = simdattn::RopeConfig{.theta = 10000.0, .style = simdattn::RopeStyle::interleaved};
  c.causal = true;
  return c;
}

simdattn::MlaWeights<bfloat16> weights_of(const MlaShape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  auto w = [&](std::int64_t count) {
    std::vector<bfloat16> e(static_cast<std::size_t>(count));
    for (auto& x : e) x = from_float<bfloat16>(n(rng));
    return e;
  };
  const std::int64_t qk = s.nope + kRope;
  simdattn::MlaWeights<bfloat16> m;
  if (s.q_lora > 0) {
    m.wq_a = w(s.q_lora * s.d), m.q_a_norm.assign(static_cast<std::size_t>(s.q_lora), 1.f), m.wq_b = w(s.H * qk * s.q_lora);
  } else {
    m.wq = w(s.H * qk * s.d);
  }
  m.wkv_a = w((kKvLora + kRope) * s.d), m.kv_a_norm.assign(kKvLora, 1.f);
  m.wkv_b = w(s.H * (s.nope + s.v) * kKvLora);
  m.wo = w(s.d * s.H * s.v);
  return m;
}

// The timed layer, and a pool of kStreams sequences of kCached tokens filled by a small layer of
// the same latent widths.
struct Setup {
  std::unique_ptr<simdattn::MultiHeadAttention> layer;
  std::unique_ptr<simdattn::KvPool> pool;
  std::vector<simdattn::KvPool::Sequence> seqs;
  explicit Setup(const MlaShape& s) {
    layer = std::make_unique<simdattn::MultiHeadAttention>(config_of(s), weights_of(s, 3));
    const MlaShape small{"filler", 64, 1, 0, 16, 16};
    const simdattn::MultiHeadAttention filler(config_of(small), weights_of(small, 4));
    pool = std::make_unique<simdattn::KvPool>(filler, kStreams * (kCached / kBlock + 1), kBlock, 1, simdattn::DType::bf16);
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<bfloat16> x(static_cast<std::size_t>(kCached * small.d)), y(x.size());
    for (auto& e : x) e = from_float<bfloat16>(n(rng));
    for (std::int64_t i = 0; i < kStreams; ++i) {
      seqs.push_back(pool->add());
      const simdattn::PoolStep step{simdattn::ConstSeqView(x.data(), 1, kCached, small.d), seqs.back(),
                                    simdattn::SeqView(y.data(), 1, kCached, small.d)};
      filler.forward_pool({&step, 1}, *pool);
    }
  }
};

void bench_mla_decode(benchmark::State& state, MlaShape s, int threads) {
  static std::unique_ptr<Setup> v2, v3;
  std::unique_ptr<Setup>& setup = s.H == kV3.H ? v3 : v2;
  if (!setup) setup = std::make_unique<Setup>(s);
  const std::int64_t qk = s.nope + kRope, W = kKvLora + kRope;
  std::vector<bfloat16> x(static_cast<std::size_t>(kStreams * s.d)), y(x.size());
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& e : x) e = from_float<bfloat16>(n(rng));
  std::vector<simdattn::PoolStep> steps;
  for (std::int64_t i = 0; i < kStreams; ++i)
    steps.push_back({simdattn::ConstSeqView(x.data() + i * s.d, 1, 1, s.d), setup->seqs[static_cast<std::size_t>(i)],
                     simdattn::SeqView(y.data() + i * s.d, 1, 1, s.d)});
  simdattn::MhaOptions o;
  o.threads = threads;
  // multiply-adds a token: the projections (the first, q_b, W_UK, W_UV, o_proj) and its attention
  const double proj = double(s.d) * double((s.q_lora > 0 ? s.q_lora : s.H * qk) + W) + double(s.q_lora) * double(s.H * qk) +
                      double(s.H) * double(s.nope + s.v) * double(kKvLora) + double(s.H * s.v) * double(s.d);
  const double attn = double(s.H) * double(kCached + 1) * double(W + kKvLora);
  const double weights = proj * 2.0;  // bf16 bytes of the weights read once
  const double latent = double(kStreams) * double(kCached) * double(W) * 2.0;
  state.counters["step_bytes_MB"] = (weights + latent) * 1e-6;
  state.counters["step_GFLOP"] = 2.0 * double(kStreams) * (proj + attn) * 1e-9;
  simdattn::perf::timed_loop(state, weights + latent, "GB/s", [&] {
    setup->layer->forward_pool(steps, *setup->pool, 0, o);
    for (const auto q : setup->seqs) setup->pool->truncate(q, kCached);
  });
}

int register_all() {
  for (const MlaShape& s : {kV2Lite, kV3})
    for (int t : {1, 2})
      benchmark::RegisterBenchmark(("mha/native/" + std::string(s.name) + "-decode8.bf16/t" + std::to_string(t)).c_str(),
                                   bench_mla_decode, s, t)
          ->Unit(benchmark::kMillisecond);
  return 0;
}
const int registered = register_all();

}  // namespace
