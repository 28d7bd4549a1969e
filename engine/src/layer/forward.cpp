// The layer's forwards (forward.hpp): their checks, then one pipeline over the call's data.
#include "layer/forward.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_pool.hpp"
#include "layer/cache/kv_store.hpp"
#include "layer/cache/pool_core.hpp"
#include "layer/call_options.hpp"
#include "layer/positions/positions.hpp"
#include "layer/projection.hpp"
#include "layer/storage.hpp"
#include "core/text.hpp"
#include "runtime/threading.hpp"
#include "runtime/verbose.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

// A segment's cached keys (kv_store.hpp): the store its K and V are appended to, its sequences
// over it (their rows from the segment's first), and the keys each held before the step (RoPE's
// positions).
struct SegmentCache {
  KvStore store;
  std::span<const StoreSeq> seqs;
  const std::int64_t* starts = nullptr;  // per sequence of the segment
};

// One batch of sequences of a call: the whole call, or one step of forward_batch / forward_pool.
template <class T>
struct Segment {
  const T* query = nullptr;  // B * S rows of d_model
  T* out = nullptr;          // B * S rows of d_model
  std::int64_t B = 0, S = 0;
  std::span<const std::int64_t> positions;
  const SegmentCache* cache = nullptr;  // K and V appended to it and attended from it
};

// What a forward gives the pipeline.
template <class T>
struct ForwardCall {
  std::span<const Segment<T>> segments;
  // Cross-attention: the key and value inputs, B * Sk rows each. Null: K and V are projected
  // from the queries, with them (one GEMM over Wq|Wk|Wv).
  const T* key = nullptr;
  const T* value = nullptr;
  std::int64_t Sk = 0;
  bool positions = false;  // QK-norm and RoPE on q and k (self-attention, cached steps)
  // The attention core's options; a cached segment adds its cache's lengths and causality.
  AttentionOptions attention;
  // Several steps: their attention cores side by side, one thread each (on onednn, oneDNN's
  // own threads: one step at a time).
  bool steps_side_by_side = false;
  // A batch of pool steps: the blocks taken for their writes, and every step's attention core one
  // problem over the pool (balanced over the threads by the work of each).
  PoolState* pool = nullptr;
  std::span<const PoolWrite> pool_writes;
  std::span<const StoreSeq> pool_seqs;  // every step's sequence over the pool
  // The KvCaches of the call's steps: their lengths advance last, once the step has succeeded.
  std::span<CacheState* const> caches;
  WeightsOut weights;
};

// A call's projected rows: q, and k and v beside it (fused QKV: columns k0 and v0 of q's rows)
// or in a buffer of their own (cross-attention).
template <class T>
struct Projected {
  T* q = nullptr;
  std::int64_t ldq = 0;
  T* k = nullptr;
  T* v = nullptr;
  std::int64_t ldkv = 0;
};

// A buffer's element count: n, at least 1 (an empty call still gets a valid pointer).
std::size_t elements(std::int64_t n) {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, n));
}

// The input projections of M query rows x (and the key and value rows of cross-attention) into
// this thread's projection buffers; o, the attention output's buffer, is taken with them.
template <class T>
Projected<T> project_inputs(const LayerStorage<T>& layer, const ForwardCall<T>& call, const T* x, std::int64_t M,
                            T*& o, const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  if (call.key == nullptr) {
    const std::int64_t N = layer.n_in;
    T* p = thread_buffer<T, scratch::MhaProjection>().get(elements(M * N));
    o = thread_buffer<T, scratch::MhaAttentionOut>().get(elements(M * layer.nq));
    project(x, M, c.d_model, c.d_model, layer.w_in, 0, N, layer.bq(), p, N, opt.threads,
            onednn_weights(layer, opt, layer.w_in));
    return {p, N, p + layer.k0, p + layer.v0, N};
  }
  // k and v side by side in one [B*Sk, 2*nkv] buffer
  const std::int64_t rows_kv = call.segments[0].B * call.Sk, ldkv = 2 * layer.nkv;
  T* pq = thread_buffer<T, scratch::MhaProjection>().get(elements(M * layer.n_qg));
  T* pkv = thread_buffer<T, scratch::MhaProjectionKv>().get(elements(rows_kv * ldkv));
  o = thread_buffer<T, scratch::MhaAttentionOut>().get(elements(M * layer.nq));
  project(x, M, c.d_model, c.d_model, layer.w_in, 0, layer.n_qg, layer.bq(), pq, layer.n_qg, opt.threads,
          onednn_weights(layer, opt, layer.w_in));
  project(call.key, rows_kv, c.kdim, c.kdim, layer.wk(), layer.k_col(), layer.nkv, layer.bk(), pkv, ldkv, opt.threads,
          onednn_weights(layer, opt, layer.wk()));
  project(call.value, rows_kv, c.vdim, c.vdim, layer.wv(), layer.v_col(), layer.nkv, layer.bv(), pkv + layer.nkv, ldkv,
          opt.threads, onednn_weights(layer, opt, layer.wv()));
  return {pq, layer.n_qg, pkv, pkv + layer.nkv, ldkv};
}

// The output gate (MhaConfig::output_gate): o [M, nq] times sigmoid of the gate columns (g0) of
// the query rows (row stride ldq), in f32, each product rounded once.
template <class T>
void gate_output(const LayerStorage<T>& layer, const T* p, std::int64_t ldq, T* o, std::int64_t M, int threads) {
  const std::int64_t nq = layer.nq;
  parallel_for_each_claimed(M, threads, 16, [&](std::int64_t m0, std::int64_t m1) {
    for (std::int64_t m = m0; m < m1; ++m) {
      const T* g = p + m * ldq + layer.g0;
      T* row = o + m * nq;
      for (std::int64_t j = 0; j < nq; ++j) {
        if constexpr (std::is_same_v<T, double>) {
          row[j] = row[j] / (1.0 + std::exp(-g[j]));
        } else {
          const auto gj = static_cast<float>(widen(g[j])), oj = static_cast<float>(widen(row[j]));
          row[j] = narrow<T>(static_cast<double>(oj / (1.0f + std::exp(-gj))));
        }
      }
    }
  });
}

// The attention core of one segment: a cached one's sequences name their rows of the projections
// and of o; an uncached one is the call's only segment.
template <class T>
void attend(const LayerStorage<T>& layer, const ForwardCall<T>& call, const Projected<T>& pr, const Segment<T>& s, T* o,
            const AttentionOptions& a) {
  const std::int64_t H = layer.cfg.heads, Hkv = layer.cfg.kv_heads, hd = layer.cfg.head_dim, nq = layer.nq;
  if (s.cache != nullptr) {
    store_attention(layer, pr.q, pr.ldq, s.cache->store, s.cache->seqs, o, a);
    return;
  }
  const std::int64_t Sq = s.S, Sk = call.key != nullptr ? call.Sk : s.S;
  const ConstTensorView q(pr.q, {s.B, H, Sq, hd}, {Sq * pr.ldq, hd, pr.ldq, 1});
  const ConstTensorView k(pr.k, {s.B, Hkv, Sk, hd}, {Sk * pr.ldkv, hd, pr.ldkv, 1});
  const ConstTensorView v(pr.v, {s.B, Hkv, Sk, hd}, {Sk * pr.ldkv, hd, pr.ldkv, 1});
  attention(q, k, v, TensorView(o, {s.B, H, Sq, hd}, {Sq * nq, hd, nq, 1}), a);
}

// The pipeline. One segment reads its query rows and writes its output rows where they are;
// several are gathered into one matrix for the projections (the weights read once for all)
// and scattered back.
template <class T>
void run(const LayerStorage<T>& layer, const ForwardCall<T>& call, const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  const std::span<const Segment<T>> segs = call.segments;
  const std::int64_t d = c.d_model;
  const std::int64_t M = [&] {
    std::int64_t m = 0;
    for (const Segment<T>& s : segs) m += s.B * s.S;
    return m;
  }();
  // each segment's first row (a reference: the workers of the side-by-side cores read this
  // thread's copy)
  thread_local std::vector<std::int64_t> row0_of_thread;
  std::vector<std::int64_t>& row0 = row0_of_thread;
  row0.assign(segs.size(), 0);
  for (std::size_t i = 1; i < segs.size(); ++i) row0[i] = row0[i - 1] + segs[i - 1].B * segs[i - 1].S;
  const bool gathered = segs.size() > 1;
  const T* x = segs[0].query;
  T* y = segs[0].out;
  if (gathered) {
    T* rows = thread_buffer<T, scratch::MhaBatchRows>().get(elements(M * d));
    for (std::size_t i = 0; i < segs.size(); ++i)
      std::copy_n(segs[i].query, segs[i].B * segs[i].S * d, rows + row0[i] * d);
    x = y = rows;
  }
  T* o = nullptr;
  const Projected<T> pr = project_inputs(layer, call, x, M, o, opt);
  // a cached step without tokens adds nothing and attends to nothing
  auto active = [](const Segment<T>& s) { return s.cache == nullptr || s.S > 0; };
  for (std::size_t i = 0; i < segs.size() && call.positions; ++i) {
    const Segment<T>& s = segs[i];
    if (!active(s)) continue;
    const std::int64_t* start = s.cache != nullptr ? s.cache->starts : nullptr;
    position_qk(layer, pr.q + row0[i] * pr.ldq, pr.ldq, layer.k0, s.B, s.S, s.positions, start, opt.threads);
  }
  // an 8-bit cache or pool cannot hold a NaN or an infinity: every row checked before any changes
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const SegmentCache* sc = segs[i].cache;
    if (sc == nullptr || !active(segs[i])) continue;
    const BadRow bad = first_bad_row(layer, pr.q, pr.ldq, sc->store, sc->seqs);
    if (bad.seq < 0) continue;
    const std::int64_t id = sc->seqs[static_cast<std::size_t>(bad.seq)].index;
    if (call.pool == nullptr) throw Error("cache", bad_row_text(bad, id, sc->store.dtype, "cache"));
    throw Error("steps[" + std::to_string(i) + "]", bad_row_text(bad, id, sc->store.dtype, "pool"));
  }
  if (call.pool != nullptr) prepare_pool_writes(*call.pool, call.pool_writes);  // (the tables now hold the blocks)
  for (std::size_t i = 0; i < segs.size(); ++i)  // K appended rotated
    if (segs[i].cache != nullptr && active(segs[i]))
      append_store_rows(layer, pr.q, pr.ldq, segs[i].cache->store, segs[i].cache->seqs);
  if (call.pool != nullptr) {  // every step in one problem over the pool
    store_attention(layer, pr.q, pr.ldq, segs[0].cache->store, call.pool_seqs, o, call.attention);
  } else if (!call.steps_side_by_side || opt.backend == Backend::onednn) {
    for (std::size_t i = 0; i < segs.size(); ++i)
      if (active(segs[i])) attend(layer, call, pr, segs[i], o, call.attention);
  } else {
    AttentionOptions one = call.attention;
    one.threads = 1;
    const auto n = static_cast<std::int64_t>(segs.size());
    VerboseCall* const verbose = VerboseCall::current();  // the workers' cores report to this call's line
    parallel_for_each_claimed(n, opt.threads, 1, [&](std::int64_t i0, std::int64_t i1) {
      const VerboseAdopt report_to(verbose);
      for (std::int64_t i = i0; i < i1; ++i)
        if (active(segs[i])) attend(layer, call, pr, segs[i], o, one);
    });
  }
  average_weights(call.weights, opt.attn_weights);
  if (layer.gated()) gate_output(layer, pr.q, pr.ldq, o, M, opt.threads);
  project(o, M, layer.nq, layer.nq, layer.wo, 0, d, layer.bo_or_null(), y, d, opt.threads,
          onednn_weights(layer, opt, layer.wo));
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const Segment<T>& s = segs[i];
    if (gathered) std::copy_n(y + row0[i] * d, s.B * s.S * d, s.out);
  }
  for (CacheState* cache : call.caches) cache->lengths = cache->next;  // (spans from lengths() stay valid: same size)
  if (call.pool != nullptr) commit_pool_writes(*call.pool, call.pool_writes);
}

// Error e of step i, its argument prefixed with "steps[i]."
Error step_error(std::size_t i, const Error& e) {
  const std::string what = e.what(), arg = e.argument();
  const std::string message = what.rfind(arg + ": ", 0) == 0 ? what.substr(arg.size() + 2) : what;
  return Error("steps[" + std::to_string(i) + "]." + arg, message);
}

}  // namespace

template <class T>
void self_forward(const LayerStorage<T>& layer, const ConstSeqView& query, const SeqView& out, const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  if (!layer.fused_qkv)
    throw Error("key", "self-attention needs kdim == vdim == d_model (this layer has kdim " + std::to_string(c.kdim) +
                           ", vdim " + std::to_string(c.vdim) + "); pass key and value");
  check_seq("query", query, dtype_of<T>(), -1, c.d_model);
  check_rows("query", query, std::max({c.d_model, layer.n_in, layer.nq}), sizeof(T));
  const std::int64_t B = query.B, S = query.S;
  check_out(out, dtype_of<T>(), B, S, c.d_model);
  ForwardCall<T> call;
  call.attention = attention_options(opt, dtype_of<T>(), B, c.heads, S, S);
  add_config_options(c, call.attention);
  if (c.causal && call.attention.causal == Causal::none) call.attention.causal = Causal::top_left;
  call.weights = weights_output(opt, B, c.heads, S, S, call.attention);
  call.positions = true;
  const Segment<T> whole{static_cast<const T*>(query.data), static_cast<T*>(out.data), B, S, opt.positions, nullptr};
  call.segments = {&whole, 1};
  run(layer, call, opt);
}

template <class T>
void cross_forward(const LayerStorage<T>& layer, const ConstSeqView& query, const ConstSeqView& key,
                   const ConstSeqView& value, const SeqView& out, const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  check_seq("query", query, dtype_of<T>(), -1, c.d_model);
  check_rows("query", query, std::max(c.d_model, layer.n_qg), sizeof(T));
  const std::int64_t B = query.B, Sq = query.S;
  check_seq("key", key, dtype_of<T>(), B, c.kdim);
  check_seq("value", value, dtype_of<T>(), B, c.vdim);
  check_rows("key", key, std::max(c.kdim, 2 * layer.nkv), sizeof(T));
  check_rows("value", value, std::max(c.vdim, 2 * layer.nkv), sizeof(T));
  if (value.S != key.S)
    throw Error("value", "has " + std::to_string(value.S) + " positions, key has " + std::to_string(key.S));
  const std::int64_t Sk = key.S;
  check_out(out, dtype_of<T>(), B, Sq, c.d_model);
  ForwardCall<T> call;
  call.attention = attention_options(opt, dtype_of<T>(), B, c.heads, Sq, Sk);
  add_config_options(c, call.attention);
  if (!opt.positions.empty()) throw Error("options.positions", "cross-attention applies no rotary embedding");
  call.weights = weights_output(opt, B, c.heads, Sq, Sk, call.attention);
  call.key = static_cast<const T*>(key.data);
  call.value = static_cast<const T*>(value.data);
  call.Sk = Sk;
  const Segment<T> whole{static_cast<const T*>(query.data), static_cast<T*>(out.data), B, Sq, {}, nullptr};
  call.segments = {&whole, 1};
  run(layer, call, opt);
}

// The options a call of several cached steps refuses: the call's positions (each step has its
// own) and attention weights. `call`: the method, `per_step`: where positions go.
void check_steps_options(const MhaOptions& opt, const char* call, const char* per_step) {
  if (!opt.positions.empty())
    throw Error("options.positions", std::string(call) + " takes positions per step (" + per_step + ")");
  if (opt.attn_weights.data != nullptr)
    throw Error("options.attn_weights", std::string(call) + " does not output attention weights");
}

// The cached segments of a call's KvCache steps (their lengths then advance in run()), in the
// calling thread's vectors: a decode step allocates nothing once their sizes were seen.
template <class T>
struct CacheSegments {
  std::vector<StoreSeq>& seqs = storage().seqs;
  std::vector<SegmentCache>& caches = storage().caches;
  std::vector<Segment<T>>& segments = storage().segments;
  std::vector<CacheState*>& states = storage().states;
  std::int64_t rows = 0;  // the call's rows so far
  struct Storage {
    std::vector<StoreSeq> seqs;
    std::vector<SegmentCache> caches;
    std::vector<Segment<T>> segments;
    std::vector<CacheState*> states;
  };
  static Storage& storage() {
    thread_local Storage s;
    return s;
  }
  CacheSegments() { seqs.clear(), caches.clear(), segments.clear(), states.clear(); }
  // A step's segment: its query and out over cache c (checked), `tokens` rows a sequence.
  void add(CacheState& c, const ConstSeqView& query, const SeqView& out, std::span<const std::int64_t> positions) {
    cache_seqs(c, query.S, rows, seqs);
    caches.push_back({cache_store(c), {}, c.lengths.data()});
    segments.push_back({static_cast<const T*>(query.data), static_cast<T*>(out.data), query.B, query.S, positions, nullptr});
    states.push_back(&c);
    rows += query.B * query.S;
  }
  // Spans and pointers, once every step is added (the vectors no longer move).
  void link() {
    std::size_t at = 0;
    for (std::size_t i = 0; i < caches.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(states[i]->batch);
      caches[i].seqs = std::span<const StoreSeq>(seqs).subspan(at, n);
      segments[i].cache = &caches[i];
      at += n;
    }
  }
};

template <class T>
void cached_forward(const LayerStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                    const MhaOptions& opt) {
  check_cached_step(layer, query, cache, out, opt, opt.positions);
  const std::int64_t B = query.B, tokens = query.S;
  if (tokens == 0) return;
  CacheSegments<T> steps;
  steps.add(cache, query, out, opt.positions);
  steps.link();
  ForwardCall<T> call;
  add_config_options(layer.cfg, call.attention);
  call.weights = weights_output(opt, B, layer.cfg.heads, tokens, cache.capacity, call.attention);
  call.attention.threads = opt.threads;
  call.attention.backend = opt.backend;
  call.positions = true;
  call.segments = steps.segments;
  call.caches = steps.states;
  run(layer, call, opt);
}

template <class T>
void batched_forward(const LayerStorage<T>& layer, std::span<const DecodeStep> steps, const MhaOptions& opt) {
  std::vector<CacheState*> states;
  states.reserve(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].cache == nullptr) throw Error("steps[" + std::to_string(i) + "].cache", "null");
    for (std::size_t j = 0; j < i; ++j)
      if (steps[j].cache == steps[i].cache)
        throw Error("steps[" + std::to_string(i) + "].cache",
                    "the cache of steps[" + std::to_string(j) + "] too: each step needs a cache of its own");
    try {
      states.push_back(&cache_of_layer(layer.cfg, *steps[i].cache));
    } catch (const Error& e) {
      throw step_error(i, e);
    }
  }
  check_steps_options(opt, "forward_batch", "DecodeStep::positions");
  CacheSegments<T> cached;
  std::int64_t M = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const DecodeStep& s = steps[i];
    try {
      check_cached_step(layer, s.query, *states[i], s.out, opt, s.positions);
    } catch (const Error& e) {
      throw step_error(i, e);
    }
    cached.add(*states[i], s.query, s.out, s.positions);
    M += s.query.B * s.query.S;
  }
  if (M == 0) return;
  cached.link();
  ForwardCall<T> call;
  add_config_options(layer.cfg, call.attention);
  call.attention.threads = opt.threads;
  call.attention.backend = opt.backend;
  call.positions = true;
  call.steps_side_by_side = true;
  call.segments = cached.segments;
  call.caches = cached.states;
  run(layer, call, opt);
}

template <class T>
void check_pool_call(const LayerStorage<T>& layer, const PoolState& pool, const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  if (!layer.fused_qkv) throw Error("pool", "a pool holds self-attention's keys: it needs kdim == vdim == d_model");
  if (pool.latent) throw Error("pool", "holds an MLA layer's latent rows, not this layer's keys and values");
  if (pool.kv_heads != c.kv_heads || pool.head_dim != c.head_dim)
    throw Error("pool", "was made for another layer (kv_heads " + num(pool.kv_heads) + ", head_dim " + num(pool.head_dim) +
                            "; this layer has " + num(c.kv_heads) + " and " + num(c.head_dim) + ")");
  if (!c.t5_table.empty()) throw Error("pool", "T5's relative position bias is not supported over a pool");
  check_cached_options(opt, "a pool");
  check_steps_options(opt, "forward_pool", "PoolStep::positions");
  (void)cascade_mode();  // Error("SIMDATTN_CASCADE") for a value it does not know
  if (opt.backend == Backend::onednn)
    throw Error("options.backend", "forward_pool runs on the native and reference backends (oneDNN has no paged attention)");
}

template <class T>
void check_pool_step(const LayerStorage<T>& layer, const PoolStep& s) {
  check_step_rows(layer, s.query, s.out, s.positions, 1);
  if (s.tree_mask.data() == nullptr && s.tree_mask.empty()) return;
  const std::int64_t n = s.query.S;
  if (static_cast<std::int64_t>(s.tree_mask.size()) != n * n)
    throw Error("tree_mask", "expected the step's [T, T] = " + num(n * n) + " elements, got " +
                                 num(static_cast<std::int64_t>(s.tree_mask.size())));
  if (layer.cfg.window || !layer.cfg.alibi_slopes.empty())
    throw Error("tree_mask", "this layer has a sliding window or ALiBi: positions inside a tree are not linear");
}

template <class T>
void pool_forward(const LayerStorage<T>& layer, std::span<const PoolStep> steps, PoolState& pool, std::int64_t layer_index,
                  const MhaOptions& opt) {
  check_pool_call(layer, pool, opt);
  std::vector<PoolWrite> writes(steps.size());
  std::int64_t M = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    try {
      check_pool_step(layer, steps[i]);
    } catch (const Error& e) {
      throw step_error(i, e);
    }
    writes[i] = {steps[i].sequence, layer_index, 0, steps[i].query.S};
    M += steps[i].query.S;
  }
  check_pool_writes(pool, writes);  // sets each write's start; Error("pool") when too few blocks are free
  if (M == 0) return;  // (run() takes the blocks: prepare_pool_writes, once the rows are checked)
  std::vector<StoreSeq> seqs;
  pool_seqs(pool, writes, seqs);
  std::vector<SegmentCache> caches(steps.size());
  std::vector<Segment<T>> segments(steps.size());
  const KvStore store = pool_store(pool, layer_index);
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (!steps[i].tree_mask.empty()) seqs[i].tree_mask = steps[i].tree_mask.data();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    caches[i] = {store, std::span<const StoreSeq>(seqs).subspan(i, 1), &writes[i].start};
    segments[i] = {static_cast<const T*>(steps[i].query.data), static_cast<T*>(steps[i].out.data), 1, steps[i].query.S,
                   steps[i].positions, &caches[i]};
  }
  ForwardCall<T> call;
  add_config_options(layer.cfg, call.attention);
  call.attention.threads = opt.threads;
  call.attention.backend = opt.backend;
  call.positions = true;
  call.pool = &pool;
  call.pool_writes = writes;
  call.pool_seqs = seqs;
  call.segments = segments;
  run(layer, call, opt);
}

#define SIMDATTN_FORWARDS(T)                                                                                       \
  template void self_forward(const LayerStorage<T>&, const ConstSeqView&, const SeqView&, const MhaOptions&);      \
  template void cross_forward(const LayerStorage<T>&, const ConstSeqView&, const ConstSeqView&, const ConstSeqView&, \
                              const SeqView&, const MhaOptions&);                                                  \
  template void cached_forward(const LayerStorage<T>&, const ConstSeqView&, CacheState&, const SeqView&,       \
                               const MhaOptions&);                                                                 \
  template void batched_forward(const LayerStorage<T>&, std::span<const DecodeStep>, const MhaOptions&);            \
  template void pool_forward(const LayerStorage<T>&, std::span<const PoolStep>, PoolState&, std::int64_t,         \
                             const MhaOptions&);                                                                  \
  template void check_pool_call(const LayerStorage<T>&, const PoolState&, const MhaOptions&);                      \
  template void check_pool_step(const LayerStorage<T>&, const PoolStep&);
SIMDATTN_FORWARDS(float)
SIMDATTN_FORWARDS(double)
SIMDATTN_FORWARDS(bfloat16)
SIMDATTN_FORWARDS(float16)
#undef SIMDATTN_FORWARDS

}  // namespace simdattn::detail
