// Multi-head Latent Attention (mla.hpp): building the layer and its forward on a whole sequence.
#include "layer/mla/mla.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "layer/call_options.hpp"
#include "layer/pack.hpp"
#include "layer/positions/positions.hpp"
#include "layer/projection.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

namespace scratch {
struct MlaRows : HugePagesSlot {};  // a forward's projected rows: the first projection, q, k, v, the attention output
}  // namespace scratch

namespace {

std::int64_t qk_dim(const MlaConfig& m) { return m.qk_nope_head_dim + m.qk_rope_head_dim; }

MlaConfig check_mla(const MlaConfig& m) {
  if (m.q_lora_rank < 0) throw Error("config.mla.q_lora_rank", "expected >= 0 (0: a plain q_proj), got " + num(m.q_lora_rank));
  if (m.kv_lora_rank < 1) throw Error("config.mla.kv_lora_rank", "expected >= 1, got " + num(m.kv_lora_rank));
  if (m.qk_nope_head_dim < 0) throw Error("config.mla.qk_nope_head_dim", "expected >= 0, got " + num(m.qk_nope_head_dim));
  if (m.qk_rope_head_dim < 2 || m.qk_rope_head_dim % 2 != 0)
    throw Error("config.mla.qk_rope_head_dim", "expected an even number >= 2, got " + num(m.qk_rope_head_dim));
  if (m.v_head_dim < 1) throw Error("config.mla.v_head_dim", "expected >= 1, got " + num(m.v_head_dim));
  if (!(std::isfinite(m.norm_eps) && m.norm_eps >= 0.0))
    throw Error("config.mla.norm_eps", "must be finite and >= 0, got " + std::to_string(m.norm_eps));
  return m;
}

// The layer's configuration: MhaConfig's checks with head_dim nope + rope and kv_heads = heads.
MhaConfig resolve_mla(MhaConfig c) {
  if (c.output_gate) throw Error("config.output_gate", "a Multi-head Latent Attention layer has no output gate");
  const MlaConfig m = check_mla(*c.mla);
  const std::int64_t hd = qk_dim(m);
  if (c.head_dim != 0 && c.head_dim != hd)
    throw Error("config.head_dim", "an MLA layer's is qk_nope_head_dim + qk_rope_head_dim = " + num(hd) + " (or 0), got " +
                                       num(c.head_dim));
  if (c.kv_heads != 0 && c.kv_heads != c.heads)
    throw Error("config.kv_heads", "an MLA layer's every head has its keys (0 or heads), got " + num(c.kv_heads));
  if ((c.kdim != 0 && c.kdim != c.d_model) || (c.vdim != 0 && c.vdim != c.d_model))
    throw Error(c.kdim != 0 && c.kdim != c.d_model ? "config.kdim" : "config.vdim", "an MLA layer is self-attention (0 or d_model)");
  if (!c.rope) throw Error("config.rope", "an MLA layer rotates its qk_rope_head_dim dimensions: give its RoPE");
  if (!c.q_norm.empty() || !c.k_norm.empty()) throw Error("config.q_norm", "an MLA layer has no QK-norm");
  if (!c.t5_table.empty() || !c.alibi_slopes.empty())
    throw Error(!c.t5_table.empty() ? "config.t5_table" : "config.alibi_slopes", "not supported in an MLA layer");
  MhaConfig plain = c;
  plain.mla.reset(), plain.rope.reset();
  plain.head_dim = hd, plain.kv_heads = c.heads;
  MhaConfig out = resolve_config(plain);
  RopeConfig r = *c.rope;
  if (r.rotary_dim == 0) r.rotary_dim = m.qk_rope_head_dim;
  if (r.rotary_dim != m.qk_rope_head_dim)
    throw Error("config.rope.rotary_dim", "an MLA layer rotates qk_rope_head_dim = " + num(m.qk_rope_head_dim) +
                                              " dimensions (or 0), got " + num(c.rope->rotary_dim));
  (void)rope_table(r, m.qk_rope_head_dim, false);  // validates it
  out.rope = r;
  out.mla = m;
  // the scale over the expanded keys' dimensions, whichever form attends (the absorbed form's
  // keys are kv_lora_rank + rope wide)
  if (!out.scale) out.scale = 1.0 / std::sqrt(static_cast<double>(hd));
  return out;
}

template <class T>
void check_size(const std::vector<T>& v, std::int64_t rows, std::int64_t cols, const char* name, const char* what) {
  if (static_cast<std::int64_t>(v.size()) != rows * cols)
    throw Error(name, std::string("expected ") + what + " " + shape_str({rows, cols}) + " = " + num(rows * cols) +
                          " elements, got " + num(static_cast<std::int64_t>(v.size())));
}

template <class T>
void check_bias(const std::vector<T>& v, std::int64_t n, const char* name) {
  if (!v.empty() && static_cast<std::int64_t>(v.size()) != n)
    throw Error(name, "expected " + num(n) + " elements (or none), got " + num(static_cast<std::int64_t>(v.size())));
}

// W [rows, cols] packed as W^T.
template <class T>
PackedWeights<T> pack_transposed(const std::vector<T>& w, std::int64_t rows, std::int64_t cols) {
  std::vector<T> t(static_cast<std::size_t>(rows * cols));
  transpose_into(w, rows, cols, t.data(), rows);
  return pack_weights(t.data(), rows, cols, rows);
}

}  // namespace

template <class T>
MlaStorage<T> build_mla(const MhaConfig& config, MlaWeights<T>&& w) {
  MlaStorage<T> L;
  L.cfg = resolve_mla(config);
  const MlaConfig& m = L.m = *L.cfg.mla;
  const std::int64_t H = L.cfg.heads, d = L.cfg.d_model, nq = H * qk_dim(m), rope = m.qk_rope_head_dim;
  const std::int64_t nkv_a = m.kv_lora_rank + rope, nkv_b = H * (m.qk_nope_head_dim + m.v_head_dim), nv = H * m.v_head_dim;
  const bool lora = m.q_lora_rank > 0;
  if (lora) {
    if (!w.wq.empty()) throw Error("weights.wq", "with q_lora_rank > 0 the query comes from wq_a and wq_b (leave wq empty)");
    check_size(w.wq_a, m.q_lora_rank, d, "weights.wq_a", "[q_lora_rank, d_model]");
    check_bias(w.bq_a, m.q_lora_rank, "weights.bq_a");
    if (static_cast<std::int64_t>(w.q_a_norm.size()) != m.q_lora_rank)
      throw Error("weights.q_a_norm", "expected q_lora_rank = " + num(m.q_lora_rank) + " weights, got " +
                                          num(static_cast<std::int64_t>(w.q_a_norm.size())));
    check_size(w.wq_b, nq, m.q_lora_rank, "weights.wq_b", "[heads*(qk_nope_head_dim+qk_rope_head_dim), q_lora_rank]");
  } else {
    check_size(w.wq, nq, d, "weights.wq", "[heads*(qk_nope_head_dim+qk_rope_head_dim), d_model]");
    for (const auto& [v, name] : {std::pair{w.wq_a.size() + w.bq_a.size() + w.wq_b.size(), "weights.wq_a"},
                                  std::pair{w.q_a_norm.size(), "weights.q_a_norm"}})
      if (v != 0) throw Error(name, "q_lora_rank is 0: the query comes from wq alone (leave wq_a, bq_a, q_a_norm, wq_b empty)");
  }
  check_size(w.wkv_a, nkv_a, d, "weights.wkv_a", "[kv_lora_rank+qk_rope_head_dim, d_model]");
  check_bias(w.bkv_a, nkv_a, "weights.bkv_a");
  if (static_cast<std::int64_t>(w.kv_a_norm.size()) != m.kv_lora_rank)
    throw Error("weights.kv_a_norm", "expected kv_lora_rank = " + num(m.kv_lora_rank) + " weights, got " +
                                         num(static_cast<std::int64_t>(w.kv_a_norm.size())));
  check_size(w.wkv_b, nkv_b, m.kv_lora_rank, "weights.wkv_b", "[heads*(qk_nope_head_dim+v_head_dim), kv_lora_rank]");
  check_size(w.wo, d, nv, "weights.wo", "[d_model, heads*v_head_dim]");
  check_bias(w.bo, d, "weights.bo");
  for (const auto* n : {&w.q_a_norm, &w.kv_a_norm})
    for (float x : *n)
      if (!std::isfinite(x)) throw Error(n == &w.q_a_norm ? "weights.q_a_norm" : "weights.kv_a_norm", "holds a NaN or an infinity");
  // the first projection: [q or q_a | kv_a] in one GEMM over x
  const std::int64_t nr = weights_nr<T>();
  auto pad = [nr](std::int64_t n) { return (n + nr - 1) / nr * nr; };
  L.q_cols = lora ? m.q_lora_rank : nq;
  L.kv0 = pad(L.q_cols);
  L.n_a = L.kv0 + pad(nkv_a);
  {
    std::vector<T> t(static_cast<std::size_t>(d * L.n_a), T{});
    transpose_into(lora ? w.wq_a : w.wq, L.q_cols, d, t.data(), L.n_a);
    transpose_into(w.wkv_a, nkv_a, d, t.data() + L.kv0, L.n_a);
    L.w_a = pack_weights(t.data(), L.n_a, d, L.n_a);
  }
  if (!w.bq_a.empty() || !w.bkv_a.empty()) {
    L.b_a.assign(static_cast<std::size_t>(L.n_a), T{});
    std::copy(w.bq_a.begin(), w.bq_a.end(), L.b_a.begin());
    std::copy(w.bkv_a.begin(), w.bkv_a.end(), L.b_a.begin() + L.kv0);
  }
  if (lora) L.w_qb = pack_transposed(w.wq_b, nq, m.q_lora_rank);
  {  // the absorbed form's per-head weights from kv_b [H * (nope + v), kv_lora_rank]
    const std::int64_t nope = m.qk_nope_head_dim, vd = m.v_head_dim, kvl = m.kv_lora_rank;
    std::vector<T> uv(static_cast<std::size_t>(kvl * vd));
    for (std::int64_t h = 0; h < H; ++h) {
      const T* rows = w.wkv_b.data() + h * (nope + vd) * kvl;
      if (nope > 0) L.w_uk.push_back(pack_weights(rows, kvl, nope, kvl));  // W_UK[h] as it is: [nope, kvl]
      else L.w_uk.emplace_back();
      const std::vector<T> v_rows(rows + nope * kvl, rows + (nope + vd) * kvl);
      transpose_into(v_rows, vd, kvl, uv.data(), vd);  // W_UV[h]^T [kvl, vd]
      L.w_uv.push_back(pack_weights(uv.data(), vd, kvl, vd));
    }
  }
  L.w_kvb = pack_transposed(w.wkv_b, nkv_b, m.kv_lora_rank);
  L.wo = pack_transposed(w.wo, d, nv);
  L.bo = std::move(w.bo);
  L.q_norm = std::move(w.q_a_norm);
  L.kv_norm = std::move(w.kv_a_norm);
  L.rope = rope_table(*L.cfg.rope, rope, std::is_same_v<T, double>);
  return L;
}

template <class T>
void mla_forward(const MlaStorage<T>& layer, const ConstSeqView& query, const SeqView& out, const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  const MlaConfig& m = layer.m;
  check_seq("query", query, dtype_of<T>(), -1, c.d_model);
  check_rows("query", query, c.d_model, sizeof(T));
  const std::int64_t B = query.B, S = query.S, M = B * S;
  check_out(out, dtype_of<T>(), B, S, c.d_model);
  if (opt.attn_weights.data != nullptr) throw Error("options.attn_weights", "not supported by an MLA layer yet");
  check_positions(opt.positions, B, S);
  AttentionOptions a = attention_options(opt, dtype_of<T>(), B, c.heads, S, S);  // causal, masks, threads, backend
  add_config_options(c, a);
  if (c.causal && a.causal == Causal::none) a.causal = Causal::top_left;
  if (M == 0) return;
  const std::int64_t H = c.heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk = nope + rope;
  const std::int64_t vd = m.v_head_dim, nkv_b = H * (nope + vd), nv = H * vd, d = c.d_model;
  const int threads = opt.threads;
  // scratch: A [M, n_a], Q [M, H, rope | nope], K [M, H, rope | nope], KV [M, H, nope | v], O [M, H * v]
  const std::int64_t nA = layer.n_a, nQ = H * qk;
  const std::size_t need = static_cast<std::size_t>(M * (nA + 2 * nQ + nkv_b + nv));
  T* A = thread_buffer<T, scratch::MlaRows>().get(need);
  T* Q = A + M * nA;
  T* K = Q + M * nQ;
  T* KV = K + M * nQ;
  T* O = KV + M * nkv_b;
  const T* x = static_cast<const T*>(query.data);
  project(x, M, d, d, layer.w_a, 0, nA, layer.b_a.empty() ? nullptr : layer.b_a.data(), A, nA, threads);
  // the compressed q and kv normalized; q projected up (or taken as it is), kv projected up
  const bool lora = m.q_lora_rank > 0;
  parallel_for(M, threads, 64, [&](std::int64_t m0, std::int64_t m1) {
    for (std::int64_t r = m0; r < m1; ++r) {
      if (lora) rms_norm_row(A + r * nA, m.q_lora_rank, layer.q_norm.data(), m.norm_eps);
      rms_norm_row(A + r * nA + layer.kv0, m.kv_lora_rank, layer.kv_norm.data(), m.norm_eps);
    }
  });
  // q: [M, H, nope | rope] as the checkpoint orders it, into Q reordered [rope | nope] per head
  // (the attention reads dot products only, and RoPE rotates a head's first dimensions)
  const T* qsrc = A;  // q as projected: A's first columns, or q_b's output (in KV's space, written after)
  std::int64_t ldq = nA;
  if (lora) {
    T* up = thread_buffer<T, scratch::MhaProjection>().get(static_cast<std::size_t>(M * nQ));
    project(A, M, m.q_lora_rank, nA, layer.w_qb, 0, nQ, static_cast<const T*>(nullptr), up, nQ, threads);
    qsrc = up, ldq = nQ;
  }
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t h = 0; h < H; ++h) {
      const T* src = qsrc + r * ldq + h * qk;
      T* dst = Q + (r * H + h) * qk;
      std::copy_n(src + nope, rope, dst);
      std::copy_n(src, nope, dst + rope);
    }
  project(A + layer.kv0, M, m.kv_lora_rank, nA, layer.w_kvb, 0, nkv_b, static_cast<const T*>(nullptr), KV, nkv_b, threads);
  // positions: q's rope part per head and the shared kr rotated, then kr copied into every head
  parallel_for(M, threads, 16, [&](std::int64_t m0, std::int64_t m1) {
    thread_local std::vector<double> cs;
    cs.resize(layer.rope.inv_freq.size() * 2);
    for (std::int64_t r = m0; r < m1; ++r) {
      const std::int64_t b = r / S, s = r % S;
      const std::int64_t pos = opt.positions.empty() ? s : opt.positions[static_cast<std::size_t>(b * S + s)];
      rope_angles(layer.rope, pos, cs.data());
      T* kr = A + r * nA + layer.kv0 + m.kv_lora_rank;
      rope_rotate(layer.rope, cs.data(), kr, 1);
      for (std::int64_t h = 0; h < H; ++h) {
        rope_rotate(layer.rope, cs.data(), Q + (r * H + h) * qk, 1);
        T* kh = K + (r * H + h) * qk;
        std::copy_n(kr, rope, kh);
        std::copy_n(KV + r * nkv_b + h * (nope + vd), nope, kh + rope);
      }
    }
  });
  const Shape4 qks{S * H * qk, qk, H * qk, 1};
  attention(ConstTensorView(Q, dtype_of<T>(), {B, H, S, qk}, qks), ConstTensorView(K, dtype_of<T>(), {B, H, S, qk}, qks),
            ConstTensorView(KV + nope, dtype_of<T>(), {B, H, S, vd}, {S * nkv_b, nope + vd, nkv_b, 1}),
            TensorView(O, dtype_of<T>(), {B, H, S, vd}, {S * nv, vd, nv, 1}), a);
  project(O, M, nv, nv, layer.wo, 0, d, layer.bo.empty() ? nullptr : layer.bo.data(), static_cast<T*>(out.data), d, threads);
}

#define SIMDATTN_MLA(T)                                                         \
  template MlaStorage<T> build_mla(const MhaConfig&, MlaWeights<T>&&);         \
  template void mla_forward(const MlaStorage<T>&, const ConstSeqView&, const SeqView&, const MhaOptions&);
SIMDATTN_MLA(float)
SIMDATTN_MLA(double)
SIMDATTN_MLA(bfloat16)
SIMDATTN_MLA(float16)
#undef SIMDATTN_MLA

}  // namespace simdattn::detail
