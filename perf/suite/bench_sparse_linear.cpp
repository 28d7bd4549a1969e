// sparse/native/long-window512/t<N>:  the long workload (1x8x8192², D 128, causal) with a
//                                     sliding window (512, 0)
// sparse/native/long-block10pct/t<N>: long with a 64x64 block mask listing ~10% of the blocks
//                                     (the diagonal included), causal
// GFLOP/s count 4*D per visible pair, as attention/: compare with attention/native/long, whose
// pairs are the causal ones, by time per visible pair.
//
// linear/native/{long,gpt}/t<N>:      causal linear attention (elu1) on the long and gpt shapes
// linear/native/{long,gpt}-full/t<N>: the non-causal form
// GFLOP/s count the FLOPs the causal form needs (linear_flops below); non-causal
// 2*Sk*D*(Dv+1) + 2*Sq*D*(Dv+1).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"

namespace {

using simdattn::ConstTensorView;
using simdattn::TensorView;

struct Tensors {
  std::int64_t B, H, S, D;
  std::vector<float> q, k, v, o;
  Tensors(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) : B(b), H(h), S(s), D(d) {
    std::mt19937 rng(9);
    std::normal_distribution<float> n(0.f, 1.f);
    for (auto* t : {&q, &k, &v}) {
      t->resize(static_cast<std::size_t>(B * H * S * D));
      for (float& x : *t) x = n(rng);
    }
    o.resize(q.size());
  }
  ConstTensorView cq() const { return ConstTensorView(q.data(), {B, H, S, D}); }
  ConstTensorView ck() const { return ConstTensorView(k.data(), {B, H, S, D}); }
  ConstTensorView cv() const { return ConstTensorView(v.data(), {B, H, S, D}); }
  TensorView vo() { return TensorView(o.data(), {B, H, S, D}); }
};

constexpr std::int64_t kBlock = 64;

// ~10% of the nb x nb blocks listed: the diagonal and random blocks below it (causal hides the
// rest anyway).
std::vector<std::uint8_t> block_pattern(std::int64_t nb) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(nb * nb), 0);
  std::mt19937 rng(11);
  const double target = 0.10 * double(nb * nb) - double(nb), below = double(nb * (nb - 1) / 2);
  std::bernoulli_distribution pick(std::clamp(target / below, 0.0, 1.0));
  for (std::int64_t i = 0; i < nb; ++i)
    for (std::int64_t j = 0; j <= i; ++j) m[static_cast<std::size_t>(i * nb + j)] = i == j || pick(rng);
  return m;
}

void bench_sparse(benchmark::State& state, bool window, int threads) {
  const simdattn::Workload& w = *simdattn::find_workload("long");
  Tensors t(w.B, w.H, w.Sq, w.D);
  simdattn::AttentionOptions opt;
  opt.causal = simdattn::Causal::top_left;
  opt.threads = threads;
  const std::int64_t nb = (w.Sq + kBlock - 1) / kBlock;
  const std::vector<std::uint8_t> blocks = block_pattern(nb);
  double pairs = 0;  // visible pairs per head
  if (window) {
    opt.window = simdattn::Window{512, 0};
    for (std::int64_t i = 0; i < w.Sq; ++i) pairs += double(std::min<std::int64_t>(i + 1, 513));
  } else {
    opt.block_mask = ConstTensorView(blocks.data(), simdattn::DType::u8, {1, 1, nb, nb});
    opt.block_size = kBlock;
    for (std::int64_t i = 0; i < w.Sq; ++i)
      for (std::int64_t bj = 0; bj <= i / kBlock; ++bj)
        if (blocks[static_cast<std::size_t>((i / kBlock) * nb + bj)])
          pairs += double(std::min<std::int64_t>(kBlock, i + 1 - bj * kBlock));
  }
  const double flops = 4.0 * double(w.D) * pairs * double(w.B * w.H);
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] { simdattn::attention(t.cq(), t.ck(), t.cv(), t.vo(), opt); });
  state.counters["visible_pairs_fraction_of_causal"] = pairs / (double(w.Sq) * double(w.Sq + 1) / 2.0);
}

// The FLOPs causal linear attention needs, chunk by chunk (n rows, W = Dv + 1 for the
// normaliser): the earlier chunks' state and key sums against phi(Q) (none for the first
// chunk), this chunk's keys into the state, and the visible triangle inside the chunk (row i
// sees i + 1 keys: its scores, numerators and normaliser). The kernel computes a little more
// (row blocks and vectors round the triangle up); that is not counted.
double linear_flops(std::int64_t BH, std::int64_t S, std::int64_t D, bool causal, std::int64_t chunk) {
  const double W = double(D + 1), d = double(D);
  if (!causal) return double(BH) * 4.0 * double(S) * d * W;
  double f = 0;
  for (std::int64_t c0 = 0; c0 < S; c0 += chunk) {
    const double n = double(std::min(chunk, S - c0));
    f += (c0 > 0 ? 4.0 : 2.0) * n * d * W + n * (n + 1.0) * (d + W);
  }
  return double(BH) * f;
}

void bench_linear(benchmark::State& state, const char* workload, bool causal, int threads) {
  const simdattn::Workload& w = *simdattn::find_workload(workload);
  Tensors t(w.B, w.H, w.Sq, w.D);
  simdattn::LinearAttentionOptions opt;
  opt.causal = causal;
  opt.threads = threads;
  simdattn::perf::timed_loop(state, linear_flops(w.B * w.H, w.Sq, w.D, causal, opt.chunk), "GFLOP/s",
                             [&] { simdattn::linear_attention(t.cq(), t.ck(), t.cv(), t.vo(), opt); });
}

int register_all() {
  for (int t : {1, 2}) {
    const std::string ts = "/t" + std::to_string(t);
    benchmark::RegisterBenchmark(("sparse/native/long-window512" + ts).c_str(), bench_sparse, true, t)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("sparse/native/long-block10pct" + ts).c_str(), bench_sparse, false, t)
        ->Unit(benchmark::kMillisecond);
    for (const char* w : {"long", "gpt"}) {
      benchmark::RegisterBenchmark(("linear/native/" + std::string(w) + ts).c_str(), bench_linear, w, true, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("linear/native/" + std::string(w) + "-full" + ts).c_str(), bench_linear, w, false,
                                   t)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
