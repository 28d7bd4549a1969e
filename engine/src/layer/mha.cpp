// The multi-head attention layer and its KV cache (see mha.hpp). Projections run on the native
// GEMM on pre-packed W^T (on the onednn backend: oneDNN matmuls on plain W^T); the attention core
// runs on the backend the options name, over strided views of the projection outputs.
#include "simdattn/mha.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <type_traits>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/element.hpp"
#include "core/problem.hpp"
#include "core/text.hpp"
#include "core/validate.hpp"
#include "layer/rope_table.hpp"
#include "linalg/convert.hpp"
#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "linalg/onednn/matmul.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"
#include "simdattn/safetensors.hpp"

namespace simdattn {
namespace {

namespace scratch {
struct MhaProjection : detail::HugePagesSlot {};    // the q|k|v projection (q alone in cross-attention)
struct MhaProjectionKv : detail::ScratchSlot {};    // the k and v projections in cross-attention
struct MhaAttentionOut : detail::HugePagesSlot {};  // the attention output [B, Sq, H*hd]
struct MhaMask : detail::ScratchSlot {};            // key padding combined with an additive mask
struct MhaPaddingMask : detail::ScratchSlot {};     // key padding as a boolean mask
struct MhaProjectionF32 : detail::ScratchSlot {};   // bf16/f16: a projection's f32 sums before rounding
struct MhaCacheQ : detail::ScratchSlot {};          // a cache of another dtype: q and the output in the cache's dtype
struct MhaCacheOut : detail::ScratchSlot {};
struct MhaWeights : detail::ScratchSlot {};         // per-head attention weights before they are averaged
struct MhaBatchRows : detail::ScratchSlot {};       // forward_batch: the steps' query rows gathered, then the output rows
}  // namespace scratch

using detail::GemmArgs;

using detail::shape_str;
using detail::thread_buffer;



template <class T>
constexpr bool kIs16Bit = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// A layer's weights, W^T packed once for its GEMM: the f32/f64 GEMM's panels, or the 16-bit
// GEMM's (bf16 and f16 layers keep their weights in their dtype).
template <class T>
using Weights = std::conditional_t<kIs16Bit<T>, detail::Packed16, detail::PackedB<T>>;

// The panel width of T's GEMM: column groups packed side by side start at multiples of it.
template <class T>
std::int64_t weights_nr() {
  if constexpr (kIs16Bit<T>) return detail::gemm16_kernels(simd::kernels(), std::is_same_v<T, bfloat16>).nr;
  else return simd::kernels().gemm<T>().blocking.nr;
}

// B [K, N] (row-major, leading dimension ldb) packed for T's GEMM.
template <class T>
Weights<T> pack_weights(const T* B, std::int64_t ldb, std::int64_t K, std::int64_t N) {
  if constexpr (kIs16Bit<T>)
    return detail::pack16_b(reinterpret_cast<const std::uint16_t*>(B), ldb, K, N, std::is_same_v<T, bfloat16>);
  else return detail::pack_matrix_b(B, ldb, K, N);
}

// y[M, N] = x[M, K] W^T + b (torch's nn.Linear), with W^T [K, ...] pre-packed for the GEMM
// (columns col .. col + N - 1 of it): no call packs a weight, and a decode step's
// matrix-vector product streams each panel once. bf16/f16: the products and the bias summed in
// f32, y rounded to nearest even.
// With `plain` (w unpacked: W^T row-major, w's columns apart), on a oneDNN matmul instead: the
// onednn backend's projections.
template <class T>
void linear(const T* x, std::int64_t M, std::int64_t K, std::int64_t ldx, const Weights<T>& w, std::int64_t col,
            std::int64_t N, const T* bias, T* y, std::int64_t ldy, int threads, const T* plain = nullptr) {
  if (M == 0 || N == 0) return;
  if (plain != nullptr) {
#if SIMDATTN_HAVE_ONEDNN
    const float* b = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      b = bias;
    } else if (bias != nullptr) {
      float* f = thread_buffer<float, scratch::MhaProjectionF32>().get(static_cast<std::size_t>(N));
      for (std::int64_t j = 0; j < N; ++j) f[j] = static_cast<float>(detail::widen(bias[j]));
      b = f;
    }
    detail::onednn_linear(dtype_of<T>(), x, M, K, ldx, plain + col, w.N, N, b, y, ldy, threads);
    return;
#endif
  }
  if constexpr (kIs16Bit<T>) {
    float* acc = thread_buffer<float, scratch::MhaProjectionF32>().get(static_cast<std::size_t>(M * N));
    detail::Gemm16Args g;
    g.M = M, g.N = N, g.K = K;
    g.A = reinterpret_cast<const std::uint16_t*>(x), g.lda = ldx;
    g.B = &w, g.b_col = col;
    g.C = acc, g.ldc = N;
    if (bias != nullptr) {
      for (std::int64_t j = 0; j < N; ++j) acc[j] = static_cast<float>(detail::widen(bias[j]));
      for (std::int64_t m = 1; m < M; ++m) std::memcpy(acc + m * N, acc, sizeof(float) * N);
      g.beta = 1.0f;
    }
    detail::gemm16(g, threads);
    for (std::int64_t m = 0; m < M; ++m) detail::convert_elements(acc + m * N, DType::f32, y + m * ldy, dtype_of<T>(), N);
  } else {
    GemmArgs<T> g;
    g.M = M, g.N = N, g.K = K;
    g.A = x, g.lda = ldx;
    g.packed_b = &w, g.b_col = col;
    g.C = y, g.ldc = ldy;
    g.c_row = bias;
    detail::gemm(g, threads);
  }
}

// dst[c * ld + r] = src[r * cols + c]: W [rows, cols] -> W^T [cols, rows] (leading dimension ld).
template <class T>
void transpose_into(const std::vector<T>& src, std::int64_t rows, std::int64_t cols, T* dst, std::int64_t ld) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * ld + r] = src[static_cast<std::size_t>(r * cols + c)];
}

}  // namespace

// Weights of one dtype, transposed to [in, out] and pre-packed for the GEMM, and the resolved
// configuration.
template <class T>
struct Layer {
  MhaConfig cfg;
  std::int64_t nq = 0, nkv = 0;   // rows of Wq (H*hd) and of Wk / Wv (Hkv*hd)
  bool packed = false;            // kdim == vdim == d_model: the input projections are one GEMM
  // Column groups Wq^T | Wk^T | Wv^T start at 0, k0, v0, each padded to the GEMM's panel width
  // (so that each can also be multiplied alone; zeros in the padding); n_in columns in all.
  // packed: w_in holds all three, [d_model, n_in]; otherwise w_in holds Wq^T [d_model, nq],
  // w_k Wk^T [kdim, nkv], w_v Wv^T [vdim, nkv]. The biases b_in follow the column groups.
  std::int64_t k0 = 0, v0 = 0, n_in = 0;
  Weights<T> w_in, w_k, w_v;
  std::vector<T> b_in;            // empty if no input bias was given
  Weights<T> wo;                  // Wo^T [nq, d_model]
  std::vector<T> bo;
  detail::RopeTable rope;         // cfg.rope's frequencies (rotary_dim 0: no rope)
  // The weights as plain W^T matrices (each packed one unpacked, row-major), for the onednn
  // backend's projections: made on the layer's first onednn call, never otherwise.
  struct Plain {
    std::once_flag once;
    std::vector<T> in, k, v, o;
  };
  std::unique_ptr<Plain> plain = std::make_unique<Plain>();

  const Weights<T>& wk() const { return packed ? w_in : w_k; }
  const Weights<T>& wv() const { return packed ? w_in : w_v; }
  std::int64_t k_col() const { return packed ? k0 : 0; }
  std::int64_t v_col() const { return packed ? v0 : 0; }
  const T* bq() const { return b_in.empty() ? nullptr : b_in.data(); }
  const T* bk() const { return b_in.empty() ? nullptr : b_in.data() + k0; }
  const T* bv() const { return b_in.empty() ? nullptr : b_in.data() + v0; }
  const T* bo_or_null() const { return bo.empty() ? nullptr : bo.data(); }
  // The plain W^T of `w` (one of the packed weights) when the call runs on the onednn backend,
  // else null (the native GEMM on the packed panels).
  const T* onednn_w(const MhaOptions& o, const Weights<T>& w) const {
    // (where oneDNN cannot take the layer's dtype, or is not built, attention() names the
    // backend's refusal; no copy is made for it)
    if (o.backend != Backend::onednn || !backend_takes(Backend::onednn, dtype_of<T>())) return nullptr;
    std::call_once(plain->once, [&] {
      auto unpack = [](const Weights<T>& p) {
        if constexpr (kIs16Bit<T>) {
          const std::vector<std::uint16_t> bits = detail::unpack16_b(p);
          std::vector<T> out(bits.size());
          for (std::size_t i = 0; i < bits.size(); ++i) out[i].bits = bits[i];
          return out;
        } else {
          return detail::unpack_matrix_b(p);
        }
      };
      plain->in = unpack(w_in);
      if (!packed) plain->k = unpack(w_k), plain->v = unpack(w_v);
      plain->o = unpack(wo);
    });
    const Plain& p = *plain;
    return &w == &w_in ? p.in.data() : &w == &wo ? p.o.data() : &w == &w_k ? (packed ? p.in.data() : p.k.data())
                                                                          : (packed ? p.in.data() : p.v.data());
  }
};

// Hidden: the class is exported, its implementation is not.
struct __attribute__((visibility("hidden"))) MultiHeadAttention::Impl {
  DType dtype = DType::f32;
  MhaConfig cfg;
  Layer<float> f32;  // the one of `dtype`; the others stay empty
  Layer<double> f64;
  Layer<bfloat16> bf16;
  Layer<float16> f16;
  template <class T>
  Layer<T>& layer() {
    if constexpr (std::is_same_v<T, float>) return f32;
    else if constexpr (std::is_same_v<T, double>) return f64;
    else if constexpr (std::is_same_v<T, bfloat16>) return bf16;
    else return f16;
  }
  // fn(layer) on the layer of `dtype`.
  template <class Fn>
  void visit(Fn&& fn) const {
    switch (dtype) {
      case DType::f64: fn(f64); break;
      case DType::bf16: fn(bf16); break;
      case DType::f16: fn(f16); break;
      default: fn(f32);
    }
  }
  // A layer of T's dtype: the configuration resolved and checked, the weights packed.
  template <class T>
  static std::unique_ptr<Impl> make(const MhaConfig& config, MhaWeights<T>&& weights);
};

namespace {

MhaConfig resolve(MhaConfig c) {
  detail::check_isa();
  if (c.d_model < 1) throw Error("config.d_model", "expected >= 1, got " + std::to_string(c.d_model));
  if (c.heads < 1) throw Error("config.heads", "expected >= 1, got " + std::to_string(c.heads));
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.kv_heads < 1 || c.heads % c.kv_heads != 0)
    throw Error("config.kv_heads", "expected a divisor of heads " + std::to_string(c.heads) + ", got " +
                                       std::to_string(c.kv_heads));
  if (c.head_dim == 0) {
    if (c.d_model % c.heads != 0)
      throw Error("config.heads", "d_model " + std::to_string(c.d_model) + " is not a multiple of heads " +
                                      std::to_string(c.heads) + " (set head_dim for such a layer)");
    c.head_dim = c.d_model / c.heads;
  }
  if (c.head_dim < 1) throw Error("config.head_dim", "expected >= 1, got " + std::to_string(c.head_dim));
  if (c.kdim == 0) c.kdim = c.d_model;
  if (c.vdim == 0) c.vdim = c.d_model;
  if (c.kdim < 1) throw Error("config.kdim", "expected >= 1, got " + std::to_string(c.kdim));
  if (c.vdim < 1) throw Error("config.vdim", "expected >= 1, got " + std::to_string(c.vdim));
  if (c.rope) (void)detail::rope_table(*c.rope, c.head_dim, false);  // validates it
  if (c.q_norm.empty() != c.k_norm.empty())
    throw Error(c.q_norm.empty() ? "config.q_norm" : "config.k_norm", "QK-norm needs both q_norm and k_norm");
  for (const auto* w : {&c.q_norm, &c.k_norm})
    if (!w->empty() && static_cast<std::int64_t>(w->size()) != c.head_dim)
      throw Error(w == &c.q_norm ? "config.q_norm" : "config.k_norm",
                  "expected head_dim = " + std::to_string(c.head_dim) + " weights, got " + std::to_string(w->size()));
  if (!(std::isfinite(c.qk_norm_eps) && c.qk_norm_eps >= 0.0))
    throw Error("config.qk_norm_eps", "must be finite and >= 0, got " + std::to_string(c.qk_norm_eps));
  // the attention core's options are checked by attention() on the first call, named there;
  // the per-head lists here
  if (!c.alibi_slopes.empty() && static_cast<std::int64_t>(c.alibi_slopes.size()) != c.heads)
    throw Error("config.alibi_slopes", "expected heads = " + std::to_string(c.heads) + " slopes, got " +
                                           std::to_string(c.alibi_slopes.size()));
  if (!c.sinks.empty() && static_cast<std::int64_t>(c.sinks.size()) != c.heads)
    throw Error("config.sinks", "expected heads = " + std::to_string(c.heads) + " sinks, got " + std::to_string(c.sinks.size()));
  if (!c.t5_table.empty() && static_cast<std::int64_t>(c.t5_table.size()) % c.heads != 0)
    throw Error("config.t5_table", "expected num_buckets x heads = " + std::to_string(c.heads) + " per bucket, got " +
                                       std::to_string(c.t5_table.size()) + " values");
  return c;
}

// MhaOptions::attn_weights on the attention core's scores output (softmax stage): directly when
// per head; through a per-head buffer when averaged (average_weights then writes the mean).
struct WeightsOut {
  bool average = false;
  TensorView per_head;  // what the core writes
};
WeightsOut weights_output(const MhaOptions& o, std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                          AttentionOptions& a) {
  WeightsOut w;
  if (!detail::view_given(o.attn_weights)) return w;
  const TensorView& v = o.attn_weights;
  if (v.dtype != DType::f32 && v.dtype != DType::f64)
    throw Error("options.attn_weights", "dtype must be f32 or f64, got " + std::string(dtype_name(v.dtype)));
  if (v.shape[0] != B || (v.shape[1] != H && v.shape[1] != 1) || v.shape[2] != Sq || v.shape[3] != Sk)
    throw Error("options.attn_weights", "expected [B, H, Sq, Sk] = " + shape_str({B, H, Sq, Sk}) + " or [B, 1, Sq, Sk], got " +
                                            shape_str(v.shape));
  w.average = v.shape[1] != H;
  if (w.average) {
    const std::size_t n = static_cast<std::size_t>(B * H * Sq * Sk) * dtype_size(v.dtype);
    w.per_head = TensorView(thread_buffer<std::byte, scratch::MhaWeights>().get(n), v.dtype, {B, H, Sq, Sk});
  } else {
    w.per_head = v;
  }
  a.scores = w.per_head;
  a.scores_stage = ScoreStage::softmax;
  return w;
}

void average_weights(const WeightsOut& w, const TensorView& out) {
  if (!w.average) return;
  const Shape4& s = w.per_head.shape;
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t i = 0; i < s[2]; ++i)
      for (std::int64_t j = 0; j < s[3]; ++j) {
        double sum = 0;
        for (std::int64_t h = 0; h < s[1]; ++h)
          sum += detail::widen_at(w.per_head.data, w.per_head.dtype, ((b * s[1] + h) * s[2] + i) * s[3] + j);
        detail::store_at(out.data, out.dtype, b * out.strides[0] + i * out.strides[2] + j * out.strides[3],
                         sum / static_cast<double>(s[1]));
      }
}

// The layer's score options on the attention core.
void add_config_options(const MhaConfig& c, AttentionOptions& a) {
  a.scale = c.scale;
  a.softcap = c.softcap;
  if (c.window) a.window = c.window;
  a.alibi_slopes = c.alibi_slopes;
  a.sinks = c.sinks;
  if (!c.t5_table.empty()) {
    const auto buckets = static_cast<std::int64_t>(c.t5_table.size()) / c.heads;
    a.relative_bias = RelativePositionBias{ConstTensorView(c.t5_table.data(), {1, 1, buckets, c.heads}),
                                           c.t5_bidirectional, c.t5_max_distance};
  }
}

// Positions given for B sequences of S tokens: B*S of them, none negative.
void check_positions(std::span<const std::int64_t> positions, std::int64_t B, std::int64_t S) {
  if (!positions.empty() && static_cast<std::int64_t>(positions.size()) != B * S)
    throw Error("options.positions", "expected B*S = " + std::to_string(B * S) + " entries, got " +
                                         std::to_string(positions.size()));
  for (std::size_t i = 0; i < positions.size(); ++i)
    if (positions[i] < 0) throw Error("options.positions", "entry " + std::to_string(i) + " is negative");
}

// QK-norm and RoPE on the projected q (heads columns from column 0) and k (kv_heads columns from
// k0) of rows [b * S + s] (row stride N) of p: the position of (b, s) is positions[b * S + s] if
// given, else start[b] + s (start null: 0).
template <class T>
void position_qk(const Layer<T>& L, T* p, std::int64_t N, std::int64_t k0, std::int64_t B, std::int64_t S,
                 std::span<const std::int64_t> positions, const std::int64_t* start, int threads) {
  const MhaConfig& c = L.cfg;
  const detail::RopeTable& table = L.rope;
  const bool norm = !c.q_norm.empty();
  if (!norm && !c.rope) return;
  check_positions(positions, B, S);
  constexpr bool kF64 = std::is_same_v<T, double>;
  const std::int64_t hd = c.head_dim;
  auto rms = [&](T* x, const std::vector<float>& w) {  // in f32 (f64 layers: f64), rounded once
    using A = std::conditional_t<kF64, double, float>;
    A ss = 0;
    for (std::int64_t d = 0; d < hd; ++d) ss += static_cast<A>(detail::widen(x[d])) * static_cast<A>(detail::widen(x[d]));
    const A inv = A(1) / std::sqrt(ss / static_cast<A>(hd) + static_cast<A>(c.qk_norm_eps));
    for (std::int64_t d = 0; d < hd; ++d) {
      // normalised in A and rounded to the layer's dtype, then times the weight (Hugging Face's
      // RMSNorm: weight * hidden.to(dtype))
      const auto normed = static_cast<A>(detail::widen(detail::narrow<T>(static_cast<double>(static_cast<A>(detail::widen(x[d])) * inv))));
      x[d] = detail::narrow<T>(static_cast<double>(static_cast<A>(w[static_cast<std::size_t>(d)]) * normed));
    }
  };
  // rows split over the threads (each row's heads share its cosines and sines)
  detail::parallel_for(B * S, threads, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(1, hd * (c.heads + c.kv_heads))),
               [&](std::int64_t m0, std::int64_t m1) {
    thread_local std::vector<double> cs;
    cs.resize(table.inv_freq.size() * 2);
    for (std::int64_t m = m0; m < m1; ++m) {
      const std::int64_t b = m / S, s = m % S;
      T* row = p + m * N;
      const std::int64_t pos = positions.empty() ? (start ? start[b] : 0) + s : positions[static_cast<std::size_t>(m)];
      if (c.rope) detail::rope_angles(table, pos, cs.data());
      for (std::int64_t h = 0; h < c.heads; ++h) {
        if (norm) rms(row + h * hd, c.q_norm);
        if (c.rope) detail::rope_rotate(table, cs.data(), row + h * hd, 1);
      }
      for (std::int64_t h = 0; h < c.kv_heads; ++h) {
        if (norm) rms(row + k0 + h * hd, c.k_norm);
        if (c.rope) detail::rope_rotate(table, cs.data(), row + k0 + h * hd, 1);
      }
    }
  });
}

template <class T>
Layer<T> build_layer(const MhaConfig& cfg, MhaWeights<T>&& w) {
  Layer<T> L;
  L.cfg = cfg;
  if (cfg.rope) L.rope = detail::rope_table(*cfg.rope, cfg.head_dim, std::is_same_v<T, double>);
  L.nq = cfg.heads * cfg.head_dim;
  L.nkv = cfg.kv_heads * cfg.head_dim;
  auto check = [](const std::vector<T>& v, std::int64_t rows, std::int64_t cols, const char* name,
                  const char* what) {
    if (static_cast<std::int64_t>(v.size()) != rows * cols)
      throw Error(name, std::string("expected ") + what + " " + shape_str({rows, cols}) + " = " +
                            std::to_string(rows * cols) + " elements, got " + std::to_string(v.size()));
  };
  auto check_bias = [](const std::vector<T>& v, std::int64_t n, const char* name) {
    if (!v.empty() && static_cast<std::int64_t>(v.size()) != n)
      throw Error(name, "expected " + std::to_string(n) + " elements (or none), got " + std::to_string(v.size()));
  };
  check(w.wq, L.nq, cfg.d_model, "weights.wq", "[heads*head_dim, d_model]");
  check(w.wk, L.nkv, cfg.kdim, "weights.wk", "[kv_heads*head_dim, kdim]");
  check(w.wv, L.nkv, cfg.vdim, "weights.wv", "[kv_heads*head_dim, vdim]");
  check(w.wo, cfg.d_model, L.nq, "weights.wo", "[d_model, heads*head_dim]");
  check_bias(w.bq, L.nq, "weights.bq");
  check_bias(w.bk, L.nkv, "weights.bk");
  check_bias(w.bv, L.nkv, "weights.bv");
  check_bias(w.bo, cfg.d_model, "weights.bo");
  L.packed = cfg.kdim == cfg.d_model && cfg.vdim == cfg.d_model;
  const std::int64_t nr = weights_nr<T>();
  auto pad = [nr](std::int64_t n) { return (n + nr - 1) / nr * nr; };
  L.k0 = pad(L.nq);
  L.v0 = L.k0 + pad(L.nkv);
  L.n_in = L.v0 + pad(L.nkv);
  if (L.packed) {
    std::vector<T> t(static_cast<std::size_t>(cfg.d_model * L.n_in), T{});
    transpose_into(w.wq, L.nq, cfg.d_model, t.data(), L.n_in);
    transpose_into(w.wk, L.nkv, cfg.kdim, t.data() + L.k0, L.n_in);
    transpose_into(w.wv, L.nkv, cfg.vdim, t.data() + L.v0, L.n_in);
    L.w_in = pack_weights(t.data(), L.n_in, cfg.d_model, L.n_in);
  } else {
    auto pack_t = [](const std::vector<T>& wm, std::int64_t rows, std::int64_t cols) {
      std::vector<T> t(static_cast<std::size_t>(rows * cols));
      transpose_into(wm, rows, cols, t.data(), rows);
      return pack_weights(t.data(), rows, cols, rows);
    };
    L.w_in = pack_t(w.wq, L.nq, cfg.d_model);
    L.w_k = pack_t(w.wk, L.nkv, cfg.kdim);
    L.w_v = pack_t(w.wv, L.nkv, cfg.vdim);
  }
  if (!w.bq.empty() || !w.bk.empty() || !w.bv.empty()) {
    L.b_in.assign(static_cast<std::size_t>(L.n_in), T{});
    std::copy(w.bq.begin(), w.bq.end(), L.b_in.begin());
    std::copy(w.bk.begin(), w.bk.end(), L.b_in.begin() + L.k0);
    std::copy(w.bv.begin(), w.bv.end(), L.b_in.begin() + L.v0);
  }
  {
    std::vector<T> t(w.wo.size());
    transpose_into(w.wo, cfg.d_model, L.nq, t.data(), cfg.d_model);
    L.wo = pack_weights(t.data(), cfg.d_model, L.nq, cfg.d_model);
  }
  L.bo = std::move(w.bo);
  return L;
}

}  // namespace

template <class T>
std::unique_ptr<MultiHeadAttention::Impl> MultiHeadAttention::Impl::make(const MhaConfig& config,
                                                                        MhaWeights<T>&& weights) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = resolve(config);
  impl->dtype = dtype_of<T>();
  impl->layer<T>() = build_layer(impl->cfg, std::move(weights));
  return impl;
}

namespace {

void check_seq(const char* name, const ConstSeqView& s, DType dtype, std::int64_t B, std::int64_t E) {
  if (s.dtype != dtype)
    throw Error(name, "dtype " + std::string(dtype_name(s.dtype)) + " differs from the layer's " +
                          std::string(dtype_name(dtype)));
  if (s.B < 0 || s.S < 0 || (B >= 0 && s.B != B) || s.E != E)
    throw Error(name, "expected shape " + std::string(B >= 0 ? "[B=" + std::to_string(B) : "[B") +
                          ", S, E=" + std::to_string(E) + "], got " + shape_str({s.B, s.S, s.E}));
  if (s.data == nullptr && s.B * s.S * s.E != 0) throw Error(name, "null data");
}

// The rows of `s` through the layer's widest buffer (`width` values a row, the projections' or
// the input's): B * S * width elements of T must be countable and addressable.
template <class T>
void check_rows(const char* name, const ConstSeqView& s, std::int64_t width) {
  std::int64_t n = 0;
  if (__builtin_mul_overflow(s.B, s.S, &n) || __builtin_mul_overflow(n, width, &n) ||
      n > std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(sizeof(T)))
    throw Error(name, "size overflow: " + shape_str({s.B, s.S, s.E}) + " through this layer's " + std::to_string(width) +
                          "-wide projections");
}

void check_out(const SeqView& o, DType dtype, std::int64_t B, std::int64_t S, std::int64_t E) {
  if (o.dtype != dtype)
    throw Error("out", "dtype " + std::string(dtype_name(o.dtype)) + " differs from the layer's " +
                           std::string(dtype_name(dtype)));
  if (o.B != B || o.S != S || o.E != E)
    throw Error("out", "expected shape " + shape_str({B, S, E}) + ", got " + shape_str({o.B, o.S, o.E}));
  if (o.data == nullptr && B * S * E != 0) throw Error("out", "null data");
}

// The attention options of one call: causal, threads, backend, and the key padding mask and
// additive mask combined into one mask from this thread's buffers.
template <class T>
AttentionOptions attention_options(const MhaOptions& o, std::int64_t B, std::int64_t H, std::int64_t Sq,
                                   std::int64_t Sk) {
  AttentionOptions a;
  a.causal = o.causal;
  a.threads = o.threads;
  a.backend = o.backend;
  const bool padding = !o.key_padding_mask.empty();
  const bool additive = detail::view_given(o.attn_mask);
  const DType md = o.attn_mask.dtype;
  if (additive && md != DType::f32 && md != DType::f64 && md != DType::bf16 && md != DType::f16)
    throw Error("options.attn_mask", "expected an additive f32, f64, bf16 or f16 mask, got " +
                                         std::string(dtype_name(md)));
  if (padding && static_cast<std::int64_t>(o.key_padding_mask.size()) != B * Sk)
    throw Error("options.key_padding_mask", "expected B*Sk = " + std::to_string(B) + "*" + std::to_string(Sk) +
                                                " entries ([B, Sk]), got " + std::to_string(o.key_padding_mask.size()));
  if (padding && !additive) {
    std::uint8_t* m = thread_buffer<std::uint8_t, scratch::MhaPaddingMask>().get(static_cast<std::size_t>(B * Sk));
    for (std::int64_t i = 0; i < B * Sk; ++i) m[i] = o.key_padding_mask[static_cast<std::size_t>(i)] ? 0 : 1;
    a.mask = ConstTensorView(m, DType::u8, {B, 1, 1, Sk});
  } else if (additive && !padding) {
    a.mask = o.attn_mask;
  } else if (additive && padding) {
    const ConstTensorView& am = o.attn_mask;
    for (int d = 0; d < 4; ++d)
      if (am.shape[d] < 1 || am.strides[d] < 0)
        throw Error("options.attn_mask", "needs sizes >= 1 and strides >= 0 (shape " +
                                             shape_str({am.shape[0], am.shape[1], am.shape[2], am.shape[3]}) + ")");
    if (am.data == nullptr) throw Error("options.attn_mask", "null data");
    const Shape4 target{B, H, Sq, Sk};
    for (int d = 0; d < 4; ++d)
      if (am.shape[d] != target[d] && am.shape[d] != 1)
        throw Error("options.attn_mask", "shape " + shape_str({am.shape[0], am.shape[1], am.shape[2], am.shape[3]}) +
                                             " does not broadcast to " + shape_str({B, H, Sq, Sk}));
    const std::int64_t mh = am.shape[1], mi = am.shape[2];
    using M = std::conditional_t<kIs16Bit<T>, float, T>;  // a 16-bit layer's combined mask in f32
    M* m = thread_buffer<M, scratch::MhaMask>().get(static_cast<std::size_t>(B * mh * mi * Sk));
    const M neg_inf = -std::numeric_limits<M>::infinity();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < mh; ++h)
        for (std::int64_t i = 0; i < mi; ++i)
          for (std::int64_t j = 0; j < Sk; ++j) {
            const std::int64_t off = (am.shape[0] == 1 ? 0 : b) * am.strides[0] + h * am.strides[1] +
                                     i * am.strides[2] + (am.shape[3] == 1 ? 0 : j) * am.strides[3];
            const M x = static_cast<M>(detail::widen_at(am.data, am.dtype, off));
            m[((b * mh + h) * mi + i) * Sk + j] = o.key_padding_mask[static_cast<std::size_t>(b * Sk + j)] ? neg_inf : x;
          }
    a.mask = ConstTensorView(m, {B, mh, mi, Sk});
  }
  return a;
}

template <class T>
void self_forward(const Layer<T>& L, const ConstSeqView& query, const SeqView& out, const MhaOptions& opt) {
  const MhaConfig& c = L.cfg;
  if (!L.packed)
    throw Error("key", "self-attention needs kdim == vdim == d_model (this layer has kdim " + std::to_string(c.kdim) +
                           ", vdim " + std::to_string(c.vdim) + "); pass key and value");
  check_seq("query", query, dtype_of<T>(), -1, c.d_model);
  check_rows<T>("query", query, std::max({c.d_model, L.n_in, L.nq}));
  const std::int64_t B = query.B, S = query.S, H = c.heads, Hkv = c.kv_heads, hd = c.head_dim;
  check_out(out, dtype_of<T>(), B, S, c.d_model);
  AttentionOptions a = attention_options<T>(opt, B, H, S, S);
  add_config_options(c, a);
  if (c.causal && a.causal == Causal::none) a.causal = Causal::top_left;
  const WeightsOut wout = weights_output(opt, B, H, S, S, a);
  const std::int64_t M = B * S, N = L.n_in;
  T* p = thread_buffer<T, scratch::MhaProjection>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, M * N)));
  T* o = thread_buffer<T, scratch::MhaAttentionOut>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, M * L.nq)));
  linear(static_cast<const T*>(query.data), M, c.d_model, c.d_model, L.w_in, 0, N, L.bq(), p, N, opt.threads,
         L.onednn_w(opt, L.w_in));
  position_qk(L, p, N, L.k0, B, S, opt.positions, nullptr, opt.threads);
  const ConstTensorView q(p, {B, H, S, hd}, {S * N, hd, N, 1});
  const ConstTensorView k(p + L.k0, {B, Hkv, S, hd}, {S * N, hd, N, 1});
  const ConstTensorView v(p + L.v0, {B, Hkv, S, hd}, {S * N, hd, N, 1});
  attention(q, k, v, TensorView(o, {B, H, S, hd}, {S * L.nq, hd, L.nq, 1}), a);
  average_weights(wout, opt.attn_weights);
  linear(o, M, L.nq, L.nq, L.wo, 0, c.d_model, L.bo_or_null(), static_cast<T*>(out.data), c.d_model, opt.threads,
         L.onednn_w(opt, L.wo));
}

template <class T>
void cross_forward(const Layer<T>& L, const ConstSeqView& query, const ConstSeqView& key, const ConstSeqView& value,
                   const SeqView& out, const MhaOptions& opt) {
  const MhaConfig& c = L.cfg;
  check_seq("query", query, dtype_of<T>(), -1, c.d_model);
  check_rows<T>("query", query, std::max(c.d_model, L.nq));
  const std::int64_t B = query.B, Sq = query.S, H = c.heads, Hkv = c.kv_heads, hd = c.head_dim;
  check_seq("key", key, dtype_of<T>(), B, c.kdim);
  check_seq("value", value, dtype_of<T>(), B, c.vdim);
  check_rows<T>("key", key, std::max(c.kdim, 2 * L.nkv));
  check_rows<T>("value", value, std::max(c.vdim, 2 * L.nkv));
  if (value.S != key.S)
    throw Error("value", "has " + std::to_string(value.S) + " positions, key has " + std::to_string(key.S));
  const std::int64_t Sk = key.S;
  check_out(out, dtype_of<T>(), B, Sq, c.d_model);
  AttentionOptions a = attention_options<T>(opt, B, H, Sq, Sk);
  add_config_options(c, a);
  if (!opt.positions.empty()) throw Error("options.positions", "cross-attention applies no rotary embedding");
  const WeightsOut wout = weights_output(opt, B, H, Sq, Sk, a);
  T* pq = thread_buffer<T, scratch::MhaProjection>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, B * Sq * L.nq)));
  T* pkv = thread_buffer<T, scratch::MhaProjectionKv>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, 2 * B * Sk * L.nkv)));
  T* o = thread_buffer<T, scratch::MhaAttentionOut>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, B * Sq * L.nq)));
  // k and v side by side in one [B*Sk, 2*nkv] buffer.
  const std::int64_t ldkv = 2 * L.nkv;
  linear(static_cast<const T*>(query.data), B * Sq, c.d_model, c.d_model, L.w_in, 0, L.nq, L.bq(), pq, L.nq,
         opt.threads, L.onednn_w(opt, L.w_in));
  linear(static_cast<const T*>(key.data), B * Sk, c.kdim, c.kdim, L.wk(), L.k_col(), L.nkv, L.bk(), pkv, ldkv,
         opt.threads, L.onednn_w(opt, L.wk()));
  linear(static_cast<const T*>(value.data), B * Sk, c.vdim, c.vdim, L.wv(), L.v_col(), L.nkv, L.bv(), pkv + L.nkv,
         ldkv, opt.threads, L.onednn_w(opt, L.wv()));
  const ConstTensorView q(pq, {B, H, Sq, hd}, {Sq * L.nq, hd, L.nq, 1});
  const ConstTensorView k(pkv, {B, Hkv, Sk, hd}, {Sk * ldkv, hd, ldkv, 1});
  const ConstTensorView v(pkv + L.nkv, {B, Hkv, Sk, hd}, {Sk * ldkv, hd, ldkv, 1});
  attention(q, k, v, TensorView(o, {B, H, Sq, hd}, {Sq * L.nq, hd, L.nq, 1}), a);
  average_weights(wout, opt.attn_weights);
  linear(o, B * Sq, L.nq, L.nq, L.wo, 0, c.d_model, L.bo_or_null(), static_cast<T*>(out.data), c.d_model,
         opt.threads, L.onednn_w(opt, L.wo));
}

// The cache's storage and dtype, as cached_forward needs them.
struct CacheRef {
  DType dtype;
  std::vector<std::byte>& k;
  std::vector<std::byte>& v;
  std::vector<std::int64_t>& lengths;
  std::vector<std::int64_t>& next;
  std::int64_t capacity;
};

}  // namespace

// The layer's access to a cache's storage.
struct detail::CacheAccess {
  static CacheRef ref(KvCache& c) { return {c.dtype_, c.k_, c.v_, c.lengths_, c.next_lengths_, c.capacity_}; }
  static std::int64_t kv_heads(const KvCache& c) { return c.kv_heads_; }
  static std::int64_t head_dim(const KvCache& c) { return c.head_dim_; }
};

namespace {

// The cache of a step, checked against the layer.
CacheRef cache_ref(const MhaConfig& c, KvCache& cache) {
  const std::int64_t kv_heads = detail::CacheAccess::kv_heads(cache), head_dim = detail::CacheAccess::head_dim(cache);
  if (kv_heads != c.kv_heads || head_dim != c.head_dim)
    throw Error("cache", "was made for another layer (kv_heads " + std::to_string(kv_heads) + ", head_dim " +
                             std::to_string(head_dim) + "; this layer has " + std::to_string(c.kv_heads) + " and " +
                             std::to_string(c.head_dim) + ")");
  return detail::CacheAccess::ref(cache);
}

// A cached step's checks (forward with a cache, and each step of forward_batch): query, out,
// positions and options against the layer and the cache. Sets cache.next to each sequence's
// length after the step; changes nothing else.
template <class T>
void check_cached_step(const Layer<T>& L, const ConstSeqView& query, const CacheRef& cache, const SeqView& out,
                       const MhaOptions& opt, std::span<const std::int64_t> positions) {
  const MhaConfig& c = L.cfg;
  if (!L.packed)
    throw Error("cache", "incremental decoding is self-attention: it needs kdim == vdim == d_model");
  check_seq("query", query, dtype_of<T>(), static_cast<std::int64_t>(cache.lengths.size()), c.d_model);
  check_rows<T>("query", query, std::max({c.d_model, L.n_in, L.nq}));
  const std::int64_t B = query.B, Tn = query.S;
  check_out(out, dtype_of<T>(), B, Tn, c.d_model);
  if (opt.causal == Causal::top_left)
    throw Error("options.causal", "incremental decoding attends with bottom-right alignment; top-left is not "
                                  "meaningful over a cache (use none or bottom_right)");
  if (!opt.key_padding_mask.empty() || opt.attn_mask.data != nullptr)
    throw Error("options", "masks are not supported with a KV cache (truncate the cache instead)");
  if (c.rope || !c.q_norm.empty()) check_positions(positions, B, Tn);
  for (std::int64_t b = 0; b < B; ++b) {
    if (Tn > cache.capacity - cache.lengths[b])
      throw Error("cache", "sequence " + std::to_string(b) + " holds " + std::to_string(cache.lengths[b]) +
                               " tokens; " + std::to_string(Tn) + " more exceed the capacity " +
                               std::to_string(cache.capacity));
    cache.next[b] = cache.lengths[b] + Tn;
  }
}

// Appends the rotated K and V of a step's projected rows p ([B * Tn] rows, N apart) to the cache:
// rows lengths[b] .. next[b] - 1 of every (b, kv head), converted to the cache's dtype. Rows past
// lengths[] are not part of the cache, so a failure after this leaves the cache as it was.
template <class T>
void append_kv(const Layer<T>& L, const T* p, std::int64_t N, std::int64_t B, std::int64_t Tn, const CacheRef& cache) {
  const std::int64_t Hkv = L.cfg.kv_heads, hd = L.cfg.head_dim, capacity = cache.capacity;
  const DType cd = cache.dtype;
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(cd));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hk = 0; hk < Hkv; ++hk)
      for (std::int64_t t = 0; t < Tn; ++t) {
        const T* src = p + (b * Tn + t) * N + hk * hd;
        const std::int64_t row = ((b * Hkv + hk) * capacity + cache.lengths[b] + t) * hd * esize;
        detail::convert_elements(src + L.k0, dtype_of<T>(), cache.k.data() + row, cd, hd);
        detail::convert_elements(src + L.v0, dtype_of<T>(), cache.v.data() + row, cd, hd);
      }
}

// The attention core of a cached step: q from the projected rows p ([B * Tn] rows, N apart) over
// each sequence's next[b] cached keys, bottom-right aligned, into o ([B * Tn] rows of nq).
template <class T>
void cached_attention(const Layer<T>& L, const T* p, std::int64_t N, std::int64_t B, std::int64_t Tn,
                      const CacheRef& cache, T* o, AttentionOptions a) {
  const std::int64_t H = L.cfg.heads, Hkv = L.cfg.kv_heads, hd = L.cfg.head_dim, capacity = cache.capacity;
  const DType cd = cache.dtype;
  a.causal = Causal::bottom_right;
  a.key_lengths = cache.next;
  // K/V views span the whole capacity (key lengths say how much is filled), so the attention
  // kernels size their scratch by the capacity once and decode steps allocate nothing.
  const Shape4 kvs{Hkv * capacity * hd, capacity * hd, hd, 1};
  const ConstTensorView kc(cache.k.data(), cd, {B, Hkv, capacity, hd}, kvs);
  const ConstTensorView vc(cache.v.data(), cd, {B, Hkv, capacity, hd}, kvs);
  if (cd == dtype_of<T>()) {
    attention(ConstTensorView(p, {B, H, Tn, hd}, {Tn * N, hd, N, 1}), kc, vc,
              TensorView(o, {B, H, Tn, hd}, {Tn * L.nq, hd, L.nq, 1}), a);
    return;
  }
  // A cache of another dtype: the core runs in the cache's, q converted to it (rounded to
  // nearest even if narrower, as llama.cpp rounds q for its f16 cache) and the output back.
  const std::int64_t M = B * Tn, n = M * L.nq, esize = static_cast<std::int64_t>(dtype_size(cd));
  std::byte* qc = thread_buffer<std::byte, scratch::MhaCacheQ>().get(static_cast<std::size_t>(n * esize));
  std::byte* oc = thread_buffer<std::byte, scratch::MhaCacheOut>().get(static_cast<std::size_t>(n * esize));
  for (std::int64_t m = 0; m < M; ++m) detail::convert_elements(p + m * N, dtype_of<T>(), qc + m * L.nq * esize, cd, L.nq);
  const Shape4 dense{Tn * L.nq, hd, L.nq, 1};
  attention(ConstTensorView(qc, cd, {B, H, Tn, hd}, dense), kc, vc, TensorView(oc, cd, {B, H, Tn, hd}, dense), a);
  detail::convert_elements(oc, cd, o, dtype_of<T>(), n);
}

template <class T>
void cached_forward(const Layer<T>& L, const ConstSeqView& query, const CacheRef& cache, const SeqView& out,
                    const MhaOptions& opt) {
  const MhaConfig& c = L.cfg;
  check_cached_step(L, query, cache, out, opt, opt.positions);
  const std::int64_t B = query.B, Tn = query.S;
  if (Tn == 0) return;
  const std::int64_t M = B * Tn, N = L.n_in;
  T* p = thread_buffer<T, scratch::MhaProjection>().get(static_cast<std::size_t>(M * N));
  T* o = thread_buffer<T, scratch::MhaAttentionOut>().get(static_cast<std::size_t>(M * L.nq));
  linear(static_cast<const T*>(query.data), M, c.d_model, c.d_model, L.w_in, 0, N, L.bq(), p, N, opt.threads,
         L.onednn_w(opt, L.w_in));
  position_qk(L, p, N, L.k0, B, Tn, opt.positions, cache.lengths.data(), opt.threads);  // (K appended rotated)
  append_kv(L, p, N, B, Tn, cache);
  AttentionOptions a;
  add_config_options(c, a);
  const WeightsOut wout = weights_output(opt, B, c.heads, Tn, cache.capacity, a);
  a.threads = opt.threads;
  a.backend = opt.backend;
  cached_attention(L, p, N, B, Tn, cache, o, a);
  average_weights(wout, opt.attn_weights);
  linear(o, M, L.nq, L.nq, L.wo, 0, c.d_model, L.bo_or_null(), static_cast<T*>(out.data), c.d_model, opt.threads,
         L.onednn_w(opt, L.wo));
  std::copy(cache.next.begin(), cache.next.end(), cache.lengths.begin());  // spans from lengths() stay valid
}

// Error e of step i, its argument prefixed with "steps[i]."
Error step_error(std::size_t i, const Error& e) {
  const std::string what = e.what(), arg = e.argument();
  const std::string message = what.rfind(arg + ": ", 0) == 0 ? what.substr(arg.size() + 2) : what;
  return Error("steps[" + std::to_string(i) + "]." + arg, message);
}

// Many requests' cached steps in one call: every step checked first (nothing changes if one is
// bad), then their query rows gathered into one matrix for the input projection (the weights
// read once), positions and K/V appended per step, the attention cores of the steps side by side
// (one thread each), the output projection over all rows again, and the rows scattered back.
template <class T>
void batched_forward(const Layer<T>& L, std::span<const DecodeStep> steps, const std::vector<CacheRef>& refs,
                     const MhaOptions& opt) {
  const MhaConfig& c = L.cfg;
  if (!opt.positions.empty())
    throw Error("options.positions", "forward_batch takes positions per step (DecodeStep::positions)");
  if (opt.attn_weights.data != nullptr)
    throw Error("options.attn_weights", "forward_batch does not output attention weights");
  std::vector<std::int64_t> row0(steps.size() + 1, 0);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    try {
      check_cached_step(L, steps[i].query, refs[i], steps[i].out, opt, steps[i].positions);
    } catch (const Error& e) {
      throw step_error(i, e);
    }
    row0[i + 1] = row0[i] + steps[i].query.B * steps[i].query.S;
  }
  const std::int64_t M = row0.back(), N = L.n_in, d = c.d_model;
  if (M == 0) return;
  T* x = thread_buffer<T, scratch::MhaBatchRows>().get(static_cast<std::size_t>(M * d));
  T* p = thread_buffer<T, scratch::MhaProjection>().get(static_cast<std::size_t>(M * N));
  T* o = thread_buffer<T, scratch::MhaAttentionOut>().get(static_cast<std::size_t>(M * L.nq));
  for (std::size_t i = 0; i < steps.size(); ++i)
    std::copy_n(static_cast<const T*>(steps[i].query.data), (row0[i + 1] - row0[i]) * d, x + row0[i] * d);
  linear(x, M, d, d, L.w_in, 0, N, L.bq(), p, N, opt.threads, L.onednn_w(opt, L.w_in));
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const DecodeStep& s = steps[i];
    if (s.query.S == 0) continue;
    position_qk(L, p + row0[i] * N, N, L.k0, s.query.B, s.query.S, s.positions, refs[i].lengths.data(), opt.threads);
    append_kv(L, p + row0[i] * N, N, s.query.B, s.query.S, refs[i]);
  }
  AttentionOptions a;
  add_config_options(c, a);
  a.threads = 1;
  a.backend = opt.backend;
  const auto n = static_cast<std::int64_t>(steps.size());
  if (opt.backend == Backend::onednn) {  // oneDNN's own threads: one step at a time
    a.threads = opt.threads;
    for (std::int64_t i = 0; i < n; ++i)
      if (steps[i].query.S > 0)
        cached_attention(L, p + row0[i] * N, N, steps[i].query.B, steps[i].query.S, refs[i], o + row0[i] * L.nq, a);
  } else {
    detail::parallel_for_each_claimed(n, opt.threads, 1, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i)
        if (steps[i].query.S > 0)
          cached_attention(L, p + row0[i] * N, N, steps[i].query.B, steps[i].query.S, refs[i], o + row0[i] * L.nq, a);
    });
  }
  linear(o, M, L.nq, L.nq, L.wo, 0, d, L.bo_or_null(), x, d, opt.threads, L.onednn_w(opt, L.wo));
  for (std::size_t i = 0; i < steps.size(); ++i) {
    std::copy_n(x + row0[i] * d, (row0[i + 1] - row0[i]) * d, static_cast<T*>(steps[i].out.data));
    std::copy(refs[i].next.begin(), refs[i].next.end(), refs[i].lengths.begin());
  }
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<float> weights)
    : impl_(Impl::make(config, std::move(weights))) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<double> weights)
    : impl_(Impl::make(config, std::move(weights))) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<bfloat16> weights)
    : impl_(Impl::make(config, std::move(weights))) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<float16> weights)
    : impl_(Impl::make(config, std::move(weights))) {}

MultiHeadAttention::~MultiHeadAttention() = default;
MultiHeadAttention::MultiHeadAttention(MultiHeadAttention&&) noexcept = default;
MultiHeadAttention& MultiHeadAttention::operator=(MultiHeadAttention&&) noexcept = default;

const MhaConfig& MultiHeadAttention::config() const noexcept { return impl_->cfg; }
DType MultiHeadAttention::dtype() const noexcept { return impl_->dtype; }

void MultiHeadAttention::forward(const ConstSeqView& query, const SeqView& out, const MhaOptions& options) const {
  const detail::CallScope in_use;  // the thread budget counts this thread as busy
  const detail::OpenMpScope threads(options.backend == Backend::onednn);
  impl_->visit([&](const auto& layer) { self_forward(layer, query, out, options); });
}

void MultiHeadAttention::forward(const ConstSeqView& query, const ConstSeqView& key, const ConstSeqView& value,
                                 const SeqView& out, const MhaOptions& options) const {
  const detail::CallScope in_use;  // the thread budget counts this thread as busy
  const detail::OpenMpScope threads(options.backend == Backend::onednn);
  impl_->visit([&](const auto& layer) { cross_forward(layer, query, key, value, out, options); });
}

void MultiHeadAttention::forward(const ConstSeqView& query, KvCache& cache, const SeqView& out,
                                 const MhaOptions& options) const {
  const CacheRef ref = cache_ref(impl_->cfg, cache);
  const detail::CallScope in_use;  // the thread budget counts this thread as busy
  const detail::OpenMpScope threads(options.backend == Backend::onednn);
  impl_->visit([&](const auto& layer) { cached_forward(layer, query, ref, out, options); });
}

void MultiHeadAttention::forward_batch(std::span<const DecodeStep> steps, const MhaOptions& options) const {
  std::vector<CacheRef> refs;
  refs.reserve(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].cache == nullptr) throw Error("steps[" + std::to_string(i) + "].cache", "null");
    for (std::size_t j = 0; j < i; ++j)
      if (steps[j].cache == steps[i].cache)
        throw Error("steps[" + std::to_string(i) + "].cache",
                    "the cache of steps[" + std::to_string(j) + "] too: each step needs a cache of its own");
    try {
      refs.push_back(cache_ref(impl_->cfg, *steps[i].cache));
    } catch (const Error& e) {
      throw step_error(i, e);
    }
  }
  const detail::CallScope in_use;  // the thread budget counts this thread as busy
  const detail::OpenMpScope threads(options.backend == Backend::onednn);
  impl_->visit([&](const auto& layer) { batched_forward(layer, steps, refs, options); });
}

void MultiHeadAttention::check_step(const DecodeStep& step, const MhaOptions& options) const {
  if (step.cache == nullptr) throw Error("cache", "null");
  const CacheRef ref = cache_ref(impl_->cfg, *step.cache);
  impl_->visit([&](const auto& layer) { check_cached_step(layer, step.query, ref, step.out, options, step.positions); });
}

// ---- KvCache -----------------------------------------------------------------------------------

KvCache::KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity)
    : KvCache(layer, batch, capacity, layer.dtype()) {}

KvCache::KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity, DType dtype)
    : dtype_(dtype),
      batch_(batch),
      kv_heads_(layer.config().kv_heads),
      head_dim_(layer.config().head_dim),
      capacity_(capacity) {
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error("dtype", "expected f32, f64, bf16 or f16, got " + std::string(dtype_name(dtype)));
  if (batch < 1) throw Error("batch", "expected >= 1, got " + std::to_string(batch));
  if (capacity < 1) throw Error("capacity", "expected >= 1, got " + std::to_string(capacity));
  std::int64_t elems = 0, bytes64 = 0;
  if (__builtin_mul_overflow(batch, kv_heads_, &elems) || __builtin_mul_overflow(elems, capacity, &elems) ||
      __builtin_mul_overflow(elems, head_dim_, &elems) ||
      __builtin_mul_overflow(elems, static_cast<std::int64_t>(dtype_size(dtype_)), &bytes64))
    throw Error("capacity", "batch " + std::to_string(batch) + " x kv_heads " + std::to_string(kv_heads_) +
                                " x capacity " + std::to_string(capacity) + " x head_dim " + std::to_string(head_dim_) +
                                " overflows the size of a cache");
  const auto bytes = static_cast<std::size_t>(bytes64);
  lengths_.assign(static_cast<std::size_t>(batch), 0);
  next_lengths_.assign(static_cast<std::size_t>(batch), 0);
  k_.resize(bytes);
  v_.resize(bytes);
}

void KvCache::reset() noexcept { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KvCache::truncate(std::int64_t sequence, std::int64_t length) {
  if (sequence < 0 || sequence >= batch_)
    throw Error("sequence", "expected 0 <= sequence < " + std::to_string(batch_) + ", got " + std::to_string(sequence));
  const std::int64_t cur = lengths_[static_cast<std::size_t>(sequence)];
  if (length < 0 || length > cur)
    throw Error("length", "expected 0 <= length <= " + std::to_string(cur) + " (the sequence's length), got " +
                              std::to_string(length));
  lengths_[static_cast<std::size_t>(sequence)] = length;
}

ConstTensorView KvCache::keys() const noexcept {
  return ConstTensorView(k_.data(), dtype_, {batch_, kv_heads_, capacity_, head_dim_});
}
ConstTensorView KvCache::values() const noexcept {
  return ConstTensorView(v_.data(), dtype_, {batch_, kv_heads_, capacity_, head_dim_});
}

// ---- safetensors -------------------------------------------------------------------------------

namespace {

// One layer's tensors in a file, under a prefix.
template <class T>
struct LayerTensors {
  const SafetensorsFile& f;
  const std::string& prefix;
  // The shape of a tensor that must exist (2-D unless a bias).
  const std::vector<std::int64_t>& shape_of(const std::string& name) const {
    const auto it = f.tensors().find(prefix + name);
    if (it == f.tensors().end()) throw Error(f.path(), "no tensor named '" + prefix + name + "'");
    if (it->second.shape.size() != 2 && name.find("bias") == std::string::npos)
      throw Error(f.path(), "tensor '" + prefix + name + "' must be 2-D [out, in], has " +
                                std::to_string(it->second.shape.size()) + " dimensions");
    return it->second.shape;
  }
  bool has(const std::string& name) const { return f.tensors().count(prefix + name) != 0; }
  std::vector<T> read(const std::string& name, std::vector<std::int64_t> shape) const {
    return f.read<T>(prefix + name, shape);
  }
};

// Hugging Face names: q_proj/k_proj/v_proj/o_proj .weight, each with an optional .bias.
template <class T>
void load_hf(const LayerTensors<T>& t, std::int64_t kv_heads, MhaConfig& cfg, MhaWeights<T>& w) {
  const auto qs = t.shape_of("q_proj.weight");
  const auto ks = t.shape_of("k_proj.weight");
  const auto vs = t.shape_of("v_proj.weight");
  t.shape_of("o_proj.weight");  // present and 2-D, before anything is read
  const std::int64_t heads = cfg.heads;
  cfg.d_model = qs[1];
  if (qs[0] < heads || qs[0] % heads != 0)
    throw Error(t.f.path(), "q_proj.weight has " + std::to_string(qs[0]) + " rows, not a positive multiple of heads " +
                                std::to_string(heads));
  cfg.head_dim = qs[0] / heads;
  if (kv_heads == 0) {
    if (ks[0] % cfg.head_dim != 0)
      throw Error(t.f.path(), "k_proj.weight has " + std::to_string(ks[0]) + " rows, not a multiple of head_dim " +
                                  std::to_string(cfg.head_dim));
    kv_heads = ks[0] / cfg.head_dim;
  }
  cfg.kv_heads = kv_heads;
  cfg.kdim = ks[1];
  cfg.vdim = vs[1];
  const std::int64_t nq = heads * cfg.head_dim, nkv = kv_heads * cfg.head_dim;
  w.wq = t.read("q_proj.weight", {nq, cfg.d_model});
  w.wk = t.read("k_proj.weight", {nkv, cfg.kdim});
  w.wv = t.read("v_proj.weight", {nkv, cfg.vdim});
  w.wo = t.read("o_proj.weight", {cfg.d_model, nq});
  if (t.has("q_proj.bias")) w.bq = t.read("q_proj.bias", {nq});
  if (t.has("k_proj.bias")) w.bk = t.read("k_proj.bias", {nkv});
  if (t.has("v_proj.bias")) w.bv = t.read("v_proj.bias", {nkv});
  if (t.has("o_proj.bias")) w.bo = t.read("o_proj.bias", {cfg.d_model});
}

// torch.nn.MultiheadAttention's state_dict: in_proj_weight (or q/k/v_proj_weight), in_proj_bias,
// out_proj.weight, out_proj.bias.
template <class T>
void load_torch(const LayerTensors<T>& t, std::int64_t kv_heads, MhaConfig& cfg, MhaWeights<T>& w) {
  if (kv_heads != 0 && kv_heads != cfg.heads)
    throw Error("kv_heads", "torch.nn.MultiheadAttention weights have kv_heads == heads; got " +
                                std::to_string(kv_heads));
  cfg.kv_heads = cfg.heads;
  const std::int64_t d = t.shape_of("out_proj.weight")[0];
  cfg.d_model = d;
  if (t.has("in_proj_weight")) {
    const auto packed = t.read("in_proj_weight", {3 * d, d});
    w.wq.assign(packed.begin(), packed.begin() + d * d);
    w.wk.assign(packed.begin() + d * d, packed.begin() + 2 * d * d);
    w.wv.assign(packed.begin() + 2 * d * d, packed.end());
  } else {
    cfg.kdim = t.shape_of("k_proj_weight")[1];
    cfg.vdim = t.shape_of("v_proj_weight")[1];
    w.wq = t.read("q_proj_weight", {d, d});
    w.wk = t.read("k_proj_weight", {d, cfg.kdim});
    w.wv = t.read("v_proj_weight", {d, cfg.vdim});
  }
  w.wo = t.read("out_proj.weight", {d, d});
  if (t.has("in_proj_bias")) {
    const auto b = t.read("in_proj_bias", {3 * d});
    w.bq.assign(b.begin(), b.begin() + d);
    w.bk.assign(b.begin() + d, b.begin() + 2 * d);
    w.bv.assign(b.begin() + 2 * d, b.end());
  }
  if (t.has("out_proj.bias")) w.bo = t.read("out_proj.bias", {d});
}

template <class T>
MultiHeadAttention load_layer(const SafetensorsFile& f, std::int64_t heads, std::int64_t kv_heads,
                              const std::string& prefix, const MhaConfig& options) {
  if (heads < 1) throw Error("heads", "expected >= 1, got " + std::to_string(heads));
  const LayerTensors<T> t{f, prefix};
  MhaConfig cfg = options;  // the position and score options; the shapes come from the file
  cfg.d_model = cfg.kv_heads = cfg.head_dim = cfg.kdim = cfg.vdim = 0;
  cfg.heads = heads;
  MhaWeights<T> w;
  if (t.has("q_proj.weight")) load_hf(t, kv_heads, cfg, w);
  else if (t.has("in_proj_weight") || t.has("q_proj_weight")) load_torch(t, kv_heads, cfg, w);
  else
    throw Error(f.path(), "no attention weights under prefix '" + prefix +
                              "' (expected in_proj_weight, q_proj_weight or q_proj.weight)");
  return MultiHeadAttention(cfg, std::move(w));
}

}  // namespace

MultiHeadAttention MultiHeadAttention::from_safetensors(const std::string& path, std::int64_t heads,
                                                        std::int64_t kv_heads, const std::string& prefix,
                                                        DType dtype) {
  return from_safetensors(path, heads, kv_heads, prefix, dtype, MhaConfig{});
}

MultiHeadAttention MultiHeadAttention::from_safetensors(const std::string& path, std::int64_t heads,
                                                        std::int64_t kv_heads, const std::string& prefix, DType dtype,
                                                        const MhaConfig& options) {
  const SafetensorsFile f(path);
  if (dtype == DType::f32) return load_layer<float>(f, heads, kv_heads, prefix, options);
  if (dtype == DType::f64) return load_layer<double>(f, heads, kv_heads, prefix, options);
  if (dtype == DType::bf16) return load_layer<bfloat16>(f, heads, kv_heads, prefix, options);
  if (dtype == DType::f16) return load_layer<float16>(f, heads, kv_heads, prefix, options);
  throw Error("dtype", "expected f32, f64, bf16 or f16, got " + std::string(dtype_name(dtype)));
}

}  // namespace simdattn
