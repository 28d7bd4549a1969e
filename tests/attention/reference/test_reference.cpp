// Hand-computed cases: the expected numbers are derived in the comments, with scale = ln 2 so
// that every softmax weight is a power of two over a small integer. Each case runs on every
// backend built, so the reference and the native kernels are held to the same numbers. The
// default scale 1/sqrt(D) checked the same way (a regression).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;

namespace {

const double kLn2 = std::log(2.0);

// Runs [1,1,Sq,D] x [1,1,Sk,D] attention and returns O [Sq][Dv] row-major. The reference and
// native backends run in f64; onednn, which has no f64, in f32.
std::vector<double> run(Backend backend, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, std::int64_t Sq, std::int64_t Sk, std::int64_t D,
                        std::int64_t Dv, AttentionOptions opt) {
  opt.backend = backend;
  if (backend == Backend::onednn) {
    const std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end());
    std::vector<float> o(static_cast<std::size_t>(Sq * Dv), -1.f);
    attention(ConstTensorView(qf.data(), {1, 1, Sq, D}), ConstTensorView(kf.data(), {1, 1, Sk, D}),
              ConstTensorView(vf.data(), {1, 1, Sk, Dv}), TensorView(o.data(), {1, 1, Sq, Dv}), opt);
    return {o.begin(), o.end()};
  }
  std::vector<double> o(static_cast<std::size_t>(Sq * Dv), -1.0);
  attention(ConstTensorView(q.data(), {1, 1, Sq, D}), ConstTensorView(k.data(), {1, 1, Sk, D}),
            ConstTensorView(v.data(), {1, 1, Sk, Dv}), TensorView(o.data(), {1, 1, Sq, Dv}), opt);
  return o;
}

// Relative agreement: 1e-13 for the f64 backends, 2e-6 for onednn's f32 (a few roundings of
// 2^-24 on numbers of a few units).
void check_close(const std::vector<double>& got, const std::vector<double>& want, Backend backend) {
  const double eps = backend == Backend::onednn ? 2e-6 : 1e-13;
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(eps));
}

// The 3x3 case: Q = [0, 1, 2]^T, K = [0, 1, 2]^T (D = 1), scale = ln 2, so exp(s_ij) = 2^(q_i k_j):
//   row 0: 1, 1, 1     row 1: 1, 2, 4     row 2: 1, 4, 16
// V = [[7, 0], [14, 21], [0, 42]].
const std::vector<double> Q3{0, 1, 2}, K3{0, 1, 2}, V3{7, 0, 14, 21, 0, 42};

}  // namespace

TEST_CASE("hand-computed 2x2: scores, softmax, weighted values") {
  // Q = K = I (D = 2), scale 1: row 0 scores [1, 0], weights [e/(e+1), 1/(e+1)];
  // V = [[1, 2], [3, 4]]: O row 0 = V0 + 2/(e+1) * [1, 1], row 1 = V0 + 2e/(e+1) * [1, 1].
  const std::vector<double> q{1, 0, 0, 1}, k{1, 0, 0, 1}, v{1, 2, 3, 4};
  const double e = std::exp(1.0);
  const double a = 2.0 / (e + 1.0), b = 2.0 * e / (e + 1.0);  // 0.5378828427399903, 1.4621171572600098
  AttentionOptions opt;
  opt.scale = 1.0;
  for (Backend be : test::backends()) {
    CAPTURE(backend_name(be));
    check_close(run(be, q, k, v, 2, 2, 2, 2, opt), {1 + a, 2 + a, 1 + b, 2 + b}, be);
    opt.causal = Causal::top_left;  // row 0 sees key 0 only
    check_close(run(be, q, k, v, 2, 2, 2, 2, opt), {1, 2, 1 + b, 2 + b}, be);
    opt.causal = Causal::none;
  }
}

TEST_CASE("hand-computed 3x3 with and without the causal mask") {
  AttentionOptions opt;
  opt.scale = kLn2;
  for (Backend be : test::backends()) {
    CAPTURE(backend_name(be));
    // row 0: (7+14+0)/3, (0+21+42)/3; row 1: (7+28+0)/7, (0+42+168)/7; row 2: (7+56)/21, (84+672)/21
    opt.causal = Causal::none;
    check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {7, 21, 5, 30, 3, 36}, be);
    // causal: row 0 sees key 0; row 1 keys 0-1 with weights 1/3, 2/3; row 2 all keys
    opt.causal = Causal::top_left;
    check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {7, 0, 35.0 / 3, 14, 3, 36}, be);
    opt.causal = Causal::bottom_right;  // Sq == Sk: the same
    check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {7, 0, 35.0 / 3, 14, 3, 36}, be);
  }
}

TEST_CASE("hand-computed Sq != Sk: the two causal alignments differ") {
  // Queries 1 and 2 only (Sq = 2, Sk = 3).
  const std::vector<double> q{1, 2};
  AttentionOptions opt;
  opt.scale = kLn2;
  for (Backend be : test::backends()) {
    CAPTURE(backend_name(be));
    // top-left: query 0 at position 0 sees key 0; query 1 at position 1 sees keys 0-1 with
    // weights 1/5, 4/5: (7 + 56)/5, (0 + 84)/5
    opt.causal = Causal::top_left;
    check_close(run(be, q, K3, V3, 2, 3, 1, 2, opt), {7, 0, 12.6, 16.8}, be);
    // bottom-right: offset Sk - Sq = 1; query 0 at position 1 sees keys 0-1 (weights 1/3, 2/3),
    // query 1 at position 2 sees all keys (weights 1/21, 4/21, 16/21)
    opt.causal = Causal::bottom_right;
    check_close(run(be, q, K3, V3, 2, 3, 1, 2, opt), {35.0 / 3, 14, 3, 36}, be);
  }
}

TEST_CASE("hand-computed masks, key lengths and windows") {
  AttentionOptions base;
  base.scale = kLn2;
  for (Backend be : test::backends()) {
    CAPTURE(backend_name(be));
    {  // key length 2: row 0 uniform over keys 0-1; row 1 weights 1/3, 2/3; row 2 1/5, 4/5
      AttentionOptions opt = base;
      const std::int64_t L[] = {2};
      opt.key_lengths = L;
      check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {10.5, 10.5, 35.0 / 3, 14, 12.6, 16.8}, be);
    }
    {  // window (0, 0): each query sees only the key at its own position
      AttentionOptions opt = base;
      opt.window = Window{0, 0};
      check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), V3, be);
    }
    {  // window (1, 0) with causal: row 2 sees keys 1-2 (weights 4/20, 16/20)
      AttentionOptions opt = base;
      opt.window = Window{1, 0};
      opt.causal = Causal::top_left;
      check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {7, 0, 35.0 / 3, 14, 2.8, 37.8}, be);
    }
    {  // boolean mask hiding key 1 everywhere: row 1 weights 1/5, 4/5 over keys 0 and 2
      AttentionOptions opt = base;
      const std::uint8_t m[] = {1, 0, 1};
      opt.mask = ConstTensorView(m, {1, 1, 1, 3});
      check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {3.5, 21, 1.4, 33.6, 7.0 / 17, 672.0 / 17}, be);
    }
    {  // additive mask: -inf on key 1 is the same as hiding it; +ln2 on key 0 doubles its weight
      AttentionOptions opt = base;
      const double inf = std::numeric_limits<double>::infinity();
      const double m[] = {kLn2, -inf, 0};
      opt.mask = ConstTensorView(m, {1, 1, 1, 3});
      // row 0: weights 2, 1 -> (14 + 0)/3, (0 + 42)/3; row 1: 2, 4 -> 14/6, 168/6;
      // row 2: 2, 16 -> 14/18, 672/18
      check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {14.0 / 3, 14, 14.0 / 6, 28, 14.0 / 18, 672.0 / 18}, be);
    }
    {  // a fully masked row is zero: boolean mask row 1 all false
      AttentionOptions opt = base;
      const std::uint8_t m[] = {1, 1, 1, 0, 0, 0, 1, 1, 1};
      opt.mask = ConstTensorView(m, {1, 1, 3, 3});
      check_close(run(be, Q3, K3, V3, 3, 3, 1, 2, opt), {7, 21, 0, 0, 3, 36}, be);
    }
  }
}

// A regression: issue 23's mutation run planted the bug this title names and the rest of the suite passed.
TEST_CASE("regression: the default scale is 1/sqrt(D), computed independently of the engine's reference") {
  // q = e0, k0 = 2 e0, k1 = 0: scores 2/sqrt(D) and 0, so with D = 4 the weights are
  // (e, 1) / (e + 1); v0 = 1, v1 = 0 makes the output e / (e + 1) in every column.
  const std::int64_t D = 4;
  std::vector<float> q(D, 0.f), k(2 * D, 0.f), v(2 * D, 0.f), out(D);
  q[0] = 1.f, k[0] = 2.f;
  for (std::int64_t d = 0; d < D; ++d) v[std::size_t(d)] = 1.f;
  const double e = std::exp(2.0 / std::sqrt(double(D)));
  for (Backend b : test::backends()) {
    CAPTURE(backend_name(b));
    AttentionOptions o;
    o.backend = b;
    attention(ConstTensorView(q.data(), {1, 1, 1, D}), ConstTensorView(k.data(), {1, 1, 2, D}),
              ConstTensorView(v.data(), {1, 1, 2, D}), TensorView(out.data(), {1, 1, 1, D}), o);
    for (float x : out) CHECK(std::abs(x - e / (e + 1)) <= 1e-6);
  }
}
