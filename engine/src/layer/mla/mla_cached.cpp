// Multi-head Latent Attention over its latent cache or pool (mla.hpp): a cached step, or a pool
// batch, in the absorbed form. Each new token's latent row [RMSNorm(c) | RoPE(kr)] is appended to the cache; each
// head's query becomes [q_nope W_UK[h] | RoPE(q_rope)] (W_UK[h]: kv_b's key rows of head h), so
// every head attends over the one latent row per key (keys the whole row, values its first
// kv_lora_rank columns, read once for all heads), and its output o_latent W_UV[h]^T (kv_b's value
// rows) goes to o_proj. The dot products are the expanded form's (q_nope . k_nope = q_nope .
// (W_UK c) = (q_nope W_UK) . c), and so are the outputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_pool.hpp"
#include "layer/cache/kv_store.hpp"
#include "layer/call_options.hpp"
#include "layer/mla/mla.hpp"
#include "layer/positions/positions.hpp"
#include "layer/projection.hpp"
#include "linalg/code8.hpp"
#include "linalg/convert.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

namespace scratch {
struct MlaCachedRows : HugePagesSlot {};  // a cached step's rows: the first projection, q, latent rows, absorbed q and output
struct MlaPoolRows : HugePagesSlot {};    // a pool batch's query rows gathered, and its output rows
struct MlaExpandRows : HugePagesSlot {};  // the expanded form's latent rows read back, kv_b's output, the keys
}  // namespace scratch

namespace {

// A cached step's rows in this thread's scratch: the latent rows Lr [M, W], the absorbed queries
// Qa [M, H, W] and their attention's output Oa [M, H, kv_lora_rank], the expanded queries Qe [M,
// H, rope | nope], the heads' output O [M, H * v].
template <class T>
struct StepRows {
  T* Lr;
  T* Qa;
  T* Oa;
  T* Qe;
  T* O;
};

// Rows x [M, d_model] at positions pos[r]: the first projection, the two RMSNorms, the latent rows
// [normed c | RoPE(kr)], the absorbed queries [q_nope W_UK[h] | RoPE(q_rope)] (`absorbed`) and the
// expanded ones [RoPE(q_rope) | q_nope] (`expanded`).
template <class T>
StepRows<T> step_rows(const MlaStorage<T>& layer, const T* x, std::int64_t M, std::span<const std::int64_t> pos, bool absorbed,
                      bool expanded, int threads) {
  const MhaConfig& c = layer.cfg;
  const MlaConfig& m = layer.m;
  const std::int64_t H = c.heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk = nope + rope;
  const std::int64_t kvl = m.kv_lora_rank, W = kvl + rope, vd = m.v_head_dim, nA = layer.n_a, d = c.d_model;
  const bool lora = m.q_lora_rank > 0;
  const std::size_t need =
      static_cast<std::size_t>(M * (nA + (lora ? H * qk : 0) + W + H * W + H * kvl + (expanded ? H * qk : 0) + H * vd));
  T* A = thread_buffer<T, scratch::MlaCachedRows>().get(need);
  T* Qup = A + M * nA;
  StepRows<T> out;
  out.Lr = Qup + (lora ? M * H * qk : 0);
  out.Qa = out.Lr + M * W;
  out.Oa = out.Qa + M * H * W;
  out.Qe = out.Oa + M * H * kvl;
  out.O = out.Qe + (expanded ? M * H * qk : 0);
  project(x, M, d, d, layer.w_a, 0, nA, layer.b_a.empty() ? nullptr : layer.b_a.data(), A, nA, threads);
  parallel_for(M, threads, 64, [&](std::int64_t m0, std::int64_t m1) {
    for (std::int64_t r = m0; r < m1; ++r) {
      if (lora) rms_norm_row(A + r * nA, m.q_lora_rank, layer.q_norm.data(), m.norm_eps);
      rms_norm_row(A + r * nA + layer.kv0, kvl, layer.kv_norm.data(), m.norm_eps);
    }
  });
  const T* qsrc = A;
  std::int64_t ldq = nA;
  if (lora) {
    project(A, M, m.q_lora_rank, nA, layer.w_qb, 0, H * qk, static_cast<const T*>(nullptr), Qup, H * qk, threads);
    qsrc = Qup, ldq = H * qk;
  }
  // the absorbed queries' latent parts: q_nope of head h times W_UK[h]
  for (std::int64_t h = 0; h < H && absorbed; ++h) {
    if (nope == 0) {
      for (std::int64_t r = 0; r < M; ++r) std::fill_n(out.Qa + r * H * W + h * W, kvl, T{});
      continue;
    }
    project(qsrc + h * qk, M, nope, ldq, layer.w_uk[static_cast<std::size_t>(h)], 0, kvl, static_cast<const T*>(nullptr),
            out.Qa + h * W, H * W, threads);
  }
  // the latent rows and the queries' rotary parts at each token's position
  parallel_for(M, threads, 16, [&](std::int64_t m0, std::int64_t m1) {
    thread_local std::vector<double> cs;
    cs.resize(layer.rope.inv_freq.size() * 2);
    for (std::int64_t r = m0; r < m1; ++r) {
      rope_angles(layer.rope, pos[static_cast<std::size_t>(r)], cs.data());
      T* row = out.Lr + r * W;
      std::copy_n(A + r * nA + layer.kv0, W, row);  // [normed c | kr]
      rope_rotate(layer.rope, cs.data(), row + kvl, 1);
      for (std::int64_t h = 0; h < H; ++h) {
        const T* src = qsrc + r * ldq + h * qk;
        if (absorbed) {
          T* q = out.Qa + (r * H + h) * W + kvl;
          std::copy_n(src + nope, rope, q);
          rope_rotate(layer.rope, cs.data(), q, 1);
        }
        if (expanded) {  // [rope | nope], as the whole-sequence forward lays a head out
          T* q = out.Qe + (r * H + h) * qk;
          std::copy_n(src + nope, rope, q);
          std::copy_n(src, nope, q + rope);
          rope_rotate(layer.rope, cs.data(), q, 1);
        }
      }
    }
  });
  return out;
}

// Whether a sequence's step runs in the expanded form: a chunk of kMlaExpandedMinTokens new tokens
// or more without a draft tree (pool_core.hpp-style rule, measured: docs/models.md, "Multi-head
// Latent Attention").
bool expanded_step(const StoreSeq& s) { return s.tokens >= kMlaExpandedMinTokens && s.tree_mask == nullptr; }

// One sequence's step in the expanded form: its keys' latent rows (cached and new) read back, kv_b
// over them (each head's nope keys and values), every head's keys [kr | k_nope], one attention()
// call into its rows of O.
template <class T>
void expanded_sequence(const MlaStorage<T>& layer, const StepRows<T>& rows, const KvStore& store, const StoreSeq& s,
                       const AttentionOptions& a) {
  const MlaConfig& m = layer.m;
  const std::int64_t H = layer.cfg.heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk = nope + rope;
  const std::int64_t kvl = m.kv_lora_rank, W = kvl + rope, vd = m.v_head_dim, nkv = H * (nope + vd);
  const std::int64_t L = s.start + s.tokens, T0 = s.tokens;
  T* Lc = thread_buffer<T, scratch::MlaExpandRows>().get(static_cast<std::size_t>(L * (W + nkv + H * qk)));
  T* KV = Lc + L * W;
  T* K = KV + L * nkv;
  read_latent_rows(store, s, L, Lc);
  project(Lc, L, kvl, W, layer.w_kvb, 0, nkv, static_cast<const T*>(nullptr), KV, nkv, a.threads);
  for (std::int64_t j = 0; j < L; ++j)
    for (std::int64_t h = 0; h < H; ++h) {
      T* kh = K + (j * H + h) * qk;
      std::copy_n(Lc + j * W + kvl, rope, kh);
      std::copy_n(KV + j * nkv + h * (nope + vd), nope, kh + rope);
    }
  const DType t = dtype_of<T>();
  AttentionOptions o = a;
  o.causal = Causal::bottom_right;
  attention(ConstTensorView(rows.Qe + s.row0 * H * qk, t, {1, H, T0, qk}, {T0 * H * qk, qk, H * qk, 1}),
            ConstTensorView(K, t, {1, H, L, qk}, {L * H * qk, qk, H * qk, 1}),
            ConstTensorView(KV + nope, t, {1, H, L, vd}, {L * nkv, nope + vd, nkv, 1}),
            TensorView(rows.O + s.row0 * H * vd, t, {1, H, T0, vd}, {T0 * H * vd, vd, H * vd, 1}), o);
}

// Every sequence's step: the absorbed form (every head over the store's latent rows: keys whole
// rows, values their first kv_lora_rank columns; then o_latent W_UV[h]^T) or the expanded one
// (expanded_step), then o_proj into y [M, d_model].
template <class T>
void step_output(const MlaStorage<T>& layer, const StepRows<T>& rows, std::int64_t M, const KvStore& store,
                 std::span<const StoreSeq> seqs, const MhaOptions& opt, T* y) {
  const MhaConfig& c = layer.cfg;
  const MlaConfig& m = layer.m;
  const std::int64_t H = c.heads, kvl = m.kv_lora_rank, W = kvl + m.qk_rope_head_dim, vd = m.v_head_dim;
  AttentionOptions a;
  add_config_options(c, a);
  a.threads = opt.threads;
  a.backend = opt.backend;
  for (std::size_t i = 0; i < seqs.size();) {  // runs of sequences of one form (their rows consecutive)
    std::size_t j = i;
    while (j < seqs.size() && expanded_step(seqs[j]) == expanded_step(seqs[i])) ++j;
    const std::span<const StoreSeq> run = seqs.subspan(i, j - i);
    if (expanded_step(seqs[i])) {
      for (const StoreSeq& s : run) expanded_sequence(layer, rows, store, s, a);
    } else {
      store_attention_rows(H, H * W, H * kvl, rows.Qa, H * W, store, run, rows.Oa, a);
      const std::int64_t r0 = run.front().row0, n = run.back().row0 + run.back().tokens - r0;
      for (std::int64_t h = 0; h < H; ++h)
        project(rows.Oa + r0 * H * kvl + h * kvl, n, kvl, H * kvl, layer.w_uv[static_cast<std::size_t>(h)], 0, vd,
                static_cast<const T*>(nullptr), rows.O + r0 * H * vd + h * vd, H * vd, opt.threads);
    }
    i = j;
  }
  project(rows.O, M, H * vd, H * vd, layer.wo, 0, c.d_model, layer.bo.empty() ? nullptr : layer.bo.data(), y, c.d_model,
          opt.threads);
}

// Which forms a step's sequences take.
std::pair<bool, bool> forms_of(std::span<const StoreSeq> seqs) {
  bool absorbed = false, expanded = false;
  for (const StoreSeq& s : seqs) (expanded_step(s) ? expanded : absorbed) = true;
  return {absorbed, expanded};
}

// The first row of an 8-bit store's new latent rows that no code holds (a NaN or an infinity), or -1.
template <class T>
std::int64_t bad_latent_row(const MlaStorage<T>& layer, DType store, const T* Lr, std::int64_t M) {
  if (!is_kv_code(store)) return -1;
  const std::int64_t W = layer.m.kv_lora_rank + layer.m.qk_rope_head_dim;
  return first_nonfinite_row(Lr, dtype_of<T>(), M, W, W);
}

}  // namespace

template <class T>
void mla_check_cached_step(const MlaStorage<T>& layer, const ConstSeqView& query, const CacheState& cache, const SeqView& out,
                           const MhaOptions& opt, std::span<const std::int64_t> positions) {
  const MhaConfig& c = layer.cfg;
  check_seq("query", query, dtype_of<T>(), cache.batch, c.d_model);
  check_rows("query", query, c.d_model, sizeof(T));
  check_out(out, dtype_of<T>(), query.B, query.S, c.d_model);
  check_cached_options(opt, "a KvCache");
  check_positions(positions, cache.batch, query.S);
  for (std::int64_t b = 0; b < cache.batch; ++b) {
    const std::int64_t L = cache.lengths[static_cast<std::size_t>(b)];
    if (query.S > cache.capacity - L)
      throw Error("cache", "sequence " + num(b) + " holds " + num(L) + " tokens; " + num(query.S) +
                               " more exceed the capacity " + num(cache.capacity));
  }
}

template <class T>
void mla_cached_forward(const MlaStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                        const MhaOptions& opt) {
  mla_check_cached_step(layer, query, cache, out, opt, opt.positions);
  const std::int64_t B = cache.batch, S = query.S, M = B * S;
  if (M == 0) return;
  std::vector<std::int64_t> pos(static_cast<std::size_t>(M));
  for (std::int64_t r = 0; r < M; ++r)
    pos[static_cast<std::size_t>(r)] =
        opt.positions.empty() ? cache.lengths[static_cast<std::size_t>(r / S)] + r % S : opt.positions[static_cast<std::size_t>(r)];
  const KvStore store = cache_store(cache);
  std::vector<StoreSeq> seqs;
  cache_seqs(cache, S, 0, seqs);
  const auto [absorbed, expanded] = forms_of(seqs);
  const StepRows<T> rows = step_rows(layer, static_cast<const T*>(query.data), M, pos, absorbed, expanded, opt.threads);
  if (const std::int64_t bad = bad_latent_row(layer, cache.dtype, rows.Lr, M); bad >= 0)
    throw Error("cache", "sequence " + num(bad / S) + ", token " + num(pos[static_cast<std::size_t>(bad)]) +
                             ": its latent row holds a NaN or an infinity, which a " + std::string(dtype_name(cache.dtype)) +
                             " cache cannot represent (the cache is unchanged)");
  append_latent_rows(store, seqs, rows.Lr);
  step_output(layer, rows, M, store, seqs, opt, static_cast<T*>(out.data));
  for (std::int64_t b = 0; b < B; ++b) cache.lengths[static_cast<std::size_t>(b)] += S;
}

template <class T>
void mla_check_pool_call(const MlaStorage<T>& layer, const PoolState& pool, const MhaOptions& opt) {
  const MlaConfig& m = layer.m;
  if (!pool.latent || pool.head_dim != m.kv_lora_rank + m.qk_rope_head_dim || pool.v_dim != m.kv_lora_rank)
    throw Error("pool", "was not made for this MLA layer (its latent rows are kv_lora_rank " + num(m.kv_lora_rank) +
                            " + qk_rope_head_dim " + num(m.qk_rope_head_dim) + " wide)");
  check_cached_options(opt, "a pool");
  if (!opt.positions.empty())
    throw Error("options.positions", "forward_pool takes each step's positions in PoolStep::positions");
  if (opt.backend == Backend::onednn)
    throw Error("options.backend", "forward_pool runs on the native and reference backends (oneDNN has no paged attention)");
}

template <class T>
void mla_check_pool_step(const MlaStorage<T>& layer, const PoolStep& s) {
  const std::int64_t d = layer.cfg.d_model;
  check_seq("query", s.query, dtype_of<T>(), 1, d);
  check_rows("query", s.query, d, sizeof(T));
  check_out(s.out, dtype_of<T>(), 1, s.query.S, d);
  check_positions(s.positions, 1, s.query.S);
  if (s.tree_mask.empty()) return;
  if (static_cast<std::int64_t>(s.tree_mask.size()) != s.query.S * s.query.S)
    throw Error("tree_mask", "expected the step's [T, T] = " + num(s.query.S * s.query.S) + " elements, got " +
                                 num(static_cast<std::int64_t>(s.tree_mask.size())));
  if (layer.cfg.window) throw Error("tree_mask", "this layer has a sliding window: positions inside a tree are not linear");
}

template <class T>
void mla_pool_forward(const MlaStorage<T>& layer, std::span<const PoolStep> steps, PoolState& pool, std::int64_t layer_index,
                      const MhaOptions& opt) {
  const std::int64_t d = layer.cfg.d_model;
  mla_check_pool_call(layer, pool, opt);
  std::vector<PoolWrite> writes(steps.size());
  std::int64_t M = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    try {
      mla_check_pool_step(layer, steps[i]);
    } catch (const Error& e) {
      const std::string what = e.what(), arg = e.argument();
      throw Error("steps[" + std::to_string(i) + "]." + arg, what.rfind(arg + ": ", 0) == 0 ? what.substr(arg.size() + 2) : what);
    }
    writes[i] = {steps[i].sequence, layer_index, 0, steps[i].query.S};
    M += steps[i].query.S;
  }
  check_pool_writes(pool, writes);  // each write's start; Error("pool") when too few blocks are free
  if (M == 0) return;
  // the steps' rows gathered, their positions
  T* x = thread_buffer<T, scratch::MlaPoolRows>().get(static_cast<std::size_t>(2 * M * d));
  T* y = x + M * d;
  std::vector<std::int64_t> pos(static_cast<std::size_t>(M));
  for (std::size_t i = 0, r = 0; i < steps.size(); ++i)
    for (std::int64_t t = 0; t < steps[i].query.S; ++t, ++r) {
      std::copy_n(static_cast<const T*>(steps[i].query.data) + t * d, d, x + static_cast<std::int64_t>(r) * d);
      pos[r] = steps[i].positions.empty() ? writes[i].start + t : steps[i].positions[static_cast<std::size_t>(t)];
    }
  std::vector<StoreSeq> seqs;
  pool_seqs(pool, writes, seqs);  // (tables as they stand: only the forms are read before the blocks are taken)
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (!steps[i].tree_mask.empty()) seqs[i].tree_mask = steps[i].tree_mask.data();
  const auto [absorbed, expanded] = forms_of(seqs);
  const StepRows<T> rows = step_rows(layer, x, M, pos, absorbed, expanded, opt.threads);
  if (const std::int64_t bad = bad_latent_row(layer, pool.dtype, rows.Lr, M); bad >= 0) {
    std::size_t i = 0;
    std::int64_t r0 = 0;
    while (r0 + steps[i].query.S <= bad) r0 += steps[i].query.S, ++i;
    throw Error("steps[" + std::to_string(i) + "]", "sequence " + num(steps[i].sequence) + ", token " +
                                                         num(writes[i].start + bad - r0) +
                                                         ": its latent row holds a NaN or an infinity, which a " +
                                                         std::string(dtype_name(pool.dtype)) +
                                                         " pool cannot represent (the pool is unchanged)");
  }
  prepare_pool_writes(pool, writes);
  const KvStore store = pool_store(pool, layer_index);
  append_latent_rows(store, seqs, rows.Lr);
  step_output(layer, rows, M, store, seqs, opt, y);
  for (std::size_t i = 0, r = 0; i < steps.size(); r += static_cast<std::size_t>(steps[i].query.S), ++i)
    std::copy_n(y + static_cast<std::int64_t>(r) * d, steps[i].query.S * d, static_cast<T*>(steps[i].out.data));
  commit_pool_writes(pool, writes);
}

#define SIMDATTN_MLA_CACHED(T)                                                                                  \
  template void mla_cached_forward(const MlaStorage<T>&, const ConstSeqView&, CacheState&, const SeqView&,        \
                                   const MhaOptions&);                                                            \
  template void mla_pool_forward(const MlaStorage<T>&, std::span<const PoolStep>, PoolState&, std::int64_t,       \
                                 const MhaOptions&);                                                              \
  template void mla_check_pool_call(const MlaStorage<T>&, const PoolState&, const MhaOptions&);                  \
  template void mla_check_pool_step(const MlaStorage<T>&, const PoolStep&);                                      \
  template void mla_check_cached_step(const MlaStorage<T>&, const ConstSeqView&, const CacheState&,               \
                                      const SeqView&, const MhaOptions&, std::span<const std::int64_t>);
SIMDATTN_MLA_CACHED(float)
SIMDATTN_MLA_CACHED(double)
SIMDATTN_MLA_CACHED(bfloat16)
SIMDATTN_MLA_CACHED(float16)
#undef SIMDATTN_MLA_CACHED

}  // namespace simdattn::detail
