// The KV cache as the layer reads and writes it: its state (the public KvCache's, simdattn/mha.hpp,
// defined in kv_cache.cpp), a step's checks against it, and its storage as a dense key store
// (kv_store.hpp: sequence b's keys in its one block b), which the forwards append to and attend
// over as they do a pool's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "layer/cache/kv_store.hpp"
#include "layer/storage.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

struct CacheState {
  DType dtype = DType::f32;
  std::int64_t batch = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  // An MLA layer's latent cache: one "kv head" of latent rows [kv_lora_rank | rope] (head_dim),
  // V their first v_dim = kv_lora_rank columns (v and v_scale empty); otherwise v_dim = head_dim.
  bool latent = false;
  std::int64_t v_dim = 0;
  std::vector<std::int64_t> lengths;  // per sequence
  std::vector<std::int64_t> next;     // during a step: each sequence's length after it
  std::vector<std::byte> k, v;        // [B, Hkv, capacity, head_dim]
  std::vector<float> k_scale, v_scale;  // 8-bit caches: [B, Hkv, capacity]
};

struct CacheAccess {
  static CacheState& state(KvCache& c) { return *c.state_; }
  static const CacheState& state(const KvCache& c) { return *c.state_; }
};

// The cache of a step, checked against the layer (Error("cache") for another layer's cache).
CacheState& cache_of_layer(const MhaConfig& c, KvCache& cache);

// A cached step's checks (forward with a cache, and each step of forward_batch): query, out,
// positions and options against the layer and the cache (check_step_rows, check_cached_options),
// and room for the tokens. Sets cache.next to each sequence's length after the step; changes
// nothing else.
template <class T>
void check_cached_step(const LayerStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                       const MhaOptions& opt, std::span<const std::int64_t> positions);

// The cache as a dense key store, and a step's sequences over it (B of them, `tokens` each, rows
// b * tokens on from row0), appended to seqs.
KvStore cache_store(CacheState& cache);
void cache_seqs(const CacheState& cache, std::int64_t tokens, std::int64_t row0, std::vector<StoreSeq>& seqs);

}  // namespace simdattn::detail
