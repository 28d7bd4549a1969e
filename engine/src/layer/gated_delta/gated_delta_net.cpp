// Gated DeltaNet (simdattn/gated_delta_net.hpp): the layer built (weights checked, the input
// projections' rows reordered to q | k | v | z | b | a and packed as one GEMM operand, the output
// projection packed), and its forward: the input projection, the causal conv over the state's
// window and the new rows, the gates, the gated delta rule (linear_attention/gated_delta.cpp) over
// the state, the gated RMSNorm, the output projection.
#include "simdattn/gated_delta_net.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "layer/pack.hpp"
#include "layer/projection.hpp"
#include "layer/storage.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"

namespace simdattn {

namespace detail {
namespace scratch {
struct GdnProjection : HugePagesSlot {};  // x's projections [M, q | k | v | z | b | a]
struct GdnConv : HugePagesSlot {};        // the conv's output [M, conv_dim]
struct GdnGates : ScratchSlot {};         // g | beta [M, 2 Hv], f32
struct GdnCore : HugePagesSlot {};        // the rule's output, then the norm's [M, Hv Dv]
}  // namespace scratch
}  // namespace detail

namespace {

using detail::narrow;
using detail::num;
using detail::widen;

template <class T>
float f32(T x) {
  return static_cast<float>(widen(x));
}
template <class T>
T round_to(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return narrow<T>(static_cast<double>(x));
}

// The layer of one dtype.
template <class T>
struct Built {
  using Element = T;
  detail::PackedWeights<T> w_in;   // W^T [hidden, n_proj], columns q | k | v | z | b | a
  detail::PackedWeights<T> w_out;  // W_out^T [Hv Dv, hidden]
  std::vector<float> conv;         // [K, conv_dim]: tap-major
  std::vector<float> neg_a;        // -exp(A_log) [Hv]
  std::vector<float> dt_bias;      // [Hv]
  std::vector<float> norm;         // [Dv], the layer dtype's values
};

}  // namespace

struct __attribute__((visibility("hidden"))) GatedDeltaNet::Storage {
  GatedDeltaNetConfig cfg;
  DType dtype = DType::f32;
  std::int64_t conv_dim = 0, nz = 0, n_proj = 0;  // 2 H Dk + Hv Dv; Hv Dv; conv_dim + nz + 2 Hv
  std::variant<Built<float>, Built<bfloat16>, Built<float16>> built;
};

namespace {

GatedDeltaNetConfig checked(const GatedDeltaNetConfig& c) {
  detail::check_isa();
  auto at_least = [](std::int64_t v, std::int64_t lo, const char* name) {
    if (v < lo || v > (std::int64_t{1} << 24)) throw Error(name, "expected an integer in [" + num(lo) + ", 2^24], got " + num(v));
  };
  at_least(c.hidden_size, 1, "config.hidden_size");
  at_least(c.key_heads, 1, "config.key_heads");
  at_least(c.value_heads, 1, "config.value_heads");
  at_least(c.key_head_dim, 1, "config.key_head_dim");
  at_least(c.value_head_dim, 1, "config.value_head_dim");
  at_least(c.conv_kernel, 1, "config.conv_kernel");
  if (c.value_heads % c.key_heads != 0)
    throw Error("config.value_heads", "expected a multiple of key_heads " + num(c.key_heads) + ", got " + num(c.value_heads));
  if (!(std::isfinite(c.norm_eps) && c.norm_eps >= 0.0))
    throw Error("config.norm_eps", "must be finite and >= 0, got " + std::to_string(c.norm_eps));
  const std::int64_t n_proj = 2 * c.key_heads * c.key_head_dim + 2 * c.value_heads * c.value_head_dim + 2 * c.value_heads;
  if (n_proj * c.hidden_size > (std::int64_t{1} << 36)) throw Error("config", "weights of more than 2^36 elements");
  return c;
}

template <class T>
void check_size(const std::vector<T>& v, std::int64_t n, const char* name, const std::string& shape) {
  if (static_cast<std::int64_t>(v.size()) != n)
    throw Error(name, "expected " + shape + " = " + num(n) + " elements, got " + num(static_cast<std::int64_t>(v.size())));
}

template <class T>
std::unique_ptr<GatedDeltaNet::Storage> build(const GatedDeltaNetConfig& config, GatedDeltaNetWeights<T>&& w) {
  const GatedDeltaNetConfig c = checked(config);
  const std::int64_t d = c.hidden_size, H = c.key_heads, Hv = c.value_heads, Dk = c.key_head_dim, Dv = c.value_head_dim;
  const std::int64_t r = Hv / H, K = c.conv_kernel;
  auto st = std::make_unique<GatedDeltaNet::Storage>();
  st->cfg = c;
  st->dtype = dtype_of<T>();
  st->conv_dim = 2 * H * Dk + Hv * Dv;
  st->nz = Hv * Dv;
  st->n_proj = st->conv_dim + st->nz + 2 * Hv;
  const std::int64_t n_qkvz = 2 * H * Dk + 2 * Hv * Dv;
  check_size(w.in_proj_qkvz, n_qkvz * d, "weights.in_proj_qkvz", "[2*H*Dk + 2*Hv*Dv, hidden] " + detail::shape_str({n_qkvz, d}));
  check_size(w.in_proj_ba, 2 * Hv * d, "weights.in_proj_ba", "[2*Hv, hidden] " + detail::shape_str({2 * Hv, d}));
  check_size(w.conv, st->conv_dim * K, "weights.conv", "[conv_dim, kernel] " + detail::shape_str({st->conv_dim, K}));
  check_size(w.dt_bias, Hv, "weights.dt_bias", "[value_heads]");
  check_size(w.A_log, Hv, "weights.A_log", "[value_heads]");
  check_size(w.norm, Dv, "weights.norm", "[value_head_dim]");
  check_size(w.out_proj, d * st->nz, "weights.out_proj", "[hidden, Hv*Dv] " + detail::shape_str({d, st->nz}));
  auto finite = [](const auto& v, const char* name) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(f32(v[i]))) throw Error(name, "holds a NaN or an infinity at " + num(static_cast<std::int64_t>(i)));
  };
  finite(w.in_proj_qkvz, "weights.in_proj_qkvz"), finite(w.in_proj_ba, "weights.in_proj_ba"), finite(w.conv, "weights.conv");
  finite(w.dt_bias, "weights.dt_bias"), finite(w.A_log, "weights.A_log"), finite(w.norm, "weights.norm");
  finite(w.out_proj, "weights.out_proj");
  Built<T> b;
  // W^T with its columns in the order the forward reads them: the per-key-head groups of
  // in_proj_qkvz [q | k | v (r heads) | z (r heads)] and of in_proj_ba [b (r) | a (r)] taken apart
  std::vector<T> t(static_cast<std::size_t>(d * st->n_proj));
  auto column = [&](const std::vector<T>& W, std::int64_t row, std::int64_t col) {
    for (std::int64_t i = 0; i < d; ++i)
      t[static_cast<std::size_t>(i * st->n_proj + col)] = W[static_cast<std::size_t>(row * d + i)];
  };
  const std::int64_t group = 2 * Dk + 2 * r * Dv, k0 = H * Dk, v0 = 2 * H * Dk, z0 = st->conv_dim, b0 = z0 + st->nz;
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t g0 = h * group;
    for (std::int64_t e = 0; e < Dk; ++e) {
      column(w.in_proj_qkvz, g0 + e, h * Dk + e);
      column(w.in_proj_qkvz, g0 + Dk + e, k0 + h * Dk + e);
    }
    for (std::int64_t e = 0; e < r * Dv; ++e) {
      column(w.in_proj_qkvz, g0 + 2 * Dk + e, v0 + h * r * Dv + e);
      column(w.in_proj_qkvz, g0 + 2 * Dk + r * Dv + e, z0 + h * r * Dv + e);
    }
    for (std::int64_t j = 0; j < r; ++j) {
      column(w.in_proj_ba, h * 2 * r + j, b0 + h * r + j);
      column(w.in_proj_ba, h * 2 * r + r + j, b0 + Hv + h * r + j);
    }
  }
  b.w_in = detail::pack_weights(t.data(), st->n_proj, d, st->n_proj);
  {
    std::vector<T> o(w.out_proj.size());
    detail::transpose_into(w.out_proj, d, st->nz, o.data(), d);
    b.w_out = detail::pack_weights(o.data(), d, st->nz, d);
  }
  b.conv.resize(static_cast<std::size_t>(K * st->conv_dim));
  for (std::int64_t ch = 0; ch < st->conv_dim; ++ch)
    for (std::int64_t j = 0; j < K; ++j)
      b.conv[static_cast<std::size_t>(j * st->conv_dim + ch)] = f32(w.conv[static_cast<std::size_t>(ch * K + j)]);
  for (std::int64_t h = 0; h < Hv; ++h) {
    const float a = std::exp(w.A_log[static_cast<std::size_t>(h)]);
    if (!std::isfinite(a)) throw Error("weights.A_log", "exp(A_log) overflows at " + num(h));
    b.neg_a.push_back(-a);
  }
  b.dt_bias = std::move(w.dt_bias);
  for (float x : w.norm) b.norm.push_back(f32(round_to<T>(x)));
  st->built = std::move(b);
  return st;
}

// x finite (Error("x") naming the first element that is not).
template <class T>
void check_finite_rows(const T* x, std::int64_t B, std::int64_t S, std::int64_t E) {
  for (std::int64_t m = 0; m < B * S; ++m) {
    const T* row = x + m * E;
    float z = 0.0f;
    for (std::int64_t e = 0; e < E; ++e) z += f32(row[e]) * 0.0f;  // NaN iff some element is not finite
    if (z == 0.0f) continue;
    for (std::int64_t e = 0; e < E; ++e)
      if (!std::isfinite(f32(row[e])))
        throw Error("x", "holds a NaN or an infinity at [" + num(m / S) + ", " + num(m % S) + ", " + num(e) + "]");
  }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch's softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

template <class T>
void forward_t(const GatedDeltaNet::Storage& L, const Built<T>& W, const T* x, std::int64_t B, std::int64_t S, T* y,
               GatedDeltaNetState* state, T* window, float* recurrent, int threads) {
  const GatedDeltaNetConfig& c = L.cfg;
  const std::int64_t M = B * S, d = c.hidden_size, Hv = c.value_heads, H = c.key_heads, Dk = c.key_head_dim;
  const std::int64_t Dv = c.value_head_dim, K = c.conv_kernel, cd = L.conv_dim, np = L.n_proj, nz = L.nz;
  const std::int64_t Kw = K - 1;
  T* P = detail::thread_buffer<T, detail::scratch::GdnProjection>().get(static_cast<std::size_t>(M * np));
  detail::project(x, M, d, d, W.w_in, 0, np, static_cast<const T*>(nullptr), P, np, threads);
  // the conv over time (the window's rows before the call's first), SiLU, rounded to T
  T* C = detail::thread_buffer<T, detail::scratch::GdnConv>().get(static_cast<std::size_t>(M * cd));
  detail::parallel_for(M, threads, 8, [&](std::int64_t m0, std::int64_t m1) {
    thread_local std::vector<float> acc;
    acc.resize(static_cast<std::size_t>(cd));
    for (std::int64_t m = m0; m < m1; ++m) {
      const std::int64_t b = m / S, t = m % S;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::int64_t j = 0; j < K; ++j) {
        const std::int64_t tau = t - Kw + j;  // this tap's time
        const T* src = tau >= 0 ? P + (b * S + tau) * np : window != nullptr ? window + (b * Kw + Kw + tau) * cd : nullptr;
        if (src == nullptr) continue;
        const float* w = W.conv.data() + j * cd;
        for (std::int64_t ch = 0; ch < cd; ++ch) acc[static_cast<std::size_t>(ch)] += w[ch] * f32(src[ch]);
      }
      T* out = C + m * cd;
      for (std::int64_t ch = 0; ch < cd; ++ch) out[ch] = round_to<T>(silu(acc[static_cast<std::size_t>(ch)]));
    }
  });
  // g and beta per (token, value head)
  float* G = detail::thread_buffer<float, detail::scratch::GdnGates>().get(static_cast<std::size_t>(M * 2 * Hv));
  for (std::int64_t m = 0; m < M; ++m) {
    const T* row = P + m * np + cd + nz;  // b | a
    for (std::int64_t h = 0; h < Hv; ++h) {
      const float a = f32(row[Hv + h]) + W.dt_bias[static_cast<std::size_t>(h)];
      G[m * 2 * Hv + h] = W.neg_a[static_cast<std::size_t>(h)] * softplus(a);
      G[m * 2 * Hv + Hv + h] = f32(round_to<T>(1.0f / (1.0f + std::exp(-f32(row[h])))));
    }
  }
  // the rule, over the state in place
  T* O = detail::thread_buffer<T, detail::scratch::GdnCore>().get(static_cast<std::size_t>(M * nz));
  {
    const ConstTensorView q(C, {B, S, H, Dk}, {S * cd, cd, Dk, 1});
    const ConstTensorView k(C + H * Dk, {B, S, H, Dk}, {S * cd, cd, Dk, 1});
    const ConstTensorView v(C + 2 * H * Dk, {B, S, Hv, Dv}, {S * cd, cd, Dv, 1});
    const ConstTensorView g(G, {B, S, Hv, 1}, {S * 2 * Hv, 2 * Hv, 1, 1});
    const ConstTensorView beta(G + Hv, {B, S, Hv, 1}, {S * 2 * Hv, 2 * Hv, 1, 1});
    GatedDeltaRuleOptions o;
    o.use_qk_l2norm = true;
    o.threads = threads;
    if (recurrent != nullptr) {
      o.initial_state = ConstTensorView(recurrent, {B, Hv, Dk, Dv});
      o.final_state = TensorView(recurrent, {B, Hv, Dk, Dv});
    }
    try {
      gated_delta_rule(q, k, v, g, beta, TensorView(O, {B, S, Hv, Dv}), o);
    } catch (const Error& e) {  // (nothing changed: the rule checks before it writes)
      throw Error("x", std::string("its projections through the layer are not finite (") + e.what() + ")");
    }
  }
  // the state's conv window: the last K - 1 pre-conv rows of (window, the call's rows)
  if (state != nullptr && Kw > 0) {
    for (std::int64_t b = 0; b < B; ++b) {
      T* win = window + b * Kw * cd;
      const std::int64_t keep = std::max<std::int64_t>(0, Kw - S);  // old rows kept, moved to the front
      if (keep > 0) std::memmove(win, win + (Kw - keep) * cd, static_cast<std::size_t>(keep * cd) * sizeof(T));
      for (std::int64_t i = keep; i < Kw; ++i)
        std::copy_n(P + (b * S + S - (Kw - i)) * np, cd, win + i * cd);
    }
  }
  // the gated RMSNorm per (token, value head), in place, then the output projection
  const auto eps = static_cast<float>(c.norm_eps);
  detail::parallel_for(M, threads, 8, [&](std::int64_t m0, std::int64_t m1) {
    for (std::int64_t m = m0; m < m1; ++m)
      for (std::int64_t h = 0; h < Hv; ++h) {
        T* o = O + m * nz + h * Dv;
        const T* z = P + m * np + cd + h * Dv;
        float ss = 0.0f;
        for (std::int64_t e = 0; e < Dv; ++e) ss += f32(o[e]) * f32(o[e]);
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(Dv) + eps);
        for (std::int64_t e = 0; e < Dv; ++e) {
          const float n = f32(round_to<T>(f32(o[e]) * inv));
          const float wn = f32(round_to<T>(W.norm[static_cast<std::size_t>(e)] * n));
          o[e] = round_to<T>(wn * silu(f32(z[e])));
        }
      }
  });
  detail::project(O, M, nz, nz, W.w_out, 0, d, static_cast<const T*>(nullptr), y, d, threads);
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetConfig& c, GatedDeltaNetWeights<float> w) : storage_(build(c, std::move(w))) {}
GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetConfig& c, GatedDeltaNetWeights<bfloat16> w)
    : storage_(build(c, std::move(w))) {}
GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetConfig& c, GatedDeltaNetWeights<float16> w)
    : storage_(build(c, std::move(w))) {}
GatedDeltaNet::~GatedDeltaNet() = default;
GatedDeltaNet::GatedDeltaNet(GatedDeltaNet&&) noexcept = default;
GatedDeltaNet& GatedDeltaNet::operator=(GatedDeltaNet&&) noexcept = default;

const GatedDeltaNetConfig& GatedDeltaNet::config() const noexcept { return storage_->cfg; }
DType GatedDeltaNet::dtype() const noexcept { return storage_->dtype; }

void GatedDeltaNet::forward(const ConstSeqView& x, const SeqView& out, GatedDeltaNetState* state, int threads) const {
  const Storage& L = *storage_;
  const GatedDeltaNetConfig& c = L.cfg;
  const std::string dt(dtype_name(L.dtype));
  if (x.dtype != L.dtype) throw Error("x", "dtype " + std::string(dtype_name(x.dtype)) + " differs from the layer's " + dt);
  if (x.B < 1 || x.S < 0 || x.E != c.hidden_size || (x.data == nullptr && x.S > 0))
    throw Error("x", "expected [B >= 1, S >= 0, hidden_size = " + num(c.hidden_size) + "], got " + detail::shape_str({x.B, x.S, x.E}));
  if (out.dtype != L.dtype) throw Error("out", "dtype " + std::string(dtype_name(out.dtype)) + " differs from the layer's " + dt);
  if (out.B != x.B || out.S != x.S || out.E != c.hidden_size || (out.data == nullptr && x.S > 0))
    throw Error("out", "expected x's shape " + detail::shape_str({x.B, x.S, c.hidden_size}) + ", got " +
                           detail::shape_str({out.B, out.S, out.E}));
  if (threads < 0) throw Error("threads", "expected >= 0 (0: the default), got " + num(threads));
  std::int64_t n = 0;
  if (__builtin_mul_overflow(x.B, x.S, &n) || __builtin_mul_overflow(n, L.n_proj, &n) || n > (std::int64_t{1} << 40))
    throw Error("x", "too large: " + detail::shape_str({x.B, x.S, x.E}) + " through " + num(L.n_proj) + "-wide projections");
  if (state != nullptr) {
    if (state->batch_ != x.B) throw Error("state", "holds " + num(state->batch_) + " sequences, x has " + num(x.B));
    if (state->dtype_ != L.dtype || state->channels_ != L.conv_dim || state->window_ != c.conv_kernel - 1 ||
        state->value_heads_ != c.value_heads || state->key_dim_ != c.key_head_dim || state->value_dim_ != c.value_head_dim)
      throw Error("state", "was made for a layer of other shapes or another dtype");
  }
  if (x.S == 0) return;
  std::visit(
      [&](const auto& W) {
        using T = typename std::decay_t<decltype(W)>::Element;
        check_finite_rows(static_cast<const T*>(x.data), x.B, x.S, x.E);
        const detail::CallScope in_use;
        T* window = nullptr;
        float* recurrent = nullptr;
        if (state != nullptr) {
          void* win = std::is_same_v<T, float> ? static_cast<void*>(state->window32_.data())
                                               : static_cast<void*>(state->window16_.data());
          window = state->window_ > 0 ? static_cast<T*>(win) : nullptr;
          recurrent = state->recurrent_.data();
        }
        forward_t<T>(L, W, static_cast<const T*>(x.data), x.B, x.S, static_cast<T*>(out.data), state, window, recurrent,
                     threads);
        if (state != nullptr) state->tokens_ += x.S;
      },
      L.built);
}

GatedDeltaNetState::GatedDeltaNetState(const GatedDeltaNet& layer, std::int64_t batch) {
  const GatedDeltaNetConfig& c = layer.config();
  if (batch < 1 || batch > (std::int64_t{1} << 24)) throw Error("batch", "expected an integer in [1, 2^24], got " + num(batch));
  dtype_ = layer.dtype();
  batch_ = batch;
  window_ = c.conv_kernel - 1;
  channels_ = 2 * c.key_heads * c.key_head_dim + c.value_heads * c.value_head_dim;
  value_heads_ = c.value_heads, key_dim_ = c.key_head_dim, value_dim_ = c.value_head_dim;
  const auto nw = static_cast<std::size_t>(batch * window_ * channels_);
  if (dtype_ == DType::f32) window32_.assign(nw, 0.0f);
  else window16_.assign(nw, 0);
  recurrent_.assign(static_cast<std::size_t>(batch * value_heads_ * key_dim_ * value_dim_), 0.0f);
}

std::int64_t GatedDeltaNetState::bytes() const noexcept {
  return batch_ * (value_heads_ * key_dim_ * value_dim_ * 4 + window_ * channels_ * static_cast<std::int64_t>(dtype_size(dtype_)));
}

void GatedDeltaNetState::reset() noexcept {
  std::fill(window32_.begin(), window32_.end(), 0.0f);
  std::fill(window16_.begin(), window16_.end(), std::uint16_t{0});
  std::fill(recurrent_.begin(), recurrent_.end(), 0.0f);
  tokens_ = 0;
}

ConstTensorView GatedDeltaNetState::conv_window() const noexcept {
  const void* p = dtype_ == DType::f32 ? static_cast<const void*>(window32_.data()) : static_cast<const void*>(window16_.data());
  ConstTensorView v;
  v.data = p;
  v.dtype = dtype_;
  v.shape = {batch_, 1, window_, channels_};
  v.strides = {window_ * channels_, window_ * channels_, channels_, 1};
  return v;
}

ConstTensorView GatedDeltaNetState::recurrent() const noexcept {
  return ConstTensorView(recurrent_.data(), {batch_, value_heads_, key_dim_, value_dim_});
}

}  // namespace simdattn
