// Rotary position embeddings: apply_rope against hand-computed rotations for both styles, partial
// rotary and every scaling; the MHA layer with RoPE and QK-norm against the pipeline written out
// with apply_rope and attention(); incremental decoding with RoPE (one token at a time and in
// chunks of 3) equals the full causal forward; validation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "simdattn/simdattn.hpp"
#include "support/serving_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

namespace {

// One head vector [4] at `pos`, rotated by apply_rope in double.
std::vector<double> rotate4(const std::vector<double>& x, std::int64_t pos, const RopeConfig& c) {
  std::vector<double> y = x;
  const std::vector<std::int64_t> positions{pos};
  apply_rope(TensorView(y.data(), Shape4{1, 1, 1, 4}), positions, c);
  return y;
}

// The llama3 frequency rule written out (Meta's / Hugging Face's definition).
double llama3_inv_freq(double inv, double factor, double low, double high, double old) {
  const double wave = 2 * std::numbers::pi / inv;
  if (wave < old / high) return inv;
  if (wave > old / low) return inv / factor;
  const double smooth = (old / wave - low) / (high - low);
  return (1 - smooth) * inv / factor + smooth * inv;
}

}  // namespace

TEST_CASE("apply_rope: both styles, partial rotary, linear and llama3 scaling, against hand-computed rotations") {
  const std::vector<double> x{0.3, -1.2, 0.7, 2.0};
  for (std::int64_t pos : {0, 1, 5, 1000}) {
    CAPTURE(pos);
    // head_dim 4, theta 100: inv_freq = 1, 100^(-1/2) = 0.1
    RopeConfig c;
    c.theta = 100;
    const double a0 = double(pos) * 1.0, a1 = double(pos) * 0.1;
    std::vector<double> y = rotate4(x, pos, c);  // half: pairs (0, 2) and (1, 3)
    CHECK(y[0] == doctest::Approx(x[0] * std::cos(a0) - x[2] * std::sin(a0)).epsilon(1e-12));
    CHECK(y[2] == doctest::Approx(x[2] * std::cos(a0) + x[0] * std::sin(a0)).epsilon(1e-12));
    CHECK(y[1] == doctest::Approx(x[1] * std::cos(a1) - x[3] * std::sin(a1)).epsilon(1e-12));
    CHECK(y[3] == doctest::Approx(x[3] * std::cos(a1) + x[1] * std::sin(a1)).epsilon(1e-12));
    c.style = RopeStyle::interleaved;  // pairs (0, 1) and (2, 3)
    y = rotate4(x, pos, c);
    CHECK(y[0] == doctest::Approx(x[0] * std::cos(a0) - x[1] * std::sin(a0)).epsilon(1e-12));
    CHECK(y[1] == doctest::Approx(x[1] * std::cos(a0) + x[0] * std::sin(a0)).epsilon(1e-12));
    CHECK(y[2] == doctest::Approx(x[2] * std::cos(a1) - x[3] * std::sin(a1)).epsilon(1e-12));
    CHECK(y[3] == doctest::Approx(x[3] * std::cos(a1) + x[2] * std::sin(a1)).epsilon(1e-12));
    c.rotary_dim = 2;  // partial: one pair (0, 1) at inv_freq 1; 2 and 3 pass through
    for (RopeStyle st : {RopeStyle::half, RopeStyle::interleaved}) {
      c.style = st;
      y = rotate4(x, pos, c);
      CHECK(y[0] == doctest::Approx(x[0] * std::cos(a0) - x[1] * std::sin(a0)).epsilon(1e-12));
      CHECK(y[1] == doctest::Approx(x[1] * std::cos(a0) + x[0] * std::sin(a0)).epsilon(1e-12));
      CHECK(y[2] == x[2]);
      CHECK(y[3] == x[3]);
    }
    c = RopeConfig{};
    c.theta = 100;
    c.scaling = RopeScaling::linear;
    c.factor = 4;
    y = rotate4(x, pos, c);
    CHECK(y[0] == doctest::Approx(x[0] * std::cos(a0 / 4) - x[2] * std::sin(a0 / 4)).epsilon(1e-12));
    CHECK(y[3] == doctest::Approx(x[3] * std::cos(a1 / 4) + x[1] * std::sin(a1 / 4)).epsilon(1e-12));
  }
  // llama3 on head_dim 128 (theta 500000, factor 8, low 1, high 4, original 8192: the low band
  // divided, the high kept, the middle blended), f64 tensors
  RopeConfig c;
  c.theta = 500000;
  c.scaling = RopeScaling::llama3;
  c.factor = 8;
  c.low_freq_factor = 1;
  c.high_freq_factor = 4;
  c.original_max_positions = 8192;
  std::mt19937_64 rng(test::base_seed() + 97);
  std::normal_distribution<double> nd;
  std::vector<double> v(128);
  for (double& e : v) e = nd(rng);
  std::vector<double> y = v;
  const std::vector<std::int64_t> pos{3001};
  apply_rope(TensorView(y.data(), Shape4{1, 1, 1, 128}), pos, c);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 64; ++i) {
    const double inv0 = std::pow(500000.0, -2.0 * i / 128.0);
    const double inv = llama3_inv_freq(inv0, 8, 1, 4, 8192), a = 3001 * inv;
    const double wave = 2 * std::numbers::pi / inv0;
    (wave < 8192 / 4.0 ? high : wave > 8192 / 1.0 ? low : mid)++;
    CHECK(y[i] == doctest::Approx(v[i] * std::cos(a) - v[i + 64] * std::sin(a)).epsilon(1e-9));
    CHECK(y[i + 64] == doctest::Approx(v[i + 64] * std::cos(a) + v[i] * std::sin(a)).epsilon(1e-9));
  }
  CHECK(low > 0);  // every band was exercised
  CHECK(mid > 0);
  CHECK(high > 0);
  // f32 tensors: frequencies and angles in f32 (as Hugging Face's f32 models), close to f64's
  std::vector<float> yf(v.begin(), v.end());
  apply_rope(TensorView(yf.data(), Shape4{1, 1, 1, 128}), pos, c);
  for (int i = 0; i < 128; ++i) CHECK(yf[i] == doctest::Approx(y[i]).epsilon(2e-3).scale(1.0));
}

TEST_CASE("apply_rope: YaRN scaling (the ramp between beta_fast's and beta_slow's dimensions, the attention factor)") {
  // written out from Peng et al. as Hugging Face states it (_compute_yarn_parameters)
  std::mt19937_64 rng(test::base_seed() + 101);
  std::normal_distribution<double> nd;
  std::vector<double> v(64);
  for (double& e : v) e = nd(rng);
  const std::vector<std::int64_t> pos{777};
  for (const bool truncate : {true, false})
    for (const double attention : {0.0, 1.3}) {
      INFO("truncate ", truncate, ", attention_factor ", attention);
      RopeConfig c;
      c.theta = 150000, c.scaling = RopeScaling::yarn, c.factor = 32, c.original_max_positions = 4096;
      c.beta_fast = 32, c.beta_slow = 1, c.truncate = truncate, c.attention_factor = attention;
      const double dim = 64, pi2 = 2 * std::numbers::pi;
      double low = dim * std::log(4096 / (32 * pi2)) / (2 * std::log(150000.0));
      double high = dim * std::log(4096 / (1 * pi2)) / (2 * std::log(150000.0));
      if (truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0), high = std::min(high, dim - 1);
      const double mult = attention > 0 ? attention : 0.1 * std::log(32.0) + 1;
      std::vector<double> y = v;
      apply_rope(TensorView(y.data(), Shape4{1, 1, 1, 64}), pos, c);
      int kept = 0, scaled = 0;
      for (int i = 0; i < 32; ++i) {
        const double inv0 = std::pow(150000.0, -2.0 * i / 64.0);
        const double keep = 1 - std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double a = 777 * (inv0 / 32 * (1 - keep) + inv0 * keep);
        kept += keep == 1, scaled += keep == 0;
        CHECK(y[i] == doctest::Approx(mult * (v[i] * std::cos(a) - v[i + 32] * std::sin(a))).epsilon(1e-9));
        CHECK(y[i + 32] == doctest::Approx(mult * (v[i + 32] * std::cos(a) + v[i] * std::sin(a))).epsilon(1e-9));
      }
      CHECK(kept > 0);  // both ends of the ramp were exercised
      CHECK(scaled > 0);
    }
  RopeConfig bad;
  bad.scaling = RopeScaling::yarn, bad.factor = 4;
  std::vector<double> y = v;
  const TensorView t(y.data(), Shape4{1, 1, 1, 64});
  bad.beta_fast = 0;
  test::check_error([&] { apply_rope(t, pos, bad); }, "config.beta_fast");
  bad.beta_fast = 32, bad.attention_factor = -1;
  test::check_error([&] { apply_rope(t, pos, bad); }, "config.attention_factor");
  bad.attention_factor = 0, bad.theta = 1;
  test::check_error([&] { apply_rope(t, pos, bad); }, "config.theta");
  bad.theta = 10000, bad.original_max_positions = 0;
  test::check_error([&] { apply_rope(t, pos, bad); }, "config.original_max_positions");
  CHECK(y == v);  // nothing changed
}

TEST_CASE("apply_rope: positions default to 0..S-1, strided views, and arguments are validated before anything changes") {
  std::vector<double> a(2 * 3 * 4 * 8), b;
  std::mt19937_64 rng(test::base_seed() + 98);
  std::normal_distribution<double> nd;
  for (double& e : a) e = nd(rng);
  b = a;
  RopeConfig c;
  apply_rope(TensorView(a.data(), Shape4{2, 3, 4, 8}), {}, c);  // [B, H, S, hd] dense, positions s = 0..3
  // the same tensor stored as [B, S, H, hd] (a strided view) with positions 0..3 given per (b, s)
  std::vector<double> d(b.size());
  auto at_bshd = [](std::int64_t bb, std::int64_t h, std::int64_t ss, std::int64_t e) { return bb * 96 + ss * 24 + h * 8 + e; };
  auto at_bhsd = [](std::int64_t bb, std::int64_t h, std::int64_t ss, std::int64_t e) { return bb * 96 + h * 32 + ss * 8 + e; };
  for (std::int64_t bb = 0; bb < 2; ++bb)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t ss = 0; ss < 4; ++ss)
        for (std::int64_t e = 0; e < 8; ++e) d[at_bshd(bb, h, ss, e)] = b[at_bhsd(bb, h, ss, e)];
  const std::vector<std::int64_t> p2{0, 1, 2, 3, 0, 1, 2, 3};
  apply_rope(TensorView(d.data(), Shape4{2, 3, 4, 8}, Shape4{96, 8, 24, 1}), p2, c);
  bool same = true;
  for (std::int64_t bb = 0; bb < 2; ++bb)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t ss = 0; ss < 4; ++ss)
        for (std::int64_t e = 0; e < 8; ++e) same = same && d[at_bshd(bb, h, ss, e)] == a[at_bhsd(bb, h, ss, e)];
  CHECK(same);
  CHECK(a != b);
  std::vector<double> e = b;
  RopeConfig bad;
  bad.rotary_dim = 3;
  CHECK_THROWS_WITH_AS(apply_rope(TensorView(e.data(), Shape4{2, 3, 4, 8}), {}, bad), doctest::Contains("config.rotary_dim"), Error);
  bad = RopeConfig{};
  bad.theta = 0;
  CHECK_THROWS_WITH_AS(apply_rope(TensorView(e.data(), Shape4{2, 3, 4, 8}), {}, bad), doctest::Contains("config.theta"), Error);
  const std::vector<std::int64_t> short_pos{1, 2};
  CHECK_THROWS_WITH_AS(apply_rope(TensorView(e.data(), Shape4{2, 3, 4, 8}), short_pos, c), doctest::Contains("positions"), Error);
  CHECK(e == b);
}

TEST_CASE("apply_rope: per-frequency factors (GGUF's rope_freqs) divide each frequency, 1 and the linear factor "
          "give none and linear scaling exactly, a wrong count or a factor <= 0 is refused") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> x(2 * 3 * 5 * 8);
  for (float& v : x) v = nd(rng);
  const Shape4 shape{2, 3, 5, 8};
  auto rotated = [&](const RopeConfig& c) {
    std::vector<float> y = x;
    apply_rope(TensorView(y.data(), shape), {}, c);
    return y;
  };
  RopeConfig none{.theta = 500000.0}, ones = none, linear = none, eights = none, mixed = none;
  ones.scaling = eights.scaling = mixed.scaling = RopeScaling::factors;
  ones.frequency_factors = {1, 1, 1, 1};
  linear.scaling = RopeScaling::linear;
  linear.factor = 8.0;
  eights.frequency_factors = {8, 8, 8, 8};
  mixed.frequency_factors = {1, 1, 8, 8};
  CHECK(rotated(ones) == rotated(none));
  CHECK(rotated(eights) == rotated(linear));
  const std::vector<float> m = rotated(mixed), n = rotated(none), l = rotated(linear);
  CHECK(m != n);
  CHECK(m != l);
  // frequencies 0 and 1 (dimensions 0, 1 and 4, 5 in halves) as none's, 2 and 3 as linear's
  for (std::size_t row = 0; row < x.size() / 8; ++row)
    for (std::size_t e = 0; e < 8; ++e) CHECK(m[row * 8 + e] == (e % 4 < 2 ? n : l)[row * 8 + e]);
  RopeConfig bad = mixed;
  bad.frequency_factors = {1, 1, 8};
  std::vector<float> y = x;
  CHECK_THROWS_WITH_AS(apply_rope(TensorView(y.data(), shape), {}, bad), doctest::Contains("config.frequency_factors"), Error);
  bad.frequency_factors = {1, 1, 8, 0};
  CHECK_THROWS_WITH_AS(apply_rope(TensorView(y.data(), shape), {}, bad), doctest::Contains("config.frequency_factors"), Error);
  CHECK(y == x);
}

namespace {

// A random f64 self-attention layer with RoPE (partial, interleaved or half) and QK-norm.
struct RopeLayer {
  MhaConfig cfg;
  MhaWeights<double> w;
};

RopeLayer rope_layer(std::mt19937_64& rng, RopeStyle style, bool norm) {
  std::normal_distribution<double> nd(0.0, 0.3);
  RopeLayer L;
  L.cfg.d_model = 24;
  L.cfg.heads = 4;
  L.cfg.kv_heads = 2;
  L.cfg.head_dim = 8;
  RopeConfig rc;
  rc.theta = 1000;
  rc.rotary_dim = 6;
  rc.style = style;
  L.cfg.rope = rc;
  if (norm) {
    for (int i = 0; i < 8; ++i) L.cfg.q_norm.push_back(float(1 + 0.1 * i)), L.cfg.k_norm.push_back(float(2 - 0.1 * i));
    L.cfg.qk_norm_eps = 1e-5;
  }
  auto fill = [&](std::vector<double>& v, std::size_t n) {
    v.resize(n);
    for (double& x : v) x = nd(rng);
  };
  fill(L.w.wq, 32 * 24), fill(L.w.wk, 16 * 24), fill(L.w.wv, 16 * 24), fill(L.w.wo, 24 * 32);
  fill(L.w.bq, 32), fill(L.w.bk, 16), fill(L.w.bv, 16), fill(L.w.bo, 24);
  return L;
}

// The rope_layer's geometry, written out: rows B*S of width d = 24, q 4 heads and k, v 2 heads of 8.
constexpr std::int64_t kD = 24, kNq = 32, kNkv = 16;

// x [rows, in] W^T + bias: [rows, n] (W [n, in]).
std::vector<double> project(const std::vector<double>& x, std::int64_t in, const std::vector<double>& W,
                            const std::vector<double>& bias, std::int64_t n) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / in;
  std::vector<double> r(static_cast<std::size_t>(rows * n));
  for (std::int64_t m = 0; m < rows; ++m)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = bias[j];
      for (std::int64_t e = 0; e < in; ++e) s += x[m * in + e] * W[j * in + e];
      r[m * n + j] = s;
    }
  return r;
}

// attention(q, k, v) with `ao` on the projections ([B, S, heads * 8]), then the output projection:
// the largest difference from the layer's output y.
double pipeline_error(const RopeLayer& L, std::int64_t B, std::int64_t S, const std::vector<double>& q,
                      const std::vector<double>& k, const std::vector<double>& v, const AttentionOptions& ao,
                      const std::vector<double>& y) {
  std::vector<double> att(static_cast<std::size_t>(B * S * kNq));
  attention(ConstTensorView(q.data(), Shape4{B, 4, S, 8}, Shape4{S * kNq, 8, kNq, 1}),
            ConstTensorView(k.data(), Shape4{B, 2, S, 8}, Shape4{S * kNkv, 8, kNkv, 1}),
            ConstTensorView(v.data(), Shape4{B, 2, S, 8}, Shape4{S * kNkv, 8, kNkv, 1}),
            TensorView(att.data(), Shape4{B, 4, S, 8}, Shape4{S * kNq, 8, kNq, 1}), ao);
  const std::vector<double> out = project(att, kNq, L.w.wo, L.w.bo, kD);
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(out[i] - y[i]));
  return worst;
}

}  // namespace

TEST_CASE("the MHA layer with RoPE and QK-norm equals the pipeline written out with apply_rope and attention()") {
  std::mt19937_64 rng(test::base_seed() + 99);
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
    for (bool norm : {false, true}) {
      const RopeLayer L = rope_layer(rng, style, norm);
      const MultiHeadAttention layer(L.cfg, L.w);
      const std::int64_t B = 2, S = 7, d = kD, nq = kNq, nkv = kNkv;
      std::vector<double> x(static_cast<std::size_t>(B * S * d));
      std::normal_distribution<double> nd;
      for (double& e : x) e = nd(rng);
      std::vector<double> y(x.size());
      MhaOptions o;
      o.causal = Causal::top_left;
      o.backend = Backend::reference;
      layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), o);
      // written out: projections, RMSNorm per head, rope, attention, output projection
      std::vector<double> q = project(x, d, L.w.wq, L.w.bq, nq), k = project(x, d, L.w.wk, L.w.bk, nkv),
                          v = project(x, d, L.w.wv, L.w.bv, nkv);
      if (norm)
        for (auto [t, n, wt] : {std::tuple{&q, nq, &L.cfg.q_norm}, std::tuple{&k, nkv, &L.cfg.k_norm}})
          for (std::int64_t m = 0; m < B * S * n / 8; ++m) {
            double ss = 0;
            for (int e = 0; e < 8; ++e) ss += (*t)[m * 8 + e] * (*t)[m * 8 + e];
            const double inv = 1 / std::sqrt(ss / 8 + 1e-5);
            for (int e = 0; e < 8; ++e) (*t)[m * 8 + e] *= inv * double((*wt)[e]);
          }
      apply_rope(TensorView(q.data(), Shape4{B, 4, S, 8}, Shape4{S * nq, 8, nq, 1}), {}, *L.cfg.rope);
      apply_rope(TensorView(k.data(), Shape4{B, 2, S, 8}, Shape4{S * nkv, 8, nkv, 1}), {}, *L.cfg.rope);
      AttentionOptions ao;
      ao.causal = Causal::top_left;
      ao.backend = Backend::reference;
      const double worst = pipeline_error(L, B, S, q, k, v, ao, y);
      CAPTURE(int(style));
      CAPTURE(norm);
      CHECK(worst <= 1e-12);
    }
}

TEST_CASE("incremental decoding with RoPE (one token at a time and in chunks of 3) equals the full causal forward, "
          "native and reference") {
  std::mt19937_64 rng(test::base_seed() + 100);
  const RopeLayer L = rope_layer(rng, RopeStyle::half, true);
  std::vector<float> wf;
  MhaWeights<float> w32;
  for (auto [dst, src] : {std::pair{&w32.wq, &L.w.wq}, {&w32.wk, &L.w.wk}, {&w32.wv, &L.w.wv}, {&w32.wo, &L.w.wo},
                          {&w32.bq, &L.w.bq}, {&w32.bk, &L.w.bk}, {&w32.bv, &L.w.bv}, {&w32.bo, &L.w.bo}})
    dst->assign(src->begin(), src->end());
  const MultiHeadAttention layer(L.cfg, w32);
  const std::int64_t B = 2, S = 10, d = 24;
  std::vector<float> x(static_cast<std::size_t>(B * S * d));
  std::normal_distribution<float> nd;
  for (float& e : x) e = nd(rng);
  for (Backend be : {Backend::reference, Backend::native}) {
    MhaOptions o;
    o.causal = Causal::top_left;
    o.backend = be;
    std::vector<float> full(x.size());
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(full.data(), B, S, d), o);
    for (std::int64_t chunk : {1, 3}) {
      KvCache cache(layer, B, S);
      std::vector<float> inc(x.size());
      MhaOptions io;
      io.causal = Causal::bottom_right;
      io.backend = be;
      for (std::int64_t t0 = 0; t0 < S; t0 += chunk) {
        const std::int64_t n = std::min(chunk, S - t0);
        std::vector<float> xs(static_cast<std::size_t>(B * n * d)), ys(xs.size());
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t e = 0; e < d; ++e) xs[(b * n + t) * d + e] = x[(b * S + t0 + t) * d + e];
        layer.forward(ConstSeqView(xs.data(), B, n, d), cache, SeqView(ys.data(), B, n, d), io);
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t e = 0; e < d; ++e) inc[(b * S + t0 + t) * d + e] = ys[(b * n + t) * d + e];
      }
      double worst = 0;
      for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(inc[i] - full[i])));
      CAPTURE(backend_name(be));
      CAPTURE(chunk);
      CHECK(worst <= 1e-5);
    }
  }
  // explicit positions shift the rotation: the same tokens at positions + 5 differ, and
  // positions 0..S-1 given explicitly change nothing
  std::vector<std::int64_t> p0(static_cast<std::size_t>(B * S)), p5(p0.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) p0[b * S + s] = s, p5[b * S + s] = s + 5;
  std::vector<float> y0(x.size()), ya(x.size()), y5(x.size());
  MhaOptions o;
  o.causal = Causal::top_left;
  layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y0.data(), B, S, d), o);
  o.positions = p0;
  layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(ya.data(), B, S, d), o);
  CHECK(y0 == ya);
  o.positions = p5;
  layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y5.data(), B, S, d), o);
  CHECK(y0 != y5);
  // a bad configuration is named
  MhaConfig bad = L.cfg;
  bad.rope->rotary_dim = 9;
  CHECK_THROWS_WITH_AS(MultiHeadAttention(bad, w32), doctest::Contains("config.rotary_dim"), Error);
  bad = L.cfg;
  bad.k_norm.clear();
  CHECK_THROWS_WITH_AS(MultiHeadAttention(bad, w32), doctest::Contains("config.k_norm"), Error);  // the missing one
}

TEST_CASE("the MHA layer's score options (scale, softcap, window, ALiBi, sinks, T5's bias) equal attention() given "
          "them on the layer's projections, the configuration is validated") {
  std::mt19937_64 rng(test::base_seed() + 102);
  RopeLayer L = rope_layer(rng, RopeStyle::half, false);
  L.cfg.rope.reset();
  L.cfg.scale = 1.0;
  L.cfg.softcap = 3.0;
  L.cfg.window = Window{4, 0};
  L.cfg.alibi_slopes = standard_alibi_slopes(4);
  L.cfg.sinks = {0.5f, -0.5f, 1.0f, 0.0f};
  std::normal_distribution<double> nd;
  for (int i = 0; i < 12 * 4; ++i) L.cfg.t5_table.push_back(float(nd(rng)));
  L.cfg.t5_bidirectional = false;
  L.cfg.t5_max_distance = 20;
  const MultiHeadAttention layer(L.cfg, L.w);
  const std::int64_t B = 2, S = 9, d = kD, nq = kNq, nkv = kNkv;
  std::vector<double> x(static_cast<std::size_t>(B * S * d));
  for (double& e : x) e = nd(rng);
  for (Backend be : {Backend::reference, Backend::native}) {
    std::vector<double> y(x.size());
    MhaOptions o;
    o.backend = be;
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), o);
    const std::vector<double> q = project(x, d, L.w.wq, L.w.bq, nq), k = project(x, d, L.w.wk, L.w.bk, nkv),
                              v = project(x, d, L.w.wv, L.w.bv, nkv);
    AttentionOptions ao;
    ao.backend = Backend::reference;
    ao.scale = 1.0;
    ao.softcap = 3.0;
    ao.window = Window{4, 0};
    ao.alibi_slopes = L.cfg.alibi_slopes;
    ao.sinks = L.cfg.sinks;
    ao.relative_bias = RelativePositionBias{ConstTensorView(L.cfg.t5_table.data(), Shape4{1, 1, 12, 4}), false, 20};
    const double worst = pipeline_error(L, B, S, q, k, v, ao, y);
    CAPTURE(backend_name(be));
    CHECK(worst <= 1e-12);
  }
  MhaConfig bad = L.cfg;
  bad.t5_table.pop_back();
  CHECK_THROWS_WITH_AS(MultiHeadAttention(bad, L.w), doctest::Contains("config.t5_table"), Error);
  bad = L.cfg;
  bad.sinks.pop_back();
  CHECK_THROWS_WITH_AS(MultiHeadAttention(bad, L.w), doctest::Contains("config.sinks"), Error);
}
