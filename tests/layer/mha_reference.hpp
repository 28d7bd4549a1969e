// The multi-head attention layer's tests' shared parts: random models, the engine's weights in
// another dtype, and torch.nn.MultiheadAttention's forward in double written from the definition
// (projections, heads, softmax, output projection), with a 16-bit layer's roundings.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/test_util.hpp"

namespace mha_test {

using namespace simdattn;

inline std::vector<double> randn(std::mt19937_64& rng, std::size_t n, double sd = 1.0) {
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

inline Model random_model(std::mt19937_64& rng, std::int64_t d, std::int64_t H, std::int64_t Hkv, std::int64_t hd,
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
inline std::vector<double> linear(const std::vector<double>& x, std::int64_t rows, std::int64_t in,
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
inline std::vector<double> mha_reference(const Model& m, const std::vector<double>& xq, const std::vector<double>& xk,
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

}  // namespace mha_test
