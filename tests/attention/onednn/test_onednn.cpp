// oneDNN-specific behaviour: its primitive cache (a second call with the same shapes creates
// nothing), concurrent calls while primitives are created, views it cannot take directly (copied
// through dense buffers) and its refusal of f64. Its results against the reference on random and
// edge-case configurations are in attention/test_backends_*.cpp with every other backend. And, in
// every build (not run, saying so, where onednn does not take bf16), bf16 with sliding windows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/backends.hpp"
#include "support/test_util.hpp"

#ifdef SIMDATTN_HAVE_ONEDNN

using namespace simdattn;
using test::Buffer;

TEST_CASE("onednn: a second call with the same shapes and options creates no primitive") {
  std::mt19937_64 rng(test::base_seed() + 19);
  // Grouped-query heads, causal with Sq != Sk, a key-padding mask and key lengths: several steps.
  const std::int64_t B = 2, H = 4, Hkv = 2, Sq = 37, Sk = 53, D = 24;
  auto [q, k, v] = test::random_qkv<float>(rng, B, H, Hkv, Sq, Sk, D);
  Buffer<std::uint8_t> m({B, 1, 1, Sk});
  m.for_each([](std::uint8_t& x, auto, auto, auto, auto j) { x = j % 5 != 3; });
  const std::int64_t L[] = {40, 53};
  AttentionOptions opt;
  opt.causal = Causal::bottom_right;
  opt.mask = m.cview();
  opt.key_lengths = L;
  const std::uint64_t before = detail::onednn_primitives_created();
  test::run_attention(Backend::onednn, q, k, v, opt);
  const std::uint64_t after_first = detail::onednn_primitives_created();
  CHECK(after_first > before);
  q.fill_normal(rng);  // new values, same shapes
  const Buffer<float> second = test::run_attention(Backend::onednn, q, k, v, opt);
  CHECK(detail::onednn_primitives_created() == after_first);
  const Buffer<float> ref = test::run_attention(Backend::reference, q, k, v, opt);
  CHECK(test::max_abs_diff(second, ref) <= test::tolerance<float>(test::max_abs(v)));
}

TEST_CASE("onednn: concurrent calls from many threads, with primitives created meanwhile") {
  std::mt19937_64 rng(test::base_seed() + 20);
  // Each thread alternates between its own new shape (created concurrently with the others) and
  // one shape all threads share.
  struct Case : test::Qkv<float> {
    Buffer<float> ref;
  };
  auto make = [&](std::int64_t Sq, std::int64_t Sk) {
    Case c{test::random_qkv<float>(rng, 2, 4, 2, Sq, Sk, 16), {}};
    AttentionOptions opt;
    opt.causal = Causal::bottom_right;
    c.ref = test::run_attention(Backend::reference, c.q, c.k, c.v, opt);
    return c;
  };
  std::vector<Case> cases;
  for (int t = 0; t < 4; ++t) cases.push_back(make(11 + t, 29 + 3 * t));
  cases.push_back(make(23, 31));
  std::vector<double> err(4, 0.0);
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&, t] {
      AttentionOptions opt;
      opt.causal = Causal::bottom_right;
      opt.threads = 1 + t % 2;
      for (int rep = 0; rep < 30; ++rep) {  // oneDNN's shared scratchpad broke ~1 run in 30 at 6
        const Case& c = cases[rep % 2 ? 4 : t];
        const Buffer<float> out = test::run_attention(Backend::onednn, c.q, c.k, c.v, opt);
        err[t] = std::max(err[t], test::max_abs_diff(out, c.ref) / std::max(1.0, test::max_abs(c.v)));
      }
    });
  for (auto& th : pool) th.join();
  for (double e : err) CHECK(e <= 1e-5);
}

TEST_CASE("onednn: views whose innermost stride is not 1 (copied through dense buffers)") {
  std::mt19937_64 rng(test::base_seed() + 22);
  const std::int64_t B = 2, H = 2, Sq = 9, Sk = 13, D = 6;
  // Every element two apart: [.., D] rows of stride 2D.
  auto make = [&](std::int64_t S) {
    std::vector<float> data(static_cast<std::size_t>(B * H * S * D * 2));
    std::normal_distribution<float> n;
    for (auto& x : data) x = n(rng);
    return data;
  };
  std::vector<float> q = make(Sq), k = make(Sk), v = make(Sk), out(static_cast<std::size_t>(B * H * Sq * D * 2), 7.f);
  auto st = [&](std::int64_t S) { return Shape4{H * S * D * 2, S * D * 2, D * 2, 2}; };
  const std::int64_t L[] = {13, 8};
  AttentionOptions opt;
  opt.causal = Causal::bottom_right;
  opt.key_lengths = L;
  Buffer<float> ref({B, H, Sq, D});
  opt.backend = Backend::reference;
  attention(ConstTensorView(q.data(), {B, H, Sq, D}, st(Sq)), ConstTensorView(k.data(), {B, H, Sk, D}, st(Sk)),
            ConstTensorView(v.data(), {B, H, Sk, D}, st(Sk)), ref.view(), opt);
  opt.backend = Backend::onednn;
  attention(ConstTensorView(q.data(), {B, H, Sq, D}, st(Sq)), ConstTensorView(k.data(), {B, H, Sk, D}, st(Sk)),
            ConstTensorView(v.data(), {B, H, Sk, D}, st(Sk)), TensorView(out.data(), {B, H, Sq, D}, st(Sq)), opt);
  double err = 0;
  ref.for_each([&](float& x, auto b, auto h, auto i, auto d) {
    err = std::max(err, double(std::abs(x - out[static_cast<std::size_t>(((b * H + h) * Sq + i) * D * 2 + d * 2)])));
  });
  double vmax = 0;
  for (float x : v) vmax = std::max(vmax, double(std::abs(x)));
  CHECK(err <= test::tolerance<float>(vmax));
  for (std::size_t i = 1; i < out.size(); i += 2) CHECK(out[i] == 7.f);  // the gaps stay untouched
}

TEST_CASE("onednn: f64 inputs are refused with a clear error and nothing written") {
  Buffer<double> q({1, 2, 3, 4}), k({1, 2, 5, 4}), v({1, 2, 5, 4}), out({1, 2, 3, 4});
  std::fill(out.data.begin(), out.data.end(), 7.0);
  AttentionOptions opt;
  opt.backend = Backend::onednn;
  try {
    attention(q.cview(), k.cview(), v.cview(), out.view(), opt);
    FAIL("expected simdattn::Error");
  } catch (const Error& e) {
    CHECK(e.argument() == "options.backend");
    CHECK(std::string(e.what()).find("has no f64 matmul") != std::string::npos);
  }
  for (double x : out.data) CHECK(x == 7.0);
}
#endif

// Outside the #ifdef: a build without oneDNN says it was not run.
TEST_CASE("bf16 on onednn with sliding windows: rows at the start of a block's key range (a regression: K and V views "
          "starting past key 0 gave wrong rows)") {
  using namespace simdattn;
  if (!backend_takes(Backend::onednn, DType::bf16)) {
    MESSAGE("onednn does not take bf16 here: not run");
    return;
  }
  std::mt19937_64 rng(test::base_seed() + 49);
  for (auto [Sq, Sk, left] : {std::tuple{std::int64_t{27}, std::int64_t{83}, std::int64_t{31}}, {27, 83, 30}, {16, 83, 31},
                              {100, 160, 60}}) {
    CAPTURE_VALUE(Sq);
    CAPTURE_VALUE(left);
    auto t = test::random_qkv<bfloat16>(rng, 1, 1, 1, Sq, Sk, 64);
    AttentionOptions opt;
    opt.window = Window{left, 2};
    const test::Buffer<bfloat16> ref = test::run_attention(Backend::reference, t.q, t.k, t.v, opt);
    const test::Buffer<bfloat16> dnn = test::run_attention(Backend::onednn, t.q, t.k, t.v, opt);
    CHECK(test::max_abs_diff(dnn, ref) <= test::tolerance<bfloat16>(test::max_abs(t.v)));
  }
}
