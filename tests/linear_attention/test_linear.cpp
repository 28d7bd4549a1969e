// Linear attention against an independent float64 evaluation of the quadratic form
//   O_i = sum_j (phi(q_i) . phi(k_j)) v_j / (sum_j phi(q_i) . phi(k_j) + eps),  j <= i if causal
// (the library computes prefix sums instead), for every feature map, causal or not, chunk sizes
// that do and do not divide S, grouped-query heads and strided layouts; and the recurrent state.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;
using test::Buffer;

namespace {

double phi(FeatureMap f, double x) {
  if (f == FeatureMap::elu1) return x > 0 ? x + 1 : std::exp(x);
  if (f == FeatureMap::relu) return x > 0 ? x : 0.0;
  return x;
}

template <class T>
Buffer<double> quadratic(const Buffer<T>& q, const Buffer<T>& k, const Buffer<T>& v, FeatureMap f, bool causal,
                         double eps) {
  const std::int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], D = q.shape[3];
  const std::int64_t Hkv = k.shape[1], Sk = k.shape[2], Dv = v.shape[3];
  Buffer<double> o({B, H, Sq, Dv});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        const std::int64_t hk = h / (H / Hkv);
        std::vector<double> num(std::size_t(Dv), 0.0);
        double den = eps;
        for (std::int64_t j = 0; j < (causal ? i + 1 : Sk); ++j) {
          double w = 0;
          for (std::int64_t d = 0; d < D; ++d)
            w += phi(f, test::as_double(q.at(b, h, i, d))) * phi(f, test::as_double(k.at(b, hk, j, d)));
          den += w;
          for (std::int64_t e = 0; e < Dv; ++e) num[std::size_t(e)] += w * test::as_double(v.at(b, hk, j, e));
        }
        for (std::int64_t e = 0; e < Dv; ++e) o.at(b, h, i, e) = num[std::size_t(e)] / den;
      }
  return o;
}

template <class T>
void fill_uniform(Buffer<T>& t, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  t.for_each([&](T& x, auto...) { x = test::value<T>(u(rng)); });
}

template <class T>
void check_random(std::mt19937_64& rng, int trial) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  const std::int64_t B = pick(1, 2), Hkv = pick(1, 2), H = Hkv * pick(1, 2), S = pick(1, 150), D = pick(1, 20),
                     Dv = pick(1, 20);
  const bool causal = trial % 2 == 0, bshd = pick(0, 1) == 1;
  const std::int64_t Sq = S, Sk = causal ? S : pick(1, 150);
  const FeatureMap f = static_cast<FeatureMap>(trial % 3);
  Buffer<T> q({B, H, Sq, D}, bshd, pick(0, 2)), k({B, Hkv, Sk, D}, bshd), v({B, Hkv, Sk, Dv}, bshd);
  // Features positive and away from 0, so every denominator is well conditioned.
  const double lo = f == FeatureMap::elu1 ? -1.0 : 0.05;
  fill_uniform(q, rng, lo, 1.5);
  fill_uniform(k, rng, lo, 1.5);
  fill_uniform(v, rng, -2.0, 2.0);
  const double eps = 1e-6;
  const Buffer<double> want = quadratic(q, k, v, f, causal, eps);
  const std::int64_t chunks[] = {1, 7, 16, 64, S, S + 5};
  for (Backend be : {Backend::reference, Backend::native}) {
    LinearAttentionOptions o;
    o.causal = causal;
    o.feature_map = f;
    o.backend = be;
    o.chunk = chunks[pick(0, 5)];
    Buffer<T> out({B, H, Sq, Dv}, bshd);
    linear_attention(q.cview(), k.cview(), v.cview(), out.view(), o);
    CAPTURE(backend_name(be));
    CAPTURE(S);
    CAPTURE(Sk);
    CAPTURE(o.chunk);
    CAPTURE(feature_map_name(f));
    CAPTURE(causal);
    CHECK(test::max_abs_diff(out, want) <= test::tolerance<T>(2.0));
  }
}

}  // namespace

TEST_CASE("linear attention equals the quadratic form (random, every feature map, chunk sizes)" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 51);
  for (int trial = 0; trial < 60; ++trial) {
    if (trial % 4 < 2) check_random<float>(rng, trial);
    else check_random<double>(rng, trial);
  }
}

TEST_CASE("linear attention in bf16 and f16 equals the quadratic form on the rounded inputs (every feature map, "
          "strided layouts, both backends)" * doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 54);
  for (int trial = 0; trial < 24; ++trial) {
    if (trial % 4 < 2) check_random<bfloat16>(rng, trial);
    else check_random<float16>(rng, trial);
  }
}

TEST_CASE("linear attention with head sizes wider than a kernel panel and chunks of several panels" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 53);
  for (auto [D, Dv, chunk] : {std::tuple{70, 130, 100}, std::tuple{128, 128, 64}, std::tuple{33, 65, 150}}) {
    Buffer<float> q({1, 2, 203, D}), k({1, 1, 203, D}), v({1, 1, 203, Dv});
    fill_uniform(q, rng, -1.0, 1.5);
    fill_uniform(k, rng, -1.0, 1.5);
    fill_uniform(v, rng, -2.0, 2.0);
    for (bool causal : {false, true}) {
      LinearAttentionOptions o;
      o.causal = causal;
      o.chunk = chunk;
      Buffer<float> out({1, 2, 203, Dv});
      linear_attention(q.cview(), k.cview(), v.cview(), out.view(), o);
      CAPTURE_VALUE(D);
      CAPTURE_VALUE(Dv);
      CAPTURE(causal);
      CHECK(test::max_abs_diff(out, quadratic(q, k, v, FeatureMap::elu1, causal, 1e-6)) <= test::tolerance<float>(2.0));
    }
  }
}

TEST_CASE("the recurrent state after N steps equals causal linear attention") {
  std::mt19937_64 rng(test::base_seed() + 52);
  const std::int64_t B = 2, H = 4, Hkv = 2, N = 37, D = 8, Dv = 5;
  Buffer<double> q({B, H, N, D}), k({B, Hkv, N, D}), v({B, Hkv, N, Dv});
  fill_uniform(q, rng, -1.0, 1.0);
  fill_uniform(k, rng, -1.0, 1.0);
  fill_uniform(v, rng, -1.0, 1.0);
  LinearAttentionOptions o;
  o.causal = true;
  o.chunk = 16;
  Buffer<double> full({B, H, N, Dv});
  linear_attention(q.cview(), k.cview(), v.cview(), full.view(), o);
  LinearAttentionState state(DType::f64, B, H, Hkv, D, Dv);
  Buffer<double> step_out({B, H, 1, Dv});
  double err = 0;
  for (std::int64_t t = 0; t < N; ++t) {
    auto row = [&](const Buffer<double>& x) {
      return ConstTensorView(x.data.data() + t * x.strides[2], {x.shape[0], x.shape[1], 1, x.shape[3]}, x.strides);
    };
    state.step(row(q), row(k), row(v), step_out.view());
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t e = 0; e < Dv; ++e) err = std::max(err, std::abs(step_out.at(b, h, 0, e) - full.at(b, h, t, e)));
  }
  CHECK(state.tokens() == N);
  CHECK(err <= 1e-12);
  state.reset();
  CHECK(state.tokens() == 0);
}

TEST_CASE("a bf16 or f16 recurrent state equals causal linear attention in its dtype") {
  std::mt19937_64 rng(test::base_seed() + 55);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t B = 1, H = 2, Hkv = 1, N = 29, D = 6, Dv = 7;
    Buffer<T> q({B, H, N, D}), k({B, Hkv, N, D}), v({B, Hkv, N, Dv});
    fill_uniform(q, rng, -1.0, 1.0);
    fill_uniform(k, rng, -1.0, 1.0);
    fill_uniform(v, rng, -1.0, 1.0);
    LinearAttentionOptions o;
    o.causal = true;
    o.backend = Backend::reference;
    Buffer<T> full({B, H, N, Dv});
    linear_attention(q.cview(), k.cview(), v.cview(), full.view(), o);
    LinearAttentionState state(dtype_of<T>(), B, H, Hkv, D, Dv);
    Buffer<T> step_out({B, H, 1, Dv});
    double err = 0;
    for (std::int64_t t = 0; t < N; ++t) {
      auto row = [&](const Buffer<T>& x) {
        return ConstTensorView(x.data.data() + t * x.strides[2], {x.shape[0], x.shape[1], 1, x.shape[3]}, x.strides);
      };
      state.step(row(q), row(k), row(v), step_out.view());
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t e = 0; e < Dv; ++e)
          err = std::max(err, std::abs(test::as_double(step_out.at(0, h, 0, e)) - test::as_double(full.at(0, h, t, e))));
    }
    // both round the same f64 sums once: equal but where the sums' last bits straddle a tie
    CHECK(err <= test::tolerance<T>(1.0) / 4);
  };
  run(bfloat16{});
  run(float16{});
}

TEST_CASE("linear attention validates its options" *
          doctest::test_suite(test::every_isa)) {
  Buffer<float> q({1, 2, 5, 4}), k({1, 2, 6, 4}), v({1, 2, 6, 4}), o({1, 2, 5, 4});
  LinearAttentionOptions opt;
  opt.causal = true;
  CHECK_THROWS_WITH_AS(linear_attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("Sq == Sk"), Error);
  opt.causal = false;
  opt.backend = Backend::onednn;
  CHECK_THROWS_WITH_AS(linear_attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("options.backend"), Error);
  opt.backend = Backend::native;
  opt.eps = -1;
  CHECK_THROWS_WITH_AS(linear_attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("options.eps"), Error);
  opt.eps = 1e-6;
  opt.chunk = 0;
  CHECK_THROWS_WITH_AS(linear_attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("options.chunk"), Error);
  Buffer<float> bad({1, 2, 5, 3});
  opt.chunk = 8;
  CHECK_THROWS_WITH_AS(linear_attention(q.cview(), k.cview(), v.cview(), bad.view(), opt), doctest::Contains("out"),
                       Error);
}
