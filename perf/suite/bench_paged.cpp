// attention_paged over keys and values in blocks (a KvPool's head-major layout, blocks of
// kDefaultBlockSize, a shuffled block table), each beside its contiguous counterpart:
//   attention/native/paged-decode/t<N> (.bf16): the `decode` workload (1 x 32 heads x 4096 keys,
//     d 128) in blocks; against attention/native/decode/t<N> (.bf16)
//   attention/native/paged-decode.int8|.fp8_e4m3/t<N>: the same over 8-bit codes (and their scales)
//   attention/native/paged-decode-bs<16|32|64|128>/t<N> (.bf16): the same in blocks of that size
//   attention/native/paged-long+7short/t<N>: decode steps of one 8192-key and seven 128-key
//     sequences in one call; attention/native/paged-long/t<N>: the 8192-key one alone
//   attention/native/paged-mixed8/t<N>: decode steps of 8 sequences of 100..4000 keys in one
//     call; attention/native/dense-mixed8/t<N>: the same, one attention() call each
// Counter: GB/s of the K and V read.
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
using simdattn::perf::HugeArray;

constexpr std::int64_t kH = 32, kD = 128;

// Decode steps of sequences of these lengths over one pool-layout cache.
template <class T>
struct PagedInputs {
  std::int64_t bs, blocks = 0, max_blocks = 0;
  std::vector<std::int64_t> lens;
  std::vector<std::int32_t> table;
  std::vector<T> q, o;
  HugeArray<T> k, v;

  explicit PagedInputs(std::vector<std::int64_t> lengths, std::int64_t block_size = simdattn::kDefaultBlockSize)
      : bs(block_size), lens(std::move(lengths)) {
    for (auto L : lens) max_blocks = std::max(max_blocks, (L + bs - 1) / bs), blocks += (L + bs - 1) / bs;
    std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(5);
    std::shuffle(order.begin(), order.end(), rng);
    table.assign(lens.size() * static_cast<std::size_t>(max_blocks), 0);
    std::size_t next = 0;
    for (std::size_t i = 0; i < lens.size(); ++i)
      for (std::int64_t c = 0; c < (lens[i] + bs - 1) / bs; ++c) table[i * std::size_t(max_blocks) + std::size_t(c)] = order[next++];
    std::normal_distribution<float> n(0.f, 1.f);
    q.resize(lens.size() * kH * kD), o.resize(q.size());
    k.resize(std::size_t(blocks * bs * kH * kD)), v.resize(k.size());
    for (auto& e : q) e = from_float<T>(n(rng));
    for (auto* x : {&k, &v})
      for (std::size_t i = 0; i < x->size(); ++i) (*x)[i] = from_float<T>(n(rng));
  }
  double kv_bytes() const {
    double keys = 0;
    for (auto L : lens) keys += double(L);
    return keys * 2.0 * kH * kD * sizeof(T);
  }
  void run(int threads) {
    const auto N = static_cast<std::int64_t>(lens.size());
    const simdattn::Shape4 st{kH * bs * kD, kD, bs * kD, 1};  // a KvPool's head-major blocks
    simdattn::PagedAttentionOptions opt;
    opt.threads = threads;
    simdattn::attention_paged(simdattn::ConstTensorView(q.data(), {1, N, kH, kD}),
                              simdattn::ConstTensorView(k.data(), {blocks, bs, kH, kD}, st),
                              simdattn::ConstTensorView(v.data(), {blocks, bs, kH, kD}, st),
                              {table.data(), N, max_blocks, max_blocks}, lens,
                              simdattn::TensorView(o.data(), {1, N, kH, kD}), opt);
  }
};

template <class T>
void bench_paged(benchmark::State& state, std::vector<std::int64_t> lens, int threads, std::int64_t block_size) {
  PagedInputs<T> in(std::move(lens), block_size);
  simdattn::perf::timed_loop(state, in.kv_bytes(), "GB/s", [&] { in.run(threads); });
}

// The same decode steps over an 8-bit pool-layout cache (codes on huge pages, the scales of a
// block's rows head-major as a KvPool keeps them), quantized from the f32 inputs.
void bench_paged_codes(benchmark::State& state, std::vector<std::int64_t> lens, int threads, simdattn::DType code) {
  PagedInputs<float> in(std::move(lens));
  const std::int64_t bs = in.bs, blocks = in.blocks;
  const simdattn::Shape4 shape{blocks, bs, kH, kD}, st{kH * bs * kD, kD, bs * kD, 1};
  const simdattn::Shape4 sshape{blocks, bs, kH, 1}, sst{kH * bs, 1, bs, 1};
  HugeArray<std::uint8_t> kc, vc;
  kc.resize(in.k.size()), vc.resize(in.v.size());
  std::vector<float> ks(std::size_t(blocks * bs * kH)), vs(ks.size());
  simdattn::quantize_kv(simdattn::ConstTensorView(in.k.data(), shape, st), code, simdattn::TensorView(kc.data(), code, shape, st),
                        simdattn::TensorView(ks.data(), sshape, sst));
  simdattn::quantize_kv(simdattn::ConstTensorView(in.v.data(), shape, st), code, simdattn::TensorView(vc.data(), code, shape, st),
                        simdattn::TensorView(vs.data(), sshape, sst));
  const auto N = static_cast<std::int64_t>(in.lens.size());
  simdattn::PagedAttentionOptions opt;
  opt.threads = threads;
  opt.k_scale = simdattn::ConstTensorView(ks.data(), sshape, sst);
  opt.v_scale = simdattn::ConstTensorView(vs.data(), sshape, sst);
  double keys = 0;
  for (auto L : in.lens) keys += double(L);
  simdattn::perf::timed_loop(state, keys * 2.0 * kH * (kD + 4), "GB/s", [&] {
    simdattn::attention_paged(simdattn::ConstTensorView(in.q.data(), {1, N, kH, kD}),
                              simdattn::ConstTensorView(kc.data(), code, shape, st),
                              simdattn::ConstTensorView(vc.data(), code, shape, st),
                              {in.table.data(), N, in.max_blocks, in.max_blocks}, in.lens,
                              simdattn::TensorView(in.o.data(), {1, N, kH, kD}), opt);
  });
}

// The same decode steps, one contiguous attention() call per sequence.
void bench_dense_each(benchmark::State& state, std::vector<std::int64_t> lens, int threads) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::mt19937 rng(6);
  std::vector<std::vector<float>> k(lens.size()), v(lens.size());
  std::vector<float> q(kH * kD), o(kH * kD);
  double bytes = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    k[i].resize(std::size_t(lens[i] * kH * kD)), v[i].resize(k[i].size());
    for (auto& e : k[i]) e = n(rng);
    for (auto& e : v[i]) e = n(rng);
    bytes += double(lens[i]) * 2.0 * kH * kD * 4;
  }
  for (auto& e : q) e = n(rng);
  simdattn::AttentionOptions opt;
  opt.threads = threads;
  simdattn::perf::timed_loop(state, bytes, "GB/s", [&] {
    for (std::size_t i = 0; i < lens.size(); ++i)
      simdattn::attention(simdattn::ConstTensorView(q.data(), {1, kH, 1, kD}),
                          simdattn::ConstTensorView(k[i].data(), {1, kH, lens[i], kD}),
                          simdattn::ConstTensorView(v[i].data(), {1, kH, lens[i], kD}),
                          simdattn::TensorView(o.data(), {1, kH, 1, kD}), opt);
  });
}

int register_all() {
  const std::vector<std::int64_t> mixed8{100, 3900, 700, 2400, 150, 4000, 1200, 520};
  std::vector<std::int64_t> long7{8192};
  long7.insert(long7.end(), 7, 128);
  for (int t : {1, 2}) {
    const std::string ts = "/t" + std::to_string(t);
    benchmark::RegisterBenchmark(("attention/native/paged-decode" + ts).c_str(), bench_paged<float>,
                                 std::vector<std::int64_t>{4096}, t, simdattn::kDefaultBlockSize)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/native/paged-decode.bf16" + ts).c_str(), bench_paged<simdattn::bfloat16>,
                                 std::vector<std::int64_t>{4096}, t, simdattn::kDefaultBlockSize)->Unit(benchmark::kMillisecond);
    for (simdattn::DType code : {simdattn::DType::int8, simdattn::DType::fp8_e4m3})
      benchmark::RegisterBenchmark(("attention/native/paged-decode." + std::string(simdattn::dtype_name(code)) + ts).c_str(),
                                   bench_paged_codes, std::vector<std::int64_t>{4096}, t, code)
          ->Unit(benchmark::kMillisecond);
    for (std::int64_t bs : {16, 32, 64, 128}) {  // the block size's cost (kDefaultBlockSize's reason)
      const std::string b = "attention/native/paged-decode-bs" + std::to_string(bs);
      benchmark::RegisterBenchmark((b + ts).c_str(), bench_paged<float>, std::vector<std::int64_t>{4096}, t, bs)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((b + ".bf16" + ts).c_str(), bench_paged<simdattn::bfloat16>,
                                   std::vector<std::int64_t>{4096}, t, bs)->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("attention/native/paged-long+7short" + ts).c_str(), bench_paged<float>, long7, t, simdattn::kDefaultBlockSize)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/native/paged-long" + ts).c_str(), bench_paged<float>,
                                 std::vector<std::int64_t>{8192}, t, simdattn::kDefaultBlockSize)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/native/paged-mixed8" + ts).c_str(), bench_paged<float>, mixed8, t, simdattn::kDefaultBlockSize)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/native/dense-mixed8" + ts).c_str(), bench_dense_each, mixed8, t)
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}

const int registered = register_all();

}  // namespace
