// The gated delta rule (simdattn/linear.hpp): the chunked form (T past a chunk of 32) and the
// recurrence (T = 1 steps carrying the state) against the recurrence written out in double, GQA
// value heads, the L2 norm, bitwise at 1, 2 and 3 threads, bad arguments named with nothing
// written; bf16 inputs on the bf16 pair kernels (AVX512-BF16) within 1e-2. (tests/python/
// test_gated_delta.py checks the NumPy oracle too.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "linear_attention/gated_delta.hpp"
#include "simdattn/half.hpp"
#include "simdattn/simd/isa.hpp"
#include "simdattn/simd/kernels.hpp"
#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"

using namespace simdattn;

namespace {

constexpr std::int64_t B = 2, H = 2, Hv = 4, Dk = 8, Dv = 6;

struct Dims {
  std::int64_t B = ::B, H = ::H, Hv = ::Hv, Dk = ::Dk, Dv = ::Dv;
};

struct Inputs {
  std::int64_t T;
  Dims d;
  std::vector<float> q, k, v, g, beta;
  explicit Inputs(std::int64_t t, std::uint64_t seed, Dims dims = {}) : T(t), d(dims) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n;
    std::uniform_real_distribution<float> u(0.f, 1.f);
    q.resize(static_cast<std::size_t>(d.B * T * d.H * d.Dk)), k.resize(q.size()), v.resize(static_cast<std::size_t>(d.B * T * d.Hv * d.Dv));
    g.resize(static_cast<std::size_t>(d.B * T * d.Hv)), beta.resize(g.size());
    for (float& e : q) e = n(rng);
    for (float& e : k) e = n(rng);
    for (float& e : v) e = n(rng);
    for (float& e : g) e = -0.3f * u(rng);
    for (float& e : beta) e = u(rng);
  }
  ConstTensorView qv() const { return ConstTensorView(q.data(), {d.B, T, d.H, d.Dk}); }
  ConstTensorView kv() const { return ConstTensorView(k.data(), {d.B, T, d.H, d.Dk}); }
  ConstTensorView vv() const { return ConstTensorView(v.data(), {d.B, T, d.Hv, d.Dv}); }
  ConstTensorView gv() const { return ConstTensorView(g.data(), {d.B, T, d.Hv, 1}); }
  ConstTensorView bv() const { return ConstTensorView(beta.data(), {d.B, T, d.Hv, 1}); }
};

// The recurrence in double (L2-normalized q and k, scale Dk^-1/2) from S0 (zeros if null).
std::vector<double> recurrence(const Inputs& in, std::vector<double>& S, const std::vector<float>* S0 = nullptr) {
  const Dims& z = in.d;
  std::vector<double> out(static_cast<std::size_t>(z.B * in.T * z.Hv * z.Dv));
  S.assign(static_cast<std::size_t>(z.B * z.Hv * z.Dk * z.Dv), 0.0);
  if (S0 != nullptr) std::copy(S0->begin(), S0->end(), S.begin());
  for (std::int64_t b = 0; b < z.B; ++b)
    for (std::int64_t h = 0; h < z.Hv; ++h) {
      double* s = S.data() + (b * z.Hv + h) * z.Dk * z.Dv;
      for (std::int64_t t = 0; t < in.T; ++t) {
        const std::int64_t hq = h / (z.Hv / z.H);
        std::vector<double> qbuf(static_cast<std::size_t>(z.Dk)), kbuf(qbuf.size());
        double *qt = qbuf.data(), *kt = kbuf.data();
        double qn = 0, kn = 0;
        for (std::int64_t d = 0; d < z.Dk; ++d) {
          qt[d] = in.q[static_cast<std::size_t>(((b * in.T + t) * z.H + hq) * z.Dk + d)];
          kt[d] = in.k[static_cast<std::size_t>(((b * in.T + t) * z.H + hq) * z.Dk + d)];
          qn += qt[d] * qt[d], kn += kt[d] * kt[d];
        }
        for (std::int64_t d = 0; d < z.Dk; ++d) qt[d] *= std::pow(double(z.Dk), -0.5) / std::sqrt(qn + 1e-6), kt[d] /= std::sqrt(kn + 1e-6);
        const double decay = std::exp(double(in.g[static_cast<std::size_t>((b * in.T + t) * z.Hv + h)]));
        const double bt = in.beta[static_cast<std::size_t>((b * in.T + t) * z.Hv + h)];
        for (std::int64_t e = 0; e < z.Dk * z.Dv; ++e) s[e] *= decay;
        for (std::int64_t j = 0; j < z.Dv; ++j) {
          double sk = 0;
          for (std::int64_t d = 0; d < z.Dk; ++d) sk += s[d * z.Dv + j] * kt[d];
          const double u = bt * (in.v[static_cast<std::size_t>(((b * in.T + t) * z.Hv + h) * z.Dv + j)] - sk);
          for (std::int64_t d = 0; d < z.Dk; ++d) s[d * z.Dv + j] += kt[d] * u;
        }
        for (std::int64_t j = 0; j < z.Dv; ++j) {
          double o = 0;
          for (std::int64_t d = 0; d < z.Dk; ++d) o += s[d * z.Dv + j] * qt[d];
          out[static_cast<std::size_t>(((b * in.T + t) * z.Hv + h) * z.Dv + j)] = o;
        }
      }
    }
  return out;
}

// x rounded to bf16, and x set to the rounded values
std::vector<bfloat16> rounded(std::vector<float>& x) {
  std::vector<bfloat16> r;
  for (float& e : x) r.push_back(to_bfloat16(e)), e = to_float(r.back());
  return r;
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

TEST_CASE("gated_delta_rule: bf16 inputs on the bf16 pair kernels within 1e-2 of the recurrence, threads bitwise, chosen where preferred") {
  const simd::KernelTable& kt = simd::kernels();
  if (kt.gemm_bf16_pairs.mr == 0) {
    MESSAGE("no AVX512-BF16 on this CPU: the pair kernels are not built into its table");
    return;
  }
  // Dk 72, Dv 80: pair panels of 32 columns, the last partial; T: one partial chunk, a whole
  // one and an odd tail, several chunks with a step of one token at the end. Dk 33: an odd depth
  // (K^T rounded from its f32 transpose, [K; Q] K^T on the f32 kernels).
  struct Case {
    Dims dims;
    std::int64_t T;
  };
  for (const Case& c : {Case{{2, 2, 4, 72, 80}, 7}, Case{{2, 2, 4, 72, 80}, 32}, Case{{2, 2, 4, 72, 80}, 97},
                        Case{{2, 2, 4, 72, 80}, 129}, Case{{1, 2, 2, 33, 40}, 70}}) {
    const Dims dims = c.dims;  // (named copies: a lambda below uses them)
    const std::int64_t T = c.T;
    INFO("T ", T, ", Dk ", dims.Dk);
    Inputs in(T, static_cast<std::uint64_t>(T) + 40, dims);
    const std::vector<bfloat16> q16 = rounded(in.q), k16 = rounded(in.k), v16 = rounded(in.v);  // the recurrence's inputs: the bf16 values
    // an initial state on every other case (narrowed into the pair panels before the first chunk)
    std::vector<float> s0(static_cast<std::size_t>(dims.B * dims.Hv * dims.Dk * dims.Dv));
    std::mt19937 srng(static_cast<unsigned>(T));
    std::normal_distribution<float> sn(0.f, 0.3f);
    for (float& e : s0) e = sn(srng);
    const bool with_s0 = T % 2 == 1;
    std::vector<double> S;
    const std::vector<double> want = recurrence(in, S, with_s0 ? &s0 : nullptr);
    const ConstTensorView qv(q16.data(), DType::bf16, {dims.B, T, dims.H, dims.Dk}),
        kv(k16.data(), DType::bf16, {dims.B, T, dims.H, dims.Dk}), vv(v16.data(), DType::bf16, {dims.B, T, dims.Hv, dims.Dv});
    // the output (bf16, widened back) and the final state
    auto run = [&](detail::GdrProducts p, int threads) {
      std::vector<bfloat16> out16(want.size());
      GatedDeltaRuleOptions o;
      o.use_qk_l2norm = true;
      o.threads = threads;
      std::vector<float> fin(S.size());
      o.final_state = TensorView(fin.data(), {dims.B, dims.Hv, dims.Dk, dims.Dv});
      if (with_s0) o.initial_state = ConstTensorView(s0.data(), {dims.B, dims.Hv, dims.Dk, dims.Dv});
      detail::gated_delta_rule_on(p, qv, kv, vv, in.gv(), in.bv(), TensorView(out16.data(), DType::bf16, {dims.B, T, dims.Hv, dims.Dv}), o);
      std::vector<float> out;
      for (bfloat16 x : out16) out.push_back(to_float(x));
      return std::pair{out, fin};
    };
    const auto got = run(detail::GdrProducts::bf16_pairs, 1);
    const std::vector<float>&out = got.first, &fin = got.second;
    double scale = 1.0, err = 0.0, scale_s = 1.0, err_s = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) scale = std::max(scale, std::abs(want[i])), err = std::max(err, std::abs(out[i] - want[i]));
    for (std::size_t i = 0; i < fin.size(); ++i) scale_s = std::max(scale_s, std::abs(S[i])), err_s = std::max(err_s, std::abs(fin[i] - S[i]));
    CAPTURE(err);
    CAPTURE(err_s);
    CHECK(err <= 1e-2 * scale);
    CHECK(err_s <= 1e-2 * scale_s);
    // the products did round to bf16 (the f32 products give another state), the same at any
    // thread count, and the library's own choice is them exactly where the CPU prefers them
    const auto f32 = run(detail::GdrProducts::f32, 1);
    CHECK(f32.second != fin);
    for (int threads : {2, 3}) CHECK(run(detail::GdrProducts::bf16_pairs, threads) == got);
    CHECK(run(detail::GdrProducts::automatic, 2) == (simd::bf16_pairs_preferred() ? got : f32));
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
  // the final state over the initial one: its own view updates in place; a view one head on, or
  // the same heads transposed, would read states already written: refused, the state unchanged
  std::vector<float> big(static_cast<std::size_t>((B * Hv + 1) * Dk * Dv), 0.25f);
  o.initial_state = ConstTensorView(big.data(), {B, Hv, Dk, Dv});
  o.final_state = TensorView(big.data() + Dk * Dv, {B, Hv, Dk, Dv});
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov, o); }, "options.final_state");
  o.final_state = TensorView(big.data(), {B, Hv, Dk, Dv}, {Hv * Dk * Dv, Dk * Dv, 1, Dk});  // each head column-major
  check_error([&] { gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov, o); }, "options.final_state");
  CHECK(std::all_of(big.begin(), big.end(), [](float x) { return x == 0.25f; }));
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.f; }));
  o.final_state = TensorView(big.data(), {B, Hv, Dk, Dv});
  gated_delta_rule(in.qv(), in.kv(), in.vv(), in.gv(), in.bv(), ov, o);  // in place
  CHECK(std::any_of(big.begin(), big.end(), [](float x) { return x != 0.25f; }));
  o = {};
  // bf16 rows: an Inf or a NaN named, in contiguous heads and in heads 3 values apart
  std::vector<bfloat16> q16 = rounded(in.q), k16 = rounded(in.k), v16 = rounded(in.v);
  std::vector<bfloat16> out16(out.size());
  const TensorView ov16(out16.data(), DType::bf16, {B, 5, Hv, Dv});
  const ConstTensorView qv(q16.data(), DType::bf16, {B, 5, H, Dk}), vv(v16.data(), DType::bf16, {B, 5, Hv, Dv});
  k16[37] = bfloat16{0xff80};  // -Inf
  check_error([&] { gated_delta_rule(qv, ConstTensorView(k16.data(), DType::bf16, {B, 5, H, Dk}), vv, in.gv(), in.bv(), ov16); }, "k");
  std::vector<bfloat16> spread(static_cast<std::size_t>(B * 5 * H * (Dk + 3)), to_bfloat16(1.0f));
  spread[static_cast<std::size_t>(2 * (Dk + 3) + 4)] = bfloat16{0x7fc1};  // NaN in head 0 of token 1
  const ConstTensorView kv_spread(spread.data(), DType::bf16, {B, 5, H, Dk}, {5 * H * (Dk + 3), H * (Dk + 3), Dk + 3, 1});
  check_error([&] { gated_delta_rule(qv, kv_spread, vv, in.gv(), in.bv(), ov16); }, "k");
  CHECK(std::all_of(out16.begin(), out16.end(), [](bfloat16 x) { return x.bits == 0; }));
}
