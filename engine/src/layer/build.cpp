// Building a multi-head attention layer: its configuration resolved and checked, its weights
// checked, transposed to W^T, padded to the GEMM's panel width and packed once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "layer/positions/rope_table.hpp"
#include "layer/pack.hpp"
#include "layer/storage.hpp"
#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

MhaConfig resolve_config(MhaConfig c) {
  check_isa();
  if (c.mla) throw Error("config.mla", "a Multi-head Latent Attention layer is built from MlaWeights");
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
  if (c.rope) (void)rope_table(*c.rope, c.head_dim, false);  // validates it
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

template <class T>
LayerStorage<T> build_layer(const MhaConfig& config, MhaWeights<T>&& w) {
  LayerStorage<T> L;
  const MhaConfig cfg = resolve_config(config);
  L.cfg = cfg;
  if (cfg.rope) L.rope = rope_table(*cfg.rope, cfg.head_dim, std::is_same_v<T, double>);
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
  if (cfg.output_gate) {
    check(w.wg, L.nq, cfg.d_model, "weights.wg", "[heads*head_dim, d_model]");
    check_bias(w.bg, L.nq, "weights.bg");
  } else if (!w.wg.empty() || !w.bg.empty()) {
    throw Error(w.wg.empty() ? "weights.bg" : "weights.wg", "an output gate's weights need config.output_gate");
  }
  L.fused_qkv = cfg.kdim == cfg.d_model && cfg.vdim == cfg.d_model;
  const std::int64_t nr = weights_nr<T>();
  auto pad = [nr](std::int64_t n) { return (n + nr - 1) / nr * nr; };
  L.g0 = pad(L.nq);
  L.k0 = L.g0 + (cfg.output_gate ? pad(L.nq) : 0);
  L.v0 = L.k0 + pad(L.nkv);
  L.n_in = L.v0 + pad(L.nkv);
  L.n_qg = cfg.output_gate ? L.g0 + L.nq : L.nq;
  if (L.fused_qkv) {
    std::vector<T> t(static_cast<std::size_t>(cfg.d_model * L.n_in), T{});
    transpose_into(w.wq, L.nq, cfg.d_model, t.data(), L.n_in);
    if (cfg.output_gate) transpose_into(w.wg, L.nq, cfg.d_model, t.data() + L.g0, L.n_in);
    transpose_into(w.wk, L.nkv, cfg.kdim, t.data() + L.k0, L.n_in);
    transpose_into(w.wv, L.nkv, cfg.vdim, t.data() + L.v0, L.n_in);
    L.w_in = pack_weights(t.data(), L.n_in, cfg.d_model, L.n_in);
  } else {
    auto pack_t = [](const std::vector<T>& wm, std::int64_t rows, std::int64_t cols) {
      std::vector<T> t(static_cast<std::size_t>(rows * cols));
      transpose_into(wm, rows, cols, t.data(), rows);
      return pack_weights(t.data(), rows, cols, rows);
    };
    std::vector<T> t(static_cast<std::size_t>(cfg.d_model * L.n_qg), T{});  // Wq^T | Wg^T
    transpose_into(w.wq, L.nq, cfg.d_model, t.data(), L.n_qg);
    if (cfg.output_gate) transpose_into(w.wg, L.nq, cfg.d_model, t.data() + L.g0, L.n_qg);
    L.w_in = pack_weights(t.data(), L.n_qg, cfg.d_model, L.n_qg);
    L.w_k = pack_t(w.wk, L.nkv, cfg.kdim);
    L.w_v = pack_t(w.wv, L.nkv, cfg.vdim);
  }
  if (!w.bq.empty() || !w.bk.empty() || !w.bv.empty() || !w.bg.empty()) {
    L.b_in.assign(static_cast<std::size_t>(L.n_in), T{});
    std::copy(w.bq.begin(), w.bq.end(), L.b_in.begin());
    std::copy(w.bg.begin(), w.bg.end(), L.b_in.begin() + L.g0);
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

template LayerStorage<float> build_layer(const MhaConfig&, MhaWeights<float>&&);
template LayerStorage<double> build_layer(const MhaConfig&, MhaWeights<double>&&);
template LayerStorage<bfloat16> build_layer(const MhaConfig&, MhaWeights<bfloat16>&&);
template LayerStorage<float16> build_layer(const MhaConfig&, MhaWeights<float16>&&);

}  // namespace simdattn::detail
