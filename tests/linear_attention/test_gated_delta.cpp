// The gated delta rule (simdattn/linear.hpp): the chunked form (T past a chunk of 32) and the
// recurrence (T = 1 steps carrying the state) against the recurrence written out in double, GQA
// value heads, the L2 norm, bitwise at 1, 2 and 3 threads, bad arguments named with nothing
// written. (tests/python/test_gated_delta.py checks the NumPy oracle too.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t B = 2, H = 2, Hv = 4, Dk = 8, Dv = 6;

struct Inputs {
  std::int64_t T;
  std::vector<float> q, k, v, g, beta;
  explicit Inputs(std::int64_t t, std::uint64_t seed) : T(t) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n;
    std::uniform_real_distribution<float> u(0.f, 1.f);
    q.resize(static_cast<std::size_t>(B * T * H * Dk)), k.resize(q.size()), v.resize(static_cast<std::size_t>(B * T * Hv * Dv));
    g.resize(static_cast<std::size_t>(B * T * Hv)), beta.resize(g.size());
    for (float& e : q) e = n(rng);
    for (float& e : k) e = n(rng);
    for (float& e : v) e = n(rng);
    for (float& e : g) e = -0.3f * u(rng);
    for (float& e : beta) e = u(rng);
  }
  ConstTensorView qv() const { return ConstTensorView(q.data(), {B, T, H, Dk}); }
  ConstTensorView kv() const { return ConstTensorView(k.data(), {B, T, H, Dk}); }
  ConstTensorView vv() const { return ConstTensorView(v.data(), {B, T, Hv, Dv}); }
  ConstTensorView gv() const { return ConstTensorView(g.data(), {B, T, Hv, 1}); }
  ConstTensorView bv() const { return ConstTensorView(beta.data(), {B, T, Hv, 1}); }
};

// The recurrence in double (L2-normalized q and k, scale Dk^-1/2).
std::vector<double> recurrence(const Inputs& in, std::vector<double>& S) {
  std::vector<double> out(static_cast<std::size_t>(B * in.T * Hv * Dv));
  S.assign(static_cast<std::size_t>(B * Hv * Dk * Dv), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hv; ++h) {
      double* s = S.data() + (b * Hv + h) * Dk * Dv;
      for (std::int64_t t = 0; t < in.T; ++t) {
        const std::int64_t hq = h / (Hv / H);
        double qt[Dk], kt[Dk], qn = 0, kn = 0;
        for (std::int64_t d = 0; d < Dk; ++d) {
          qt[d] = in.q[static_cast<std::size_t>(((b * in.T + t) * H + hq) * Dk + d)];
          kt[d] = in.k[static_cast<std::size_t>(((b * in.T + t) * H + hq) * Dk + d)];
          qn += qt[d] * qt[d], kn += kt[d] * kt[d];
        }
        for (std::int64_t d = 0; d < Dk; ++d) qt[d] *= std::pow(double(Dk), -0.5) / std::sqrt(qn + 1e-6), kt[d] /= std::sqrt(kn + 1e-6);
        const double decay = std::exp(double(in.g[static_cast<std::size_t>((b * in.T + t) * Hv + h)]));
        const double bt = in.beta[static_cast<std::size_t>((b * in.T + t) * Hv + h)];
        for (std::int64_t e = 0; e < Dk * Dv; ++e) s[e] *= decay;
        for (std::int64_t j = 0; j < Dv; ++j) {
          double sk = 0;
          for (std::int64_t d = 0; d < Dk; ++d) sk += s[d * Dv + j] * kt[d];
          const double u = bt * (in.v[static_cast<std::size_t>(((b * in.T + t) * Hv + h) * Dv + j)] - sk);
          for (std::int64_t d = 0; d < Dk; ++d) s[d * Dv + j] += kt[d] * u;
        }
        for (std::int64_t j = 0; j < Dv; ++j) {
          double o = 0;
          for (std::int64_t d = 0; d < Dk; ++d) o += s[d * Dv + j] * qt[d];
          out[static_cast<std::size_t>(((b * in.T + t) * Hv + h) * Dv + j)] = o;
        }
      }
    }
  return out;
}

}  // namespace

TEST_CASE("gated_delta_rule: the chunked form and the steps equal the recurrence, threads bitwise") {
  for (const std::int64_t T : {1, 7, 64, 130}) {
    INFO("T ", T);
    const Inputs in(T, static_cast<std::uint64_t>(T));
    std::vector<double> S;
    const std::vector<double> want = recurrence(in, S);
    std::vector<float> out(want.size()), fin(S.size());
    GatedDeltaRuleOptions o;
    o.use_qk_l2norm = true;
    o.final_state = TensorView(fin.data(), {B, Hv, Dk, Dv});
    o.threads = 1;
    gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), TensorView(out.data(), {B, T, Hv, Dv}), o);
    for (std::size_t i = 0; i < out.size(); ++i) CHECK(std::abs(out[i] - want[i]) <= 1e-4 * std::max(1.0, std::abs(want[i])));
    for (std::size_t i = 0; i < fin.size(); ++i) CHECK(std::abs(fin[i] - S[i]) <= 1e-4 * std::max(1.0, std::abs(S[i])));
    for (int threads : {2, 3}) {
      std::vector<float> again(out.size());
      o.threads = threads;
      o.final_state = {};
      gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), TensorView(again.data(), {B, T, Hv, Dv}), o);
      CHECK(again == out);
    }
  }
}

TEST_CASE("gated_delta_rule: bad arguments are named and nothing is written") {
  Inputs in(5, 9);
  std::vector<float> out(static_cast<std::size_t>(B * 5 * Hv * Dv), 7.f);
  const TensorView ov(out.data(), {B, 5, Hv, Dv});
  using test::check_error;
  in.g[3] = 0.1f;
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov); }, "g");
  in.g[3] = -0.1f, in.beta[2] = NAN;
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov); }, "beta");
  in.beta[2] = 0.5f;
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), ConstTensorView(in.v.data(), {B, 5, 3, 8}), in.gv(), in.bv(), ov); }, "v");
  check_error([&] { gated_delta_rule(in.qv(), ConstTensorView(in.k.data(), {B, 4, H, Dk}), in.vv(), in.gv(), in.bv(), ov); }, "k");
  GatedDeltaRuleOptions o;
  std::vector<float> state(static_cast<std::size_t>(B * Hv * Dk * Dv));
  o.initial_state = ConstTensorView(state.data(), {B, Hv, Dk, Dv - 1});
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov, o); }, "options.initial_state");
  o = {};
  o.final_state = TensorView(out.data(), {B, Hv, Dk, Dv});
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov, o); }, "options.final_state");
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.f; }));
}
