// The multi-head attention layer against a float64 computation from first principles
// (projections, heads, softmax, output projection), incremental decoding with the KV cache
// against the full causal forward, the cache's exact capacity (a regression), and loading weights
// from safetensors in both naming conventions.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <random>
#include <tuple>
#include <type_traits>
#include <string>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;

namespace {

std::vector<double> randn(std::mt19937_64& rng, std::size_t n, double sd = 1.0) {
  std::normal_distribution<double> d(0.0, sd);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// Each element as To (rounded to nearest even if narrower), by the engine's own conversions.
template <class To, class From>
std::vector<To> conv(const std::vector<From>& v) {
  std::vector<To> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = test::value<To>(test::as_double(v[i]));
  return out;
}

struct Model {
  MhaConfig cfg;  // resolved: every field set
  MhaWeights<double> w;
};

Model random_model(std::mt19937_64& rng, std::int64_t d, std::int64_t H, std::int64_t Hkv, std::int64_t hd,
                   std::int64_t kdim, std::int64_t vdim, bool bias) {
  Model m;
  m.cfg = MhaConfig{d, H, Hkv, hd, kdim, vdim};
  const double sd = 1.0 / std::sqrt(double(d));
  m.w.wq = randn(rng, std::size_t(H * hd * d), sd);
  m.w.wk = randn(rng, std::size_t(Hkv * hd * kdim), sd);
  m.w.wv = randn(rng, std::size_t(Hkv * hd * vdim), sd);
  m.w.wo = randn(rng, std::size_t(d * H * hd), sd);
  if (bias) {
    m.w.bq = randn(rng, std::size_t(H * hd), 0.1);
    m.w.bk = randn(rng, std::size_t(Hkv * hd), 0.1);
    m.w.bv = randn(rng, std::size_t(Hkv * hd), 0.1);
    m.w.bo = randn(rng, std::size_t(d), 0.1);
  }
  return m;
}

template <class T, class From>
MhaWeights<T> weights_as(const MhaWeights<From>& w) {
  return {conv<T>(w.wq), conv<T>(w.wk), conv<T>(w.wv), conv<T>(w.wo),
          conv<T>(w.bq), conv<T>(w.bk), conv<T>(w.bv), conv<T>(w.bo)};
}

// y[r, o] = sum_i x[r, i] W[o, i] + b[o]
std::vector<double> linear(const std::vector<double>& x, std::int64_t rows, std::int64_t in,
                           const std::vector<double>& W, std::int64_t out, const std::vector<double>& b) {
  std::vector<double> y(std::size_t(rows * out));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[std::size_t(o)];
      for (std::int64_t i = 0; i < in; ++i) s += x[std::size_t(r * in + i)] * W[std::size_t(o * in + i)];
      y[std::size_t(r * out + o)] = s;
    }
  return y;
}

// torch.nn.MultiheadAttention's forward (batch_first) in double, written from the definition.
// padding [B, Sk] (nonzero = ignore), additive [Sq, Sk] (or empty).
std::vector<double> mha_reference(const Model& m, const std::vector<double>& xq, const std::vector<double>& xk,
                                  const std::vector<double>& xv, std::int64_t B, std::int64_t Sq, std::int64_t Sk,
                                  Causal causal, const std::vector<std::uint8_t>& padding = {},
                                  const std::vector<double>& additive = {}, double (*round)(double) = nullptr) {
  const MhaConfig& c = m.cfg;
  const std::int64_t H = c.heads, Hkv = c.kv_heads, hd = c.head_dim, nq = H * hd, nkv = Hkv * hd;
  // A bf16/f16 layer's activations are rounded to its dtype: the projections' outputs and the
  // attention output (round == nullptr: f64 throughout).
  auto rounded = [&](std::vector<double> a) {
    if (round != nullptr)
      for (double& x : a) x = round(x);
    return a;
  };
  const auto q = rounded(linear(xq, B * Sq, c.d_model, m.w.wq, nq, m.w.bq));
  const auto k = rounded(linear(xk, B * Sk, c.kdim, m.w.wk, nkv, m.w.bk));
  const auto v = rounded(linear(xv, B * Sk, c.vdim, m.w.wv, nkv, m.w.bv));
  std::vector<double> o(std::size_t(B * Sq * nq), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t hk = h / (H / Hkv);
      for (std::int64_t i = 0; i < Sq; ++i) {
        std::vector<double> s(std::size_t(Sk), -INFINITY);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < Sk; ++j) {
          const std::int64_t pos = causal == Causal::top_left ? i : i + Sk - Sq;
          if (causal != Causal::none && j > pos) continue;
          if (!padding.empty() && padding[std::size_t(b * Sk + j)]) continue;
          double dot = 0;
          for (std::int64_t e = 0; e < hd; ++e)
            dot += q[std::size_t((b * Sq + i) * nq + h * hd + e)] * k[std::size_t((b * Sk + j) * nkv + hk * hd + e)];
          s[std::size_t(j)] = dot / std::sqrt(double(hd)) + (additive.empty() ? 0.0 : additive[std::size_t(i * Sk + j)]);
          mx = std::max(mx, s[std::size_t(j)]);
        }
        if (mx == -INFINITY) continue;  // no visible key: zeros
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - mx));
        for (std::int64_t e = 0; e < hd; ++e) {
          double acc = 0;
          for (std::int64_t j = 0; j < Sk; ++j) acc += s[std::size_t(j)] * v[std::size_t((b * Sk + j) * nkv + hk * hd + e)];
          o[std::size_t((b * Sq + i) * nq + h * hd + e)] = acc / l;
        }
      }
    }
  return rounded(linear(rounded(o), B * Sq, nq, m.w.wo, c.d_model, m.w.bo));
}

// x rounded to H and back: a bf16/f16 layer's rounding of its activations.
template <class H>
double round_to(double x) {
  return test::as_double(test::value<H>(x));
}

// A model whose weights are rounded to H, and the same weights as H.
template <class H>
std::pair<Model, MhaWeights<H>> rounded_model(const Model& m) {
  const MhaWeights<H> h = weights_as<H>(m.w);
  Model r = m;
  r.w = weights_as<double>(h);
  return {r, h};
}
// The contract's tolerance for each 16-bit format (docs/design.md, numerics).
template <class H>
constexpr double kTol16 = std::is_same_v<H, bfloat16> ? 1e-2 : 2e-3;

template <class T>
double max_rel_err(const std::vector<T>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 1.0, err = 0.0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(test::as_double(got[i]) - want[i]);
    err = std::max(err, std::isnan(d) ? INFINITY : d);
  }
  return err / scale;
}

}  // namespace

TEST_CASE("MHA self-attention equals the float64 definition (f64 and f32, every backend)") {
  std::mt19937_64 rng(test::base_seed() + 31);
  const std::int64_t B = 2, S = 11, d = 24;
  for (auto [H, Hkv, bias] : {std::tuple{4, 4, true}, std::tuple{6, 2, false}, std::tuple{4, 1, true}}) {
    const Model m = random_model(rng, d, H, Hkv, d / H, d, d, bias);
    const auto x = randn(rng, std::size_t(B * S * d));
    std::vector<std::uint8_t> padding(std::size_t(B * S), 0);
    padding[3] = padding[S + 7] = padding[S + 10] = 1;
    for (Causal causal : {Causal::none, Causal::top_left}) {
      for (bool pad : {false, true}) {
        const auto want = mha_reference(m, x, x, x, B, S, S, causal, pad ? padding : std::vector<std::uint8_t>{});
        MhaOptions opt;
        opt.causal = causal;
        if (pad) opt.key_padding_mask = padding;
        CAPTURE_VALUE(H);
        CAPTURE_VALUE(Hkv);
        CAPTURE(int(causal));
        CAPTURE(pad);
        const MultiHeadAttention l64(m.cfg, m.w);
        for (Backend be : test::backends(true)) {
          opt.backend = be;
          std::vector<double> y(std::size_t(B * S * d));
          l64.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
          CHECK(max_rel_err(y, want) <= 1e-12);
        }
        const MultiHeadAttention l32(m.cfg, weights_as<float>(m.w));
        const auto xf = conv<float>(x);
        for (Backend be : test::backends(false)) {
          opt.backend = be;
          std::vector<float> y(std::size_t(B * S * d));
          l32.forward(ConstSeqView(xf.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
          CHECK(max_rel_err(y, want) <= 2e-5);
        }
      }
    }
  }
}

TEST_CASE("MHA cross-attention with kdim and vdim != d_model, padding and an additive mask") {
  std::mt19937_64 rng(test::base_seed() + 32);
  const std::int64_t B = 2, Sq = 5, Sk = 8, d = 12, kdim = 10, vdim = 7;
  const Model m = random_model(rng, d, 3, 3, 4, kdim, vdim, true);
  const auto xq = randn(rng, std::size_t(B * Sq * d)), xk = randn(rng, std::size_t(B * Sk * kdim)),
             xv = randn(rng, std::size_t(B * Sk * vdim));
  std::vector<std::uint8_t> padding(std::size_t(B * Sk), 0);
  padding[6] = padding[Sk + 0] = 1;
  std::vector<double> additive = randn(rng, std::size_t(Sq * Sk));
  additive[2 * Sk + 1] = -INFINITY;
  const MultiHeadAttention layer(m.cfg, m.w);
  CHECK(layer.config().kdim == kdim);
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    for (int variant = 0; variant < 3; ++variant) {  // padding, additive, both
      const bool pad = variant != 1, add = variant != 0;
      const auto want = mha_reference(m, xq, xk, xv, B, Sq, Sk, causal, pad ? padding : std::vector<std::uint8_t>{},
                                      add ? additive : std::vector<double>{});
      MhaOptions opt;
      opt.causal = causal;
      if (pad) opt.key_padding_mask = padding;
      if (add) opt.attn_mask = ConstTensorView(additive.data(), {1, 1, Sq, Sk});
      std::vector<double> y(std::size_t(B * Sq * d));
      layer.forward(ConstSeqView(xq.data(), B, Sq, d), ConstSeqView(xk.data(), B, Sk, kdim),
                    ConstSeqView(xv.data(), B, Sk, vdim), SeqView(y.data(), B, Sq, d), opt);
      CAPTURE(variant);
      CAPTURE(int(causal));
      CHECK(max_rel_err(y, want) <= 1e-12);
    }
  }
  // Self-attention is refused for such a layer, naming the argument.
  std::vector<double> y(std::size_t(B * Sq * d));
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(xq.data(), B, Sq, d), SeqView(y.data(), B, Sq, d)),
                       doctest::Contains("kdim"), Error);
}

TEST_CASE("MHA validates weights, inputs and options") {
  std::mt19937_64 rng(test::base_seed() + 33);
  Model m = random_model(rng, 8, 2, 2, 4, 8, 8, true);
  m.w.wk.pop_back();
  CHECK_THROWS_WITH_AS(MultiHeadAttention(m.cfg, m.w), doctest::Contains("weights.wk"), Error);
  m = random_model(rng, 8, 2, 2, 4, 8, 8, true);
  MhaConfig bad = m.cfg;
  bad.kv_heads = 3;
  CHECK_THROWS_WITH_AS(MultiHeadAttention(bad, m.w), doctest::Contains("config.kv_heads"), Error);
  const MultiHeadAttention layer(m.cfg, m.w);
  const auto x = randn(rng, 2 * 3 * 8);
  std::vector<double> y(2 * 3 * 8);
  std::vector<float> yf(2 * 3 * 8);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 3, 8), SeqView(yf.data(), 2, 3, 8)),
                       doctest::Contains("out"), Error);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 4, 6), SeqView(y.data(), 2, 4, 6)),
                       doctest::Contains("query"), Error);
  MhaOptions opt;
  const std::uint8_t pad6[6] = {};
  opt.key_padding_mask = pad6;  // with an additive mask the layer combines both: the view is checked
  opt.attn_mask = ConstTensorView(static_cast<const float*>(nullptr), {1, 1, 3, 3});
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 3, 8), SeqView(y.data(), 2, 3, 8), opt),
                       doctest::Contains("options.attn_mask"), Error);
  opt.attn_mask = ConstTensorView();
  const std::uint8_t pad[5] = {};
  opt.key_padding_mask = pad;
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 3, 8), SeqView(y.data(), 2, 3, 8), opt),
                       doctest::Contains("key_padding_mask"), Error);

  // B * S rows through the projections overflow 64 bits (2^31 * 2^31 * 24): an Error before
  // any buffer is sized, for self- and cross-attention and a cached step (was a crash).
  const std::int64_t big = std::int64_t{1} << 31;
  const ConstSeqView huge(x.data(), big, big, 8);
  CHECK_THROWS_WITH_AS(layer.forward(huge, SeqView(y.data(), big, big, 8)), doctest::Contains("query: size overflow"),
                       Error);
  const ConstSeqView q1(x.data(), big, 1, 8);
  CHECK_THROWS_WITH_AS(layer.forward(q1, huge, huge, SeqView(y.data(), big, 1, 8)), doctest::Contains("key: size overflow"),
                       Error);
  KvCache cache(layer, 1, 4);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, std::numeric_limits<std::int64_t>::max(), 8), cache,
                                     SeqView(y.data(), 1, std::numeric_limits<std::int64_t>::max(), 8)),
                       doctest::Contains("query: size overflow"), Error);
  CHECK(cache.lengths()[0] == 0);
}

TEST_CASE("KV cache: decoding token by token and in chunks of 3 equals the full causal forward") {
  std::mt19937_64 rng(test::base_seed() + 34);
  const std::int64_t d = 16, H = 4, Hkv = 2, hd = 4;
  const Model m = random_model(rng, d, H, Hkv, hd, d, d, true);
  const MultiHeadAttention layer(m.cfg, m.w);
  // Two sequences of different lengths: prompts of 5 and 9 tokens, then 7 generated tokens each.
  const std::int64_t prompt[2] = {5, 9}, gen = 7, P = 9;
  std::vector<std::vector<double>> tokens(2);
  for (auto& t : tokens) t = randn(rng, std::size_t((P + gen) * d));
  // Expected: the full causal forward of each sequence alone.
  std::vector<std::vector<double>> full(2);
  for (int s = 0; s < 2; ++s) {
    const std::int64_t n = prompt[s] + gen;
    const std::vector<double> x(tokens[s].begin(), tokens[s].begin() + n * d);
    full[s] = mha_reference(m, x, x, x, 1, n, n, Causal::top_left);
  }
  for (std::int64_t chunk : {1, 3}) {
    CAPTURE(chunk);
    KvCache cache(layer, 2, 32);
    // Prefill both prompts right-padded to P tokens, then drop the padding from sequence 0.
    std::vector<double> x(std::size_t(2 * P * d), 0.0), y(std::size_t(2 * P * d));
    for (int s = 0; s < 2; ++s)
      std::copy(tokens[s].begin(), tokens[s].begin() + prompt[s] * d, x.begin() + s * P * d);
    layer.forward(ConstSeqView(x.data(), 2, P, d), cache, SeqView(y.data(), 2, P, d));
    cache.truncate(0, prompt[0]);
    for (int s = 0; s < 2; ++s)
      for (std::int64_t t = 0; t < prompt[s]; ++t)
        for (std::int64_t e = 0; e < d; ++e)
          CHECK(std::abs(y[std::size_t((s * P + t) * d + e)] - full[s][std::size_t(t * d + e)]) <= 1e-12);
    // Generate in steps of `chunk` tokens (the last step may be shorter).
    for (std::int64_t done = 0; done < gen; done += chunk) {
      const std::int64_t T = std::min(chunk, gen - done);
      std::vector<double> xs(std::size_t(2 * T * d)), ys(std::size_t(2 * T * d));
      for (int s = 0; s < 2; ++s)
        std::copy(tokens[s].begin() + (prompt[s] + done) * d, tokens[s].begin() + (prompt[s] + done + T) * d,
                  xs.begin() + s * T * d);
      layer.forward(ConstSeqView(xs.data(), 2, T, d), cache, SeqView(ys.data(), 2, T, d));
      for (int s = 0; s < 2; ++s) {
        CHECK(cache.lengths()[std::size_t(s)] == prompt[s] + done + T);
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t e = 0; e < d; ++e)
            CHECK(std::abs(ys[std::size_t((s * T + t) * d + e)] - full[s][std::size_t((prompt[s] + done + t) * d + e)]) <=
                  1e-12);
      }
    }
  }
}

TEST_CASE("KV cache: capacity, truncate and layer checks leave the cache as it was") {
  std::mt19937_64 rng(test::base_seed() + 35);
  const Model m = random_model(rng, 8, 2, 1, 4, 8, 8, false);
  const MultiHeadAttention layer(m.cfg, m.w);
  KvCache cache(layer, 1, 4);
  const auto x = randn(rng, 3 * 8);
  std::vector<double> y(3 * 8);
  layer.forward(ConstSeqView(x.data(), 1, 3, 8), cache, SeqView(y.data(), 1, 3, 8));
  CHECK(cache.lengths()[0] == 3);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 2, 8), cache, SeqView(y.data(), 1, 2, 8)),
                       doctest::Contains("capacity"), Error);
  CHECK(cache.lengths()[0] == 3);
  MhaOptions opt;
  opt.causal = Causal::top_left;
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 1, 8), cache, SeqView(y.data(), 1, 1, 8), opt),
                       doctest::Contains("options.causal"), Error);
  CHECK(cache.lengths()[0] == 3);
  const auto lengths = cache.lengths();  // a span taken before a step sees the step's lengths
  layer.forward(ConstSeqView(x.data(), 1, 0, 8), cache, SeqView(y.data(), 1, 0, 8));
  CHECK(lengths[0] == 3);
  CHECK_THROWS_WITH_AS(KvCache(layer, 1, std::int64_t{1} << 60), doctest::Contains("capacity"), Error);
  CHECK_THROWS_AS(cache.truncate(0, 4), Error);
  CHECK_THROWS_AS(cache.truncate(1, 0), Error);
  cache.truncate(0, 1);
  CHECK(cache.lengths()[0] == 1);
  cache.reset();
  CHECK(cache.lengths()[0] == 0);
  const Model other = random_model(rng, 8, 2, 2, 4, 8, 8, false);
  const MultiHeadAttention layer2(other.cfg, other.w);
  CHECK_THROWS_WITH_AS(layer2.forward(ConstSeqView(x.data(), 1, 1, 8), cache, SeqView(y.data(), 1, 1, 8)),
                       doctest::Contains("cache"), Error);
}

TEST_CASE_TEMPLATE("bf16/f16 MHA layer: self- and cross-attention equal the float64 definition with the layer's "
                   "roundings (projections and attention output rounded to its dtype)", H, bfloat16, float16) {
  std::mt19937_64 rng(test::base_seed() + 36);
  const std::int64_t B = 2, S = 11, d = 32;
  for (auto [heads, kv, bias] : {std::tuple{4, 4, true}, std::tuple{8, 2, false}}) {
    const auto [m, w] = rounded_model<H>(random_model(rng, d, heads, kv, d / heads, d, d, bias));
    const MultiHeadAttention layer(m.cfg, w);
    CHECK(layer.dtype() == dtype_of<H>());
    const auto xh = conv<H>(randn(rng, std::size_t(B * S * d)));
    const auto x = conv<double>(xh);
    std::vector<std::uint8_t> padding(std::size_t(B * S), 0);
    padding[2] = padding[S + 9] = 1;
    for (Causal causal : {Causal::none, Causal::top_left}) {
      const auto want = mha_reference(m, x, x, x, B, S, S, causal, padding, {}, &round_to<H>);
      MhaOptions opt;
      opt.causal = causal;
      opt.key_padding_mask = padding;
      for (Backend be : {Backend::native, Backend::reference}) {
        CAPTURE_VALUE(heads);
        CAPTURE(int(causal));
        CAPTURE(int(be));
        opt.backend = be;
        std::vector<H> y(std::size_t(B * S * d));
        layer.forward(ConstSeqView(xh.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
        CHECK(max_rel_err(y, want) <= kTol16<H>);
      }
    }
    // Cross-attention with an additive mask in the layer's dtype and padding (combined in f32).
    const std::int64_t Sk = 7;
    const auto kvh = conv<H>(randn(rng, std::size_t(B * Sk * d)));
    const auto kvx = conv<double>(kvh);
    const auto addh = conv<H>(randn(rng, std::size_t(S * Sk)));
    std::vector<std::uint8_t> pad(std::size_t(B * Sk), 0);
    pad[3] = 1;
    const auto want = mha_reference(m, x, kvx, kvx, B, S, Sk, Causal::none, pad, conv<double>(addh), &round_to<H>);
    MhaOptions opt;
    opt.key_padding_mask = pad;
    opt.attn_mask = ConstTensorView(addh.data(), {1, 1, S, Sk});
    std::vector<H> y(std::size_t(B * S * d));
    layer.forward(ConstSeqView(xh.data(), B, S, d), ConstSeqView(kvh.data(), B, Sk, d), ConstSeqView(kvh.data(), B, Sk, d),
                  SeqView(y.data(), B, S, d), opt);
    CHECK(max_rel_err(y, want) <= kTol16<H>);
    // An input of another dtype is refused, naming it.
    const auto xf = conv<float>(x);
    CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(xf.data(), B, S, d), SeqView(y.data(), B, S, d)),
                         doctest::Contains("query: dtype f32 differs from the layer's"), Error);
  }
}

TEST_CASE("KV cache in bf16/f16, and caches of a dtype of their own: decode steps equal the full forward") {
  std::mt19937_64 rng(test::base_seed() + 37);
  const std::int64_t d = 32, heads = 4, kv = 2, n = 9, prompt = 4;
  const Model m = random_model(rng, d, heads, kv, d / heads, d, d, true);
  const auto [mb, wb] = rounded_model<bfloat16>(m);
  const auto [mh, wh] = rounded_model<float16>(m);
  const auto x = randn(rng, std::size_t(n * d));
  const MultiHeadAttention f32(m.cfg, weights_as<float>(m.w)), bf16(mb.cfg, wb), f16(mh.cfg, wh);
  // Runs the prompt then one token at a time through a cache of `dtype`; returns the outputs.
  auto decode = [&]<class T>(const MultiHeadAttention& layer, DType dtype, std::vector<T> xt) {
    KvCache cache(layer, 1, 16, dtype);
    CHECK(cache.dtype() == dtype);
    std::vector<T> y(xt.size());
    layer.forward(ConstSeqView(xt.data(), 1, prompt, d), cache, SeqView(y.data(), 1, prompt, d));
    for (std::int64_t t = prompt; t < n; ++t)
      layer.forward(ConstSeqView(xt.data() + t * d, 1, 1, d), cache, SeqView(y.data() + t * d, 1, 1, d));
    CHECK(cache.lengths()[0] == n);
    return y;
  };
  // bf16 and f16 layers with caches in their dtype: the full forward's roundings.
  {
    const auto xb = conv<bfloat16>(x);
    const auto want = mha_reference(mb, conv<double>(xb), conv<double>(xb), conv<double>(xb), 1, n, n, Causal::top_left, {}, {},
                                    &round_to<bfloat16>);
    CHECK(max_rel_err(decode(bf16, DType::bf16, xb), want) <= kTol16<bfloat16>);
    // ... and with an f32 cache (K and V kept as the layer rounded them): the same numbers.
    CHECK(max_rel_err(decode(bf16, DType::f32, xb), want) <= kTol16<bfloat16>);
    const auto xh = conv<float16>(x);
    const auto want16 = mha_reference(mh, conv<double>(xh), conv<double>(xh), conv<double>(xh), 1, n, n, Causal::top_left, {}, {},
                                      &round_to<float16>);
    CHECK(max_rel_err(decode(f16, DType::f16, xh), want16) <= kTol16<float16>);
  }
  // An f32 layer with bf16 and f16 caches (as llama.cpp keeps f16 caches beside f32
  // activations): within each format's tolerance of the f64 forward.
  const auto want = mha_reference(m, x, x, x, 1, n, n, Causal::top_left);
  const auto xf = conv<float>(x);
  CHECK(max_rel_err(decode(f32, DType::bf16, xf), want) <= kTol16<bfloat16>);
  CHECK(max_rel_err(decode(f32, DType::f16, xf), want) <= kTol16<float16>);
  CHECK(max_rel_err(decode(f32, DType::f32, xf), want) <= 2e-5);
  CHECK_THROWS_WITH_AS(KvCache(f32, 1, 4, DType::u8), doctest::Contains("dtype: expected f32, f64, bf16, f16, int8, fp8_e4m3 or fp8_e5m2, got u8"), Error);
}

TEST_CASE("bf16/f16 layers load from BF16 safetensors as they are, and from F32 rounded once") {
  std::mt19937_64 rng(test::base_seed() + 38);
  const std::int64_t d = 16, heads = 2;
  const Model m = random_model(rng, d, heads, heads, d / heads, d, d, true);
  const auto [mb, wb] = rounded_model<bfloat16>(m);
  const std::string pb = test::temp_path("mha_bf16"), pf = test::temp_path("mha_f32");
  auto put = [&](const std::string& path, DType dt, const auto& w) {
    auto t = [&](const auto& v, std::vector<std::int64_t> shape) { return SafetensorsTensor{dt, std::move(shape), v.data()}; };
    write_safetensors(path, {{"q_proj.weight", t(w.wq, {d, d})}, {"k_proj.weight", t(w.wk, {d, d})},
                             {"v_proj.weight", t(w.wv, {d, d})}, {"o_proj.weight", t(w.wo, {d, d})},
                             {"q_proj.bias", t(w.bq, {d})}, {"o_proj.bias", t(w.bo, {d})}});
  };
  MhaWeights<bfloat16> hf = wb;  // the file has no k/v biases
  hf.bk.clear(), hf.bv.clear();
  put(pb, DType::bf16, hf);
  const auto wf = weights_as<float>(m.w);
  put(pf, DType::f32, wf);
  const auto xb = conv<bfloat16>(randn(rng, std::size_t(3 * d)));
  auto run = [&](const MultiHeadAttention& l) {
    std::vector<bfloat16> y(xb.size());
    l.forward(ConstSeqView(xb.data(), 1, 3, d), SeqView(y.data(), 1, 3, d));
    std::vector<std::uint16_t> bits;
    for (bfloat16 v : y) bits.push_back(v.bits);
    return bits;
  };
  const MultiHeadAttention mem(MhaConfig{d, heads}, hf);
  CHECK(run(MultiHeadAttention::from_safetensors(pb, heads, 0, "", DType::bf16)) == run(mem));
  // F32 tensors rounded once to bf16 are the same weights.
  MhaWeights<bfloat16> from_f32 = wb;
  from_f32.bk.clear(), from_f32.bv.clear();
  CHECK(run(MultiHeadAttention::from_safetensors(pf, heads, 0, "", DType::bf16)) ==
        run(MultiHeadAttention(MhaConfig{d, heads}, from_f32)));
  std::remove(pb.c_str());
  std::remove(pf.c_str());
}

TEST_CASE("the layer's attention weights: per head (rows sum to 1, zeros above the causal diagonal and past the cache), "
          "averaged over heads, the output unchanged; validation") {
  std::mt19937_64 rng(test::base_seed() + 101);
  const std::int64_t B = 2, S = 6, d = 16, H = 4;
  MhaWeights<double> w{randn(rng, 256, 0.3), randn(rng, 256, 0.3), randn(rng, 256, 0.3), randn(rng, 256, 0.3),
                       randn(rng, 16), randn(rng, 16), randn(rng, 16), randn(rng, 16)};
  const MultiHeadAttention layer(MhaConfig{.d_model = d, .heads = H}, w);
  const std::vector<double> x = randn(rng, static_cast<std::size_t>(B * S * d));
  for (Backend be : {Backend::reference, Backend::native}) {
    CAPTURE(backend_name(be));
    MhaOptions o;
    o.causal = Causal::top_left;
    o.backend = be;
    std::vector<double> y0(x.size()), y1(x.size()), y2(x.size());
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y0.data(), B, S, d), o);
    test::Buffer<double> per({B, H, S, S}), avg({B, 1, S, S});
    o.attn_weights = per.view();
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y1.data(), B, S, d), o);
    o.attn_weights = avg.view();
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y2.data(), B, S, d), o);
    CHECK(y0 == y1);
    CHECK(y0 == y2);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < S; ++i) {
        for (std::int64_t h = 0; h < H; ++h) {
          double sum = 0;
          for (std::int64_t j = 0; j < S; ++j) {
            if (j > i) CHECK(per.at(b, h, i, j) == 0.0);
            sum += per.at(b, h, i, j);
          }
          CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
        }
        for (std::int64_t j = 0; j < S; ++j) {
          double mean = 0;
          for (std::int64_t h = 0; h < H; ++h) mean += per.at(b, h, i, j) / H;
          CHECK(avg.at(b, 0, i, j) == doctest::Approx(mean).epsilon(1e-12));
        }
      }
    // incremental: Sk is the capacity, keys past each sequence's length weigh 0
    KvCache cache(layer, B, 10);
    test::Buffer<float> wc({B, H, S, 10});
    MhaOptions io;
    io.backend = be;
    io.attn_weights = wc.view();
    std::vector<double> yc(x.size());
    layer.forward(ConstSeqView(x.data(), B, S, d), cache, SeqView(yc.data(), B, S, d), io);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < S; ++i)
          for (std::int64_t j = 0; j < 10; ++j)
            CHECK(double(wc.at(b, h, i, j)) == doctest::Approx(j < S ? per.at(b, h, i, j) : 0.0).epsilon(1e-6));
  }
  MhaOptions bad;
  test::Buffer<double> wrong({B, 2, S, S});
  bad.attn_weights = wrong.view();
  std::vector<double> y(x.size());
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), bad),
                       doctest::Contains("options.attn_weights"), Error);
}

// A regression: issue 23's mutation run planted the bug this title names and the rest of the suite passed.
TEST_CASE("regression: KV cache: a step that exactly fills the capacity succeeds; one token more is refused") {
  std::mt19937_64 rng(test::base_seed() + 74);
  const std::int64_t d = 8;
  MhaWeights<float> w;
  w.wq = test::normal(rng, std::size_t(d * d), 0.3f), w.wk = test::normal(rng, std::size_t(d * d), 0.3f);
  w.wv = test::normal(rng, std::size_t(d * d), 0.3f), w.wo = test::normal(rng, std::size_t(d * d), 0.3f);
  const MultiHeadAttention layer(MhaConfig{.d_model = d, .heads = 2}, w);
  const std::vector<float> x = test::normal(rng, std::size_t(4 * d), 1.f);
  std::vector<float> y(x.size());
  // First, two sequences, the first full and the second not: a step is refused for the first.
  // (Were the bound off by one, the first sequence's extra row would land inside the cache, in
  // the next head's first row: this REQUIRE then ends the case with a failed assertion before
  // the single-sequence steps below would write past the buffer.)
  KvCache two(layer, 2, 4);
  std::vector<float> x2(static_cast<std::size_t>(2 * 4 * d)), y2(x2.size());
  for (std::size_t i = 0; i < x2.size(); ++i) x2[i] = x[i % x.size()];
  layer.forward(ConstSeqView(x2.data(), 2, 4, d), two, SeqView(y2.data(), 2, 4, d));
  two.truncate(1, 2);
  REQUIRE_THROWS_WITH_AS(layer.forward(ConstSeqView(x2.data(), 2, 1, d), two, SeqView(y2.data(), 2, 1, d)),
                         doctest::Contains("capacity"), Error);
  CHECK(two.lengths()[0] == 4);
  CHECK(two.lengths()[1] == 2);
  for (std::int64_t first : {4, 3}) {  // one step of 4 tokens, or 3 then 1
    CAPTURE(first);
    KvCache cache(layer, 1, 4);
    CHECK_NOTHROW(layer.forward(ConstSeqView(x.data(), 1, first, d), cache, SeqView(y.data(), 1, first, d)));
    if (first < 4)
      CHECK_NOTHROW(layer.forward(ConstSeqView(x.data(), 1, 4 - first, d), cache, SeqView(y.data(), 1, 4 - first, d)));
    CHECK(cache.lengths()[0] == 4);
    CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 1, d), cache, SeqView(y.data(), 1, 1, d)),
                         doctest::Contains("capacity"), Error);
    CHECK(cache.lengths()[0] == 4);
  }
}
