// The KV cache as the layer reads and writes it: a step's checks against the cache, the rotated K
// and V appended past each sequence's length, and the attention core over the cached keys. The
// public KvCache (simdattn/mha.hpp) is defined in kv_cache.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "layer/storage.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// The cache's storage and dtype, as the layer's forwards need them.
struct CacheRef {
  DType dtype;
  std::vector<std::byte>& k;
  std::vector<std::byte>& v;
  std::vector<std::int64_t>& lengths;
  std::vector<std::int64_t>& next;
  std::int64_t capacity;
  std::vector<float>& k_scale;  // 8-bit caches: [B, Hkv, capacity]
  std::vector<float>& v_scale;
};


// The dtype a cache's attention core runs in: the cache's, or for 8-bit codes the layer's (an f64
// layer's: f32, as 8-bit K and V come with f32, bf16 or f16 q).
inline DType core_dtype(DType cache, DType layer) {
  if (!is_kv_code(cache)) return cache;
  return layer == DType::f64 ? DType::f32 : layer;
}

// The cache of a step, checked against the layer.
CacheRef cache_ref(const MhaConfig& c, KvCache& cache);

// A cached step's checks (forward with a cache, and each step of forward_batch): query, out,
// positions and options against the layer and the cache. Sets cache.next to each sequence's
// length after the step; changes nothing else.
template <class T>
void check_cached_step(const LayerStorage<T>& layer, const ConstSeqView& query, const CacheRef& cache, const SeqView& out,
                       const MhaOptions& opt, std::span<const std::int64_t> positions);

// Appends the rotated K and V of a step's projected rows p ([B * tokens] rows, N apart) to the cache:
// rows lengths[b] .. next[b] - 1 of every (b, kv head), converted to the cache's dtype. Rows past
// lengths[] are not part of the cache, so a failure after this leaves the cache as it was. An
// 8-bit cache quantizes each row; a row with a NaN or an infinity throws Error("cache") naming
// the sequence and token.
template <class T>
void append_kv(const LayerStorage<T>& layer, const T* p, std::int64_t N, std::int64_t B, std::int64_t tokens, const CacheRef& cache);

// The attention core of a cached step: q from the projected rows p ([B * tokens] rows, N apart) over
// each sequence's next[b] cached keys, bottom-right aligned, into o ([B * tokens] rows of nq).
template <class T>
void cached_attention(const LayerStorage<T>& layer, const T* p, std::int64_t N, std::int64_t B, std::int64_t tokens,
                      const CacheRef& cache, T* o, AttentionOptions a);

}  // namespace simdattn::detail
