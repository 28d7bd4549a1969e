// The KV cache: the public KvCache, and the layer's access to it (kv_cache.hpp).
#include "layer/cache/kv_cache.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "core/element.hpp"
#include "layer/call_options.hpp"
#include "layer/positions/positions.hpp"
#include "linalg/code8.hpp"
#include "linalg/convert.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn {
namespace detail {

// The layer's access to a cache's storage.
struct CacheAccess {
  static CacheRef ref(KvCache& c) {
    return {c.dtype_, c.k_, c.v_, c.lengths_, c.next_lengths_, c.capacity_, c.k_scale_, c.v_scale_};
  }
  static std::int64_t kv_heads(const KvCache& c) { return c.kv_heads_; }
  static std::int64_t head_dim(const KvCache& c) { return c.head_dim_; }
};

CacheRef cache_ref(const MhaConfig& c, KvCache& cache) {
  const std::int64_t kv_heads = CacheAccess::kv_heads(cache), head_dim = CacheAccess::head_dim(cache);
  if (kv_heads != c.kv_heads || head_dim != c.head_dim)
    throw Error("cache", "was made for another layer (kv_heads " + std::to_string(kv_heads) + ", head_dim " +
                             std::to_string(head_dim) + "; this layer has " + std::to_string(c.kv_heads) + " and " +
                             std::to_string(c.head_dim) + ")");
  return CacheAccess::ref(cache);
}

template <class T>
void check_cached_step(const LayerStorage<T>& layer, const ConstSeqView& query, const CacheRef& cache, const SeqView& out,
                       const MhaOptions& opt, std::span<const std::int64_t> positions) {
  const MhaConfig& c = layer.cfg;
  if (!layer.fused_qkv)
    throw Error("cache", "incremental decoding is self-attention: it needs kdim == vdim == d_model");
  check_seq("query", query, dtype_of<T>(), static_cast<std::int64_t>(cache.lengths.size()), c.d_model);
  check_rows("query", query, std::max({c.d_model, layer.n_in, layer.nq}), sizeof(T));
  const std::int64_t B = query.B, tokens = query.S;
  check_out(out, dtype_of<T>(), B, tokens, c.d_model);
  if (opt.causal == Causal::top_left)
    throw Error("options.causal", "incremental decoding attends with bottom-right alignment; top-left is not "
                                  "meaningful over a cache (use none or bottom_right)");
  if (!opt.key_padding_mask.empty() || opt.attn_mask.data != nullptr)
    throw Error("options", "masks are not supported with a KV cache (truncate the cache instead)");
  if (c.rope || !c.q_norm.empty()) check_positions(positions, B, tokens);
  for (std::int64_t b = 0; b < B; ++b) {
    if (tokens > cache.capacity - cache.lengths[b])
      throw Error("cache", "sequence " + std::to_string(b) + " holds " + std::to_string(cache.lengths[b]) +
                               " tokens; " + std::to_string(tokens) + " more exceed the capacity " +
                               std::to_string(cache.capacity));
    cache.next[b] = cache.lengths[b] + tokens;
  }
}

template <class T>
void append_kv(const LayerStorage<T>& layer, const T* p, std::int64_t N, std::int64_t B, std::int64_t tokens, const CacheRef& cache) {
  const std::int64_t Hkv = layer.cfg.kv_heads, hd = layer.cfg.head_dim, capacity = cache.capacity;
  const DType cd = cache.dtype;
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(cd));
  if (is_kv_code(cd)) {
    float* row = thread_buffer<float, scratch::MhaCacheQ>().get(static_cast<std::size_t>(hd));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t hk = 0; hk < Hkv; ++hk)
        for (std::int64_t t = 0; t < tokens; ++t) {
          const T* src = p + (b * tokens + t) * N + hk * hd;
          const std::int64_t r = (b * Hkv + hk) * capacity + cache.lengths[b] + t;
          for (const auto& [off, codes, scales, what] :
               {std::tuple{layer.k0, &cache.k, &cache.k_scale, "K"}, std::tuple{layer.v0, &cache.v, &cache.v_scale, "V"}}) {
            if (!quantize_row(cd, src + off, dtype_of<T>(), hd, row, reinterpret_cast<std::uint8_t*>(codes->data()) + r * hd,
                              scales->data() + r))
              throw Error("cache", "sequence " + std::to_string(b) + ", token " + std::to_string(cache.lengths[b] + t) +
                                       ": its " + what + " row of kv head " + std::to_string(hk) +
                                       " holds a NaN or an infinity, which a " + std::string(dtype_name(cd)) +
                                       " cache cannot represent (the cache is unchanged)");
          }
        }
    return;
  }
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hk = 0; hk < Hkv; ++hk)
      for (std::int64_t t = 0; t < tokens; ++t) {
        const T* src = p + (b * tokens + t) * N + hk * hd;
        const std::int64_t row = ((b * Hkv + hk) * capacity + cache.lengths[b] + t) * hd * esize;
        convert_elements(src + layer.k0, dtype_of<T>(), cache.k.data() + row, cd, hd);
        convert_elements(src + layer.v0, dtype_of<T>(), cache.v.data() + row, cd, hd);
      }
}

template <class T>
void cached_attention(const LayerStorage<T>& layer, const T* p, std::int64_t N, std::int64_t B, std::int64_t tokens,
                      const CacheRef& cache, T* o, AttentionOptions a) {
  const std::int64_t H = layer.cfg.heads, Hkv = layer.cfg.kv_heads, hd = layer.cfg.head_dim, capacity = cache.capacity;
  const DType cd = cache.dtype;
  a.causal = Causal::bottom_right;
  a.key_lengths = cache.next;
  // K/V views span the whole capacity (key lengths say how much is filled), so the attention
  // kernels size their scratch by the capacity once and decode steps allocate nothing.
  const Shape4 kvs{Hkv * capacity * hd, capacity * hd, hd, 1};
  const ConstTensorView kc(cache.k.data(), cd, {B, Hkv, capacity, hd}, kvs);
  const ConstTensorView vc(cache.v.data(), cd, {B, Hkv, capacity, hd}, kvs);
  const DType core = core_dtype(cd, dtype_of<T>());
  if (is_kv_code(cd)) {
    a.k_scale = ConstTensorView(cache.k_scale.data(), DType::f32, {B, Hkv, capacity, 1}, {Hkv * capacity, capacity, 1, 1});
    a.v_scale = ConstTensorView(cache.v_scale.data(), DType::f32, {B, Hkv, capacity, 1}, {Hkv * capacity, capacity, 1, 1});
  }
  if (core == dtype_of<T>()) {
    attention(ConstTensorView(p, {B, H, tokens, hd}, {tokens * N, hd, N, 1}), kc, vc,
              TensorView(o, {B, H, tokens, hd}, {tokens * layer.nq, hd, layer.nq, 1}), a);
    return;
  }
  // A cache of another dtype: the core runs in the cache's, q converted to it (rounded to
  // nearest even if narrower, as llama.cpp rounds q for its f16 cache) and the output back.
  const std::int64_t M = B * tokens, n = M * layer.nq, esize = static_cast<std::int64_t>(dtype_size(core));
  std::byte* qc = thread_buffer<std::byte, scratch::MhaCacheQ>().get(static_cast<std::size_t>(n * esize));
  std::byte* oc = thread_buffer<std::byte, scratch::MhaCacheOut>().get(static_cast<std::size_t>(n * esize));
  for (std::int64_t m = 0; m < M; ++m) convert_elements(p + m * N, dtype_of<T>(), qc + m * layer.nq * esize, core, layer.nq);
  const Shape4 dense{tokens * layer.nq, hd, layer.nq, 1};
  attention(ConstTensorView(qc, core, {B, H, tokens, hd}, dense), kc, vc, TensorView(oc, core, {B, H, tokens, hd}, dense), a);
  convert_elements(oc, core, o, dtype_of<T>(), n);
}

#define SIMDATTN_CACHE(T)                                                                                      \
  template void check_cached_step<T>(const LayerStorage<T>&, const ConstSeqView&, const CacheRef&, const SeqView&,   \
                                     const MhaOptions&, std::span<const std::int64_t>);                            \
  template void append_kv<T>(const LayerStorage<T>&, const T*, std::int64_t, std::int64_t, std::int64_t,             \
                             const CacheRef&);                                                                     \
  template void cached_attention<T>(const LayerStorage<T>&, const T*, std::int64_t, std::int64_t, std::int64_t,      \
                                    const CacheRef&, T*, AttentionOptions);
SIMDATTN_CACHE(float)
SIMDATTN_CACHE(double)
SIMDATTN_CACHE(bfloat16)
SIMDATTN_CACHE(float16)
#undef SIMDATTN_CACHE

}  // namespace detail

KvCache::KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity)
    : KvCache(layer, batch, capacity, layer.dtype()) {}

KvCache::KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity, DType dtype)
    : dtype_(dtype),
      batch_(batch),
      kv_heads_(layer.config().kv_heads),
      head_dim_(layer.config().head_dim),
      capacity_(capacity) {
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16 && !is_kv_code(dtype))
    throw Error("dtype", "expected f32, f64, bf16, f16, int8, fp8_e4m3 or fp8_e5m2, got " + std::string(dtype_name(dtype)));
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
  if (is_kv_code(dtype)) {
    k_scale_.assign(static_cast<std::size_t>(batch * kv_heads_ * capacity), 0.0f);
    v_scale_.assign(k_scale_.size(), 0.0f);
  }
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
ConstTensorView KvCache::key_scales() const noexcept {
  if (k_scale_.empty()) return {};
  return ConstTensorView(k_scale_.data(), DType::f32, {batch_, kv_heads_, capacity_, 1});
}
ConstTensorView KvCache::value_scales() const noexcept {
  if (v_scale_.empty()) return {};
  return ConstTensorView(v_scale_.data(), DType::f32, {batch_, kv_heads_, capacity_, 1});
}

}  // namespace simdattn
