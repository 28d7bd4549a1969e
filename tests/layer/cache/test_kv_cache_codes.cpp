// KvCache in 8-bit dtypes (int8, fp8_e4m3, fp8_e5m2): the appended rows are quantize_kv of the
// rows an f32 cache holds (bit for bit), the native layer decoding token by token over the codes
// equals the reference backend over the same codes (the float64 attention on their values), and
// a NaN row is refused naming the sequence and token, the cache unchanged.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"
#include "support/test_util.hpp"

namespace {

using namespace simdattn;

// The first n rows of every (b, kv head) of a cache view [B, Hkv, capacity, hd], as [B, Hkv, n, hd].
template <class T>
std::vector<T> rows_of(const ConstTensorView& v, std::int64_t n) {
  std::vector<T> out;
  const auto* p = static_cast<const T*>(v.data);
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    for (std::int64_t h = 0; h < v.shape[1]; ++h)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t d = 0; d < v.shape[3]; ++d)
          out.push_back(p[b * v.strides[0] + h * v.strides[1] + j * v.strides[2] + d * v.strides[3]]);
  return out;
}

}  // namespace

TEST_CASE("KvCache int8 / fp8: rows quantized as appended, the layer over the codes equals the reference") {
  std::mt19937_64 rng(test::base_seed() + 380);
  const MultiHeadAttention layer = test::serving_layer(rng);
  constexpr std::int64_t d = test::kServingD, P = 13, gen = 6, B = 2;
  const std::vector<float> prompt = test::serving_tokens(rng, B * P), steps = test::serving_tokens(rng, B * gen);
  for (DType code : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    CAPTURE(dtype_name(code));
    KvCache f32(layer, B, 32), native(layer, B, 32, code), ref(layer, B, 32, code);
    CHECK(native.dtype() == code);
    std::vector<float> y(static_cast<std::size_t>(B * P * d)), yn = y, yr = y;
    MhaOptions reference;
    reference.backend = Backend::reference;
    layer.forward(ConstSeqView(prompt.data(), B, P, d), f32, SeqView(y.data(), B, P, d));
    layer.forward(ConstSeqView(prompt.data(), B, P, d), native, SeqView(yn.data(), B, P, d));
    layer.forward(ConstSeqView(prompt.data(), B, P, d), ref, SeqView(yr.data(), B, P, d), reference);
    double worst = 0;
    for (std::size_t i = 0; i < yn.size(); ++i) worst = std::max(worst, double(std::fabs(yn[i] - yr[i])));
    CHECK(worst <= 1e-5);
    for (std::int64_t g = 0; g < gen; ++g) {
      std::vector<float> x(static_cast<std::size_t>(B * d));
      for (std::int64_t b = 0; b < B; ++b)
        std::copy_n(steps.begin() + (b * gen + g) * d, d, x.begin() + b * d);
      std::vector<float> o(x.size()), on(x.size()), orf(x.size());
      layer.forward(ConstSeqView(x.data(), B, 1, d), f32, SeqView(o.data(), B, 1, d));
      MhaOptions two;
      two.threads = 2;
      layer.forward(ConstSeqView(x.data(), B, 1, d), native, SeqView(on.data(), B, 1, d), two);
      layer.forward(ConstSeqView(x.data(), B, 1, d), ref, SeqView(orf.data(), B, 1, d), reference);
      double w = 0, drift = 0;
      for (std::size_t i = 0; i < on.size(); ++i) {
        w = std::max(w, double(std::fabs(on[i] - orf[i])));
        drift = std::max(drift, double(std::fabs(on[i] - o[i])));
      }
      CHECK(w <= 1e-5);
      CHECK(drift <= (code == DType::int8 ? 0.05 : 0.3));  // the codes' error, not a bug's
    }
    // the cache holds quantize_kv of the f32 cache's rows, bit for bit
    const std::int64_t n = P + gen;
    for (auto [keys, scales, fk] : {std::tuple{native.keys(), native.key_scales(), f32.keys()},
                                    std::tuple{native.values(), native.value_scales(), f32.values()}}) {
      const std::vector<float> rows = rows_of<float>(fk, n);
      const Shape4 s{B, fk.shape[1], n, fk.shape[3]};
      std::vector<std::uint8_t> c(rows.size());
      std::vector<float> sc(static_cast<std::size_t>(B * fk.shape[1] * n));
      quantize_kv(ConstTensorView(rows.data(), s), code, TensorView(c.data(), code, s),
                  TensorView(sc.data(), Shape4{B, fk.shape[1], n, 1}));
      CHECK(rows_of<std::uint8_t>(keys, n) == c);
      CHECK(rows_of<float>(scales, n) == sc);
    }
  }
}

TEST_CASE("KvCache int8: a NaN row is refused naming the sequence and token, the cache unchanged") {
  std::mt19937_64 rng(test::base_seed() + 381);
  const MultiHeadAttention layer = test::serving_layer(rng);
  constexpr std::int64_t d = test::kServingD;
  KvCache cache(layer, 2, 16, DType::int8);
  std::vector<float> x = test::serving_tokens(rng, 2 * 3), y(x.size());
  layer.forward(ConstSeqView(x.data(), 2, 3, d), cache, SeqView(y.data(), 2, 3, d));
  const std::vector<std::uint8_t> before = rows_of<std::uint8_t>(cache.keys(), 3);
  std::vector<float> bad = test::serving_tokens(rng, 2 * 2), out(bad.size());
  bad[static_cast<std::size_t>(3 * d + 5)] = NAN;  // sequence 1, its second new token
  try {
    layer.forward(ConstSeqView(bad.data(), 2, 2, d), cache, SeqView(out.data(), 2, 2, d));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.argument() == "cache");
    CHECK(std::string(e.what()).find("sequence 1, token 4") != std::string::npos);
  }
  CHECK(cache.lengths()[0] == 3);
  CHECK(cache.lengths()[1] == 3);
  CHECK(rows_of<std::uint8_t>(cache.keys(), 3) == before);
  CHECK(cache.key_scales().shape == Shape4{2, test::kServingKvHeads, 16, 1});
  CHECK(KvCache(layer, 1, 4).key_scales().empty());
}

TEST_CASE("KvPool int8 / fp8: forward_pool equals an 8-bit KvCache step by step, forks copy the scales, a NaN row changes nothing") {
  std::mt19937_64 rng(test::base_seed() + 382);
  const MultiHeadAttention layer = test::serving_layer(rng);
  constexpr std::int64_t d = test::kServingD;
  for (DType code : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    CAPTURE(dtype_name(code));
    KvPool pool(layer, 40, 4, 1, code);
    CHECK(pool.dtype() == code);
    CHECK(pool.key_scales(0).shape == Shape4{40, 4, test::kServingKvHeads, 1});
    KvCache c0(layer, 1, 64, code), c1(layer, 1, 64, code);
    const KvPool::Sequence s0 = pool.add(), s1 = pool.add();
    // rounds: a prompt of 7 and one of 3, then decode steps and a chunk of 5
    for (const auto& [t0, t1] : {std::pair{7, 3}, std::pair{1, 1}, std::pair{1, 5}, std::pair{1, 1}}) {
      const std::vector<float> x0 = test::serving_tokens(rng, t0), x1 = test::serving_tokens(rng, t1);
      std::vector<float> y0(x0.size()), y1(x1.size()), r0(x0.size()), r1(x1.size());
      const std::vector<PoolStep> steps{{ConstSeqView(x0.data(), 1, t0, d), s0, SeqView(y0.data(), 1, t0, d)},
                                        {ConstSeqView(x1.data(), 1, t1, d), s1, SeqView(y1.data(), 1, t1, d)}};
      layer.forward_pool(steps, pool);
      layer.forward(ConstSeqView(x0.data(), 1, t0, d), c0, SeqView(r0.data(), 1, t0, d));
      layer.forward(ConstSeqView(x1.data(), 1, t1, d), c1, SeqView(r1.data(), 1, t1, d));
      CHECK(test::max_diff(y0, r0) <= 1e-5);
      CHECK(test::max_diff(y1, r1) <= 1e-5);
    }
    // a fork shares s0's blocks; its first write copies the last block, scales and all: its next
    // output equals s0's on the same token
    const KvPool::Sequence f = pool.fork(s0);
    const std::vector<float> x = test::serving_tokens(rng, 1);
    std::vector<float> yf(x.size()), y0(x.size());
    const PoolStep sf{ConstSeqView(x.data(), 1, 1, d), f, SeqView(yf.data(), 1, 1, d)};
    layer.forward_pool({&sf, 1}, pool);
    const PoolStep st0{ConstSeqView(x.data(), 1, 1, d), s0, SeqView(y0.data(), 1, 1, d)};
    layer.forward_pool({&st0, 1}, pool);
    CHECK(yf == y0);
    // a NaN in a step's rows: Error naming the step, no block taken, lengths as they were
    const std::int64_t free = pool.free_blocks(), len = pool.length(s1);
    std::vector<float> bad = test::serving_tokens(rng, 6), out(bad.size());
    bad[static_cast<std::size_t>(4 * d + 1)] = INFINITY;
    const std::vector<PoolStep> bad_steps{{ConstSeqView(x.data(), 1, 1, d), s0, SeqView(y0.data(), 1, 1, d)},
                                          {ConstSeqView(bad.data(), 1, 6, d), s1, SeqView(out.data(), 1, 6, d)}};
    const std::int64_t len0 = pool.length(s0);
    try {
      layer.forward_pool(bad_steps, pool);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.argument() == "steps[1]");
      CHECK(std::string(e.what()).find("token " + std::to_string(len + 4)) != std::string::npos);
    }
    CHECK(pool.free_blocks() == free);
    CHECK(pool.length(s1) == len);
    CHECK(pool.length(s0) == len0);
    pool.release(f), pool.release(s0), pool.release(s1);
    CHECK(pool.free_blocks() == pool.num_blocks());
  }
}
