// The layer's four forwards (simdattn/mha.hpp: self-attention, cross-attention, a cached step,
// a batch of cached steps), each checking its arguments and then running one pipeline
// (forward.cpp):
//   the input projections -> QK-norm and RoPE -> K and V appended to a cache -> the attention
//   core -> the attention weights' mean -> the output projection -> the caches' new lengths
// They differ only in the data they give it: where the queries, keys and values come from, the
// positions, the caches, the attention core's options.
#pragma once

#include <span>

#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_pool.hpp"
#include "layer/storage.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

template <class T>
void self_forward(const LayerStorage<T>& layer, const ConstSeqView& query, const SeqView& out, const MhaOptions& opt);

template <class T>
void cross_forward(const LayerStorage<T>& layer, const ConstSeqView& query, const ConstSeqView& key,
                   const ConstSeqView& value, const SeqView& out, const MhaOptions& opt);

template <class T>
void cached_forward(const LayerStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                    const MhaOptions& opt);

// Every step is checked first (nothing changes if one is bad: Error naming "steps[i].<argument>").
template <class T>
void batched_forward(const LayerStorage<T>& layer, std::span<const DecodeStep> steps, const MhaOptions& opt);

// Steps over a pool: each checked first (Error naming "steps[i].<argument>", or "pool" when too
// few blocks are free), then the blocks taken, then one pipeline.
// A pool call's checks: the pool against the layer, the options (Error naming them); and one
// step's (query, out, positions).
template <class T>
void check_pool_call(const LayerStorage<T>& layer, const PoolState& pool, const MhaOptions& opt);
template <class T>
void check_pool_step(const LayerStorage<T>& layer, const PoolStep& step);

template <class T>
void pool_forward(const LayerStorage<T>& layer, std::span<const PoolStep> steps, PoolState& pool, std::int64_t layer_index,
                  const MhaOptions& opt);

}  // namespace simdattn::detail
