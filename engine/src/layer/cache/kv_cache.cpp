// The KV cache: the public KvCache, and the layer's access to it (kv_cache.hpp).
#include "layer/cache/kv_cache.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <memory>
#include <optional>

#include "core/text.hpp"
#include "simdattn/error.hpp"

namespace simdattn {
namespace detail {

CacheState& cache_of_layer(const MhaConfig& c, KvCache& cache) {
  CacheState& s = CacheAccess::state(cache);
  if (c.mla) {
    const std::int64_t width = c.mla->kv_lora_rank + c.mla->qk_rope_head_dim;
    if (!s.latent || s.head_dim != width || s.v_dim != c.mla->kv_lora_rank)
      throw Error("cache", "was not made for this MLA layer (its latent rows are kv_lora_rank " + num(c.mla->kv_lora_rank) +
                               " + qk_rope_head_dim " + num(c.mla->qk_rope_head_dim) + " wide)");
    return s;
  }
  if (s.latent) throw Error("cache", "holds an MLA layer's latent rows, not this layer's keys and values");
  if (s.kv_heads != c.kv_heads || s.head_dim != c.head_dim)
    throw Error("cache", "was made for another layer (kv_heads " + num(s.kv_heads) + ", head_dim " + num(s.head_dim) +
                             "; this layer has " + num(c.kv_heads) + " and " + num(c.head_dim) + ")");
  return s;
}

template <class T>
void check_cached_step(const LayerStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                       const MhaOptions& opt, std::span<const std::int64_t> positions) {
  if (!layer.fused_qkv)
    throw Error("cache", "incremental decoding is self-attention: it needs kdim == vdim == d_model");
  check_step_rows(layer, query, out, positions, cache.batch);
  check_cached_options(opt, "a KvCache");
  const std::int64_t tokens = query.S;
  for (std::int64_t b = 0; b < cache.batch; ++b) {
    const std::int64_t L = cache.lengths[static_cast<std::size_t>(b)];
    if (tokens > cache.capacity - L)
      throw Error("cache", "sequence " + num(b) + " holds " + num(L) + " tokens; " + num(tokens) +
                               " more exceed the capacity " + num(cache.capacity));
    cache.next[static_cast<std::size_t>(b)] = L + tokens;
  }
}

KvStore cache_store(CacheState& c) {
  KvStore s;
  s.dtype = c.dtype;
  s.kv_heads = c.kv_heads, s.head_dim = c.head_dim, s.block_size = c.capacity, s.blocks = c.batch;
  s.v_dim = c.v_dim;
  s.k = c.k.data(), s.v = c.latent ? c.k.data() : c.v.data();
  s.block_stride = c.kv_heads * c.capacity * c.head_dim;
  if (is_kv_code(c.dtype)) {
    s.k_scale = c.k_scale.data(), s.v_scale = c.latent ? c.k_scale.data() : c.v_scale.data();
    s.scale_stride = c.kv_heads * c.capacity;
  }
  return s;
}

void cache_seqs(const CacheState& c, std::int64_t tokens, std::int64_t row0, std::vector<StoreSeq>& seqs) {
  for (std::int64_t b = 0; b < c.batch; ++b)
    seqs.push_back({b, nullptr, c.lengths[static_cast<std::size_t>(b)], tokens, row0 + b * tokens});
}

#define SIMDATTN_CACHE(T)                                                                                      \
  template void check_cached_step<T>(const LayerStorage<T>&, const ConstSeqView&, CacheState&, const SeqView&,   \
                                     const MhaOptions&, std::span<const std::int64_t>);
SIMDATTN_CACHE(float)
SIMDATTN_CACHE(double)
SIMDATTN_CACHE(bfloat16)
SIMDATTN_CACHE(float16)
#undef SIMDATTN_CACHE

}  // namespace detail

KvCache::KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity)
    : KvCache(layer, batch, capacity, layer.dtype()) {}

KvCache::KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity, DType dtype)
    : state_(std::make_unique<detail::CacheState>()) {
  using detail::num;
  detail::CacheState& s = *state_;
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16 && !is_kv_code(dtype))
    throw Error("dtype", "expected f32, f64, bf16, f16, int8, fp8_e4m3 or fp8_e5m2, got " + std::string(dtype_name(dtype)));
  if (batch < 1) throw Error("batch", "expected >= 1, got " + num(batch));
  if (capacity < 1) throw Error("capacity", "expected >= 1, got " + num(capacity));
  s.dtype = dtype, s.batch = batch, s.capacity = capacity;
  s.kv_heads = layer.config().kv_heads, s.head_dim = s.v_dim = layer.config().head_dim;
  if (const std::optional<MlaConfig>& m = layer.config().mla) {  // the latent rows: one head, V its first columns
    s.latent = true;
    s.kv_heads = 1, s.head_dim = m->kv_lora_rank + m->qk_rope_head_dim, s.v_dim = m->kv_lora_rank;
  }
  std::int64_t elems = 0, bytes64 = 0;
  if (__builtin_mul_overflow(batch, s.kv_heads, &elems) || __builtin_mul_overflow(elems, capacity, &elems) ||
      __builtin_mul_overflow(elems, s.head_dim, &elems) ||
      __builtin_mul_overflow(elems, static_cast<std::int64_t>(dtype_size(dtype)), &bytes64))
    throw Error("capacity", "batch " + num(batch) + " x kv_heads " + num(s.kv_heads) + " x capacity " + num(capacity) +
                                " x head_dim " + num(s.head_dim) + " overflows the size of a cache");
  const auto bytes = static_cast<std::size_t>(bytes64);
  s.lengths.assign(static_cast<std::size_t>(batch), 0);
  s.next.assign(static_cast<std::size_t>(batch), 0);
  s.k.resize(bytes);
  if (!s.latent) s.v.resize(bytes);
  if (is_kv_code(dtype)) {
    s.k_scale.assign(static_cast<std::size_t>(batch * s.kv_heads * capacity), 0.0f);
    if (!s.latent) s.v_scale.assign(s.k_scale.size(), 0.0f);
  }
}

KvCache::~KvCache() = default;
KvCache::KvCache(const KvCache& other) : state_(std::make_unique<detail::CacheState>(*other.state_)) {}
KvCache& KvCache::operator=(const KvCache& other) {
  if (this != &other) state_ = std::make_unique<detail::CacheState>(*other.state_);
  return *this;
}
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

std::int64_t KvCache::batch() const noexcept { return state_->batch; }
std::int64_t KvCache::capacity() const noexcept { return state_->capacity; }
std::span<const std::int64_t> KvCache::lengths() const noexcept { return state_->lengths; }
DType KvCache::dtype() const noexcept { return state_->dtype; }

void KvCache::reset() noexcept { std::fill(state_->lengths.begin(), state_->lengths.end(), 0); }

void KvCache::truncate(std::int64_t sequence, std::int64_t length) {
  detail::CacheState& s = *state_;
  if (sequence < 0 || sequence >= s.batch)
    throw Error("sequence", "expected 0 <= sequence < " + std::to_string(s.batch) + ", got " + std::to_string(sequence));
  const std::int64_t cur = s.lengths[static_cast<std::size_t>(sequence)];
  if (length < 0 || length > cur)
    throw Error("length", "expected 0 <= length <= " + std::to_string(cur) + " (the sequence's length), got " +
                              std::to_string(length));
  s.lengths[static_cast<std::size_t>(sequence)] = length;
}

ConstTensorView KvCache::keys() const noexcept {
  const detail::CacheState& s = *state_;
  return ConstTensorView(s.k.data(), s.dtype, {s.batch, s.kv_heads, s.capacity, s.head_dim});
}
ConstTensorView KvCache::values() const noexcept {
  const detail::CacheState& s = *state_;
  if (s.latent)  // the latent rows' first v_dim columns
    return ConstTensorView(s.k.data(), s.dtype, {s.batch, s.kv_heads, s.capacity, s.v_dim},
                           {s.kv_heads * s.capacity * s.head_dim, s.capacity * s.head_dim, s.head_dim, 1});
  return ConstTensorView(s.v.data(), s.dtype, {s.batch, s.kv_heads, s.capacity, s.head_dim});
}
ConstTensorView KvCache::key_scales() const noexcept {
  const detail::CacheState& s = *state_;
  if (s.k_scale.empty()) return {};
  return ConstTensorView(s.k_scale.data(), DType::f32, {s.batch, s.kv_heads, s.capacity, 1});
}
ConstTensorView KvCache::value_scales() const noexcept {
  const detail::CacheState& s = *state_;
  if (s.k_scale.empty()) return {};
  return ConstTensorView(s.latent ? s.k_scale.data() : s.v_scale.data(), DType::f32, {s.batch, s.kv_heads, s.capacity, 1});
}

std::int64_t KvCache::bytes_per_token() const noexcept {
  const detail::CacheState& s = *state_;
  const std::int64_t row = s.head_dim * static_cast<std::int64_t>(dtype_size(s.dtype)) + (is_kv_code(s.dtype) ? 4 : 0);
  return s.kv_heads * row * (s.latent ? 1 : 2);
}

}  // namespace simdattn
