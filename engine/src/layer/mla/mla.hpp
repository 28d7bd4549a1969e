// Multi-head Latent Attention (simdattn/mha.hpp's MlaConfig): the built layer and its forward on
// a whole sequence, in the expanded form (each head's keys and values from the latent, then one
// attention() call): prefill's cheaper form, as the keys' 192 dimensions and the values' 128 cost
// less than the absorbed form's 576 and 512 once queries outnumber the heads' reuse of the latent.
#pragma once

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_pool.hpp"
#include "layer/positions/rope_table.hpp"
#include "layer/storage.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// A cached step's sequence with this many new tokens or more (and no draft tree) runs in the
// expanded form (its keys' latent rows projected up through kv_b, one attention() call), fewer in
// the absorbed form (every head over the latent rows). Measured (docs/models.md): a chunk over
// 4096 cached tokens, bf16, 2 threads, expanded against absorbed: V2-Lite's shape 1.32x the time at
// 128 tokens, 0.86x at 256; V3's 1.33x and 0.93x. Expanding costs the keys' kv_b product (L x
// kv_lora_rank x H (nope + v)) whatever the chunk; absorbing costs 576 + 512 multiply-adds a key
// and head a token instead of 192 + 128.
inline constexpr std::int64_t kMlaExpandedMinTokens = 256;

template <class T>
struct MlaStorage {
  MhaConfig cfg;  // resolved: head_dim = nope + rope, kv_heads = heads, kdim = vdim = d_model
  MlaConfig m;
  // The first projection's columns: q (H * (nope + rope)) or q_a (q_lora_rank), then from kv0
  // kv_a (kv_lora_rank + rope); each group padded to the GEMM's panel width.
  std::int64_t q_cols = 0, kv0 = 0, n_a = 0;
  PackedWeights<T> w_a;   // [d_model, n_a]
  std::vector<T> b_a;     // [n_a], or empty
  PackedWeights<T> w_qb;  // [q_lora_rank, H * (nope + rope)] (q_lora_rank > 0)
  PackedWeights<T> w_kvb; // [kv_lora_rank, H * (nope + v)]
  PackedWeights<T> wo;    // [H * v, d_model]
  // The absorbed form's weights, per head h: W_UK[h] [nope, kv_lora_rank] (kv_b's key rows, q_nope
  // times it gives the query's latent part) and W_UV[h]^T [kv_lora_rank, v] (kv_b's value rows)
  std::vector<PackedWeights<T>> w_uk, w_uv;
  std::vector<T> bo;
  std::vector<float> q_norm, kv_norm;
  RopeTable rope;  // over the rope dimensions
};

using AnyMlaStorage = std::variant<MlaStorage<float>, MlaStorage<double>, MlaStorage<bfloat16>, MlaStorage<float16>>;

// The configuration resolved and checked, the weights checked (Error naming them) and packed.
template <class T>
MlaStorage<T> build_mla(const MhaConfig& config, MlaWeights<T>&& weights);

// Self-attention over query [B, S, d_model] into out: options causal (none: the config's),
// key_padding_mask, attn_mask, positions, threads, backend (the attention core's; the
// projections run on the native GEMMs); attention weights are refused (Error("options.attn_weights")).
template <class T>
void mla_forward(const MlaStorage<T>& layer, const ConstSeqView& query, const SeqView& out, const MhaOptions& opt);

// A cached step (query [cache.batch, T, d_model]) in the absorbed form over the latent cache
// (mla_cached.cpp): the new tokens' latent rows appended, every head over them, the lengths
// advanced last. Error naming "query", "out", "cache" (capacity; an 8-bit cache's non-finite row)
// or the option, before anything changes.
// The cached step's checks (query, out, options, positions, room in the cache), changing nothing.
template <class T>
void mla_check_cached_step(const MlaStorage<T>& layer, const ConstSeqView& query, const CacheState& cache, const SeqView& out,
                           const MhaOptions& opt, std::span<const std::int64_t> positions);

template <class T>
void mla_cached_forward(const MlaStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                        const MhaOptions& opt);

// A pool batch (MultiHeadAttention::forward_pool's contract) in the absorbed form over a pool of
// latent rows: every step checked and the blocks counted first (Error naming "steps[i].<argument>",
// "pool", "layer" or the option, nothing changed), the new latent rows appended, every head over
// each sequence's rows (tree masks and the cascade as for any pool), the lengths advanced last.
// forward_pool's checks of the call (the pool a latent pool of this layer's widths, the options)
// and of one step (query, out, positions, tree mask), as check_step(PoolStep) runs them.
template <class T>
void mla_check_pool_call(const MlaStorage<T>& layer, const PoolState& pool, const MhaOptions& opt);
template <class T>
void mla_check_pool_step(const MlaStorage<T>& layer, const PoolStep& step);

template <class T>
void mla_pool_forward(const MlaStorage<T>& layer, std::span<const PoolStep> steps, PoolState& pool, std::int64_t layer_index,
                      const MhaOptions& opt);

}  // namespace simdattn::detail
