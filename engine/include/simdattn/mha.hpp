// Multi-head attention layer (torch.nn.MultiheadAttention semantics, batch_first) and its KV
// cache for incremental decoding.
//
//   q = x_q Wq^T + bq,  k = x_k Wk^T + bk,  v = x_v Wv^T + bv     (torch's nn.Linear)
//   heads: q [B, Sq, H*hd] read as [B, H, Sq, hd], k/v as [B, Hkv, Sk, hd] (strided views of the
//          projection outputs, never copied); o = attention(q, k, v) written as [B, Sq, H*hd]
//   y = o Wo^T + bo
//
// Weights use torch's layout: W [out_features, in_features], row-major. Wq [H*hd, d_model],
// Wk [Hkv*hd, kdim], Wv [Hkv*hd, vdim], Wo [d_model, H*hd]; every bias is optional.
// Self-attention (kdim == vdim == d_model) runs the three input projections as one GEMM.
//
// Embedding: a layer is immutable after construction and forward() may run concurrently from
// any number of threads. Scratch comes from per-thread buffers that grow on first use, so after
// the first call with a given size forward() allocates nothing on the native and reference
// backends (the onednn backend allocates oneDNN's memory handles per call, and the layer's
// first onednn call keeps a plain copy of its weights for oneDNN's matmuls). A KvCache belongs
// to one caller at a time.
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "simdattn/attention.hpp"
#include "simdattn/kv_pool.hpp"
#include "simdattn/rope.hpp"
#include "simdattn/tensor.hpp"

namespace simdattn {

// DeepSeek's Multi-head Latent Attention (DeepSeek-V2, 2024; transformers' DeepseekV2Attention and
// DeepseekV3Attention), MhaConfig::mla. Per token x, with nope = qk_nope_head_dim, rope =
// qk_rope_head_dim, H = heads:
//   q      = x Wq^T                                        (q_lora_rank 0), or
//          = RMSNorm(x Wq_a^T + bq_a; q_a_norm) Wq_b^T      [H, nope + rope] per token
//   c | kr = x Wkv_a^T + bkv_a                              [kv_lora_rank | rope]
//   k_nope | v = RMSNorm(c; kv_a_norm) Wkv_b^T             per head [nope | v_head_dim]
//   q's last rope values and kr rotated by MhaConfig::rope (rotary_dim 0: rope) at the token's
//   position; every head's key [k_nope | kr] (kr shared by the heads), its value v
//   attention at MhaConfig::scale (default (nope + rope)^-1/2), causal as MhaConfig::causal
//   y = o Wo^T + bo                                        (o [H * v_head_dim])
// RMSNorm(x; w) = x / sqrt(mean(x^2) + norm_eps), in f32 (f64 layers: f64), rounded to the layer's
// dtype, times w. The layer's head_dim is nope + rope and its kv_heads are its heads (0 or these
// values); kdim and vdim are d_model. forward(query, out) runs the expanded form above. A KvCache
// of the layer holds its latent rows [RMSNorm(c) | RoPE(kr)] (kv_lora_rank + rope values a token:
// KvCache::bytes_per_token), and forward(query, cache, out) runs the absorbed form over them:
// each head's query [q_nope W_UK[h] | RoPE(q_rope)] (W_UK[h]: Wkv_b's key rows of head h) over the
// one latent row a key (values: its first kv_lora_rank columns), the output times W_UV[h]^T (its
// value rows), the same products regrouped. A KvPool made from the layer holds the same latent
// rows in its blocks (forks, copy-on-write, accept, 8-bit rows) and forward_pool runs the absorbed
// form over it (tree masks and the cascade included). forward_batch runs each step's cached
// forward in turn (every step checked first). Cross-attention is refused (Error("layer")).
struct MlaConfig {
  std::int64_t q_lora_rank = 0;       // 0: a plain q_proj (Wq)
  std::int64_t kv_lora_rank = 0;      // >= 1
  std::int64_t qk_nope_head_dim = 0;  // >= 0
  std::int64_t qk_rope_head_dim = 0;  // even, >= 2
  std::int64_t v_head_dim = 0;        // >= 1
  double norm_eps = 1e-6;             // the two RMSNorms' (transformers' class default, not rms_norm_eps)
};

struct MhaConfig {
  std::int64_t d_model = 0;   // query input and output width
  std::int64_t heads = 0;     // query heads H
  std::int64_t kv_heads = 0;  // key/value heads Hkv (0: = heads); H % Hkv == 0
  std::int64_t head_dim = 0;  // hd (0: d_model / heads)
  std::int64_t kdim = 0;      // key input width (0: d_model)
  std::int64_t vdim = 0;      // value input width (0: d_model)
  // Positions and scores (simdattn/rope.hpp, simdattn/attention.hpp), self-attention:
  //   q, k = RMSNorm(q), RMSNorm(k) over head_dim with weights q_norm, k_norm (both or neither,
  //          [head_dim] each; qk_norm_eps), in f32 (Qwen3, OLMo-2), then
  //   q, k rotated by `rope` at each token's position (0 .. S-1 in a forward, continuing from the
  //          sequence's cache length in incremental mode, or MhaOptions::positions); the cache
  //          holds K rotated.
  // Cross-attention applies neither. The attention core takes scale (default 1/sqrt(head_dim)),
  // softcap, window, alibi_slopes [heads], sinks [heads] and T5's bias as attention() does.
  // (every member has a default initializer, so designated initializers may leave any out)
  std::optional<RopeConfig> rope = {};
  std::vector<float> q_norm = {}, k_norm = {};
  double qk_norm_eps = 1e-6;
  std::optional<double> scale = {};
  std::optional<double> softcap = {};
  std::optional<Window> window = {};
  std::vector<float> alibi_slopes = {};
  std::vector<float> sinks = {};
  // T5's relative position bias: table [num_buckets, heads] row-major (empty: none), as
  // attention()'s RelativePositionBias (T5 itself gives scale = 1).
  std::vector<float> t5_table = {};
  bool t5_bidirectional = true;
  std::int64_t t5_max_distance = 128;
  // A decoder's self-attention: forward() on a whole sequence attends causally (top-left) when
  // MhaOptions::causal is none; the cached forward is bottom-right as always.
  bool causal = false;
  // Multi-head Latent Attention (MlaConfig above); the layer is then built from MlaWeights.
  std::optional<MlaConfig> mla = {};
  // Qwen3-Next's gated attention output: gate = x Wg^T + bg [heads*head_dim] per query token
  // (MhaWeights::wg, bg), and each head's attention output o multiplied by sigmoid(gate) (in
  // f32, rounded once) before the output projection. Refused with MLA.
  bool output_gate = false;
};

// Which attention sub-layer of a published checkpoint to load (MultiHeadAttention::
// from_pretrained, from_diffusers).
struct PretrainedOptions {
  // T5: "encoder" (the default) or "decoder"; the other families have one stack.
  std::string stack = {};
  // "self" or "cross": T5's decoder and diffusers' transformer blocks have both. Empty (the
  // default): self, or the sub-layer a diffusers prefix names (a last component attn1 or attn2).
  std::string attention = {};
  // The layer's dtype (f32, f64, bf16 or f16); absent: the checkpoint's (its query weight's).
  std::optional<DType> dtype = {};
};

// Weights in torch's layout, f32, f64, bfloat16 or float16 (the layer's dtype). Empty bias = no
// bias. wg, bg: the output gate's [heads*head_dim, d_model] and [heads*head_dim] (config.output_gate
// only; transformers' Qwen3-Next q_proj holds them interleaved with the queries per head, and
// from_pretrained takes them apart).
template <class T>
struct MhaWeights {
  std::vector<T> wq, wk, wv, wo;
  std::vector<T> bq, bk, bv, bo;
  std::vector<T> wg = {}, bg = {};
};

// An MLA layer's weights (MlaConfig), torch's layout [out_features, in_features], in the layer's
// dtype; the RMSNorm weights in f32. Empty bias = no bias (transformers' attention_bias gives
// bq_a, bkv_a and bo).
template <class T>
struct MlaWeights {
  std::vector<T> wq;                 // [H * (nope + rope), d_model]: q_lora_rank 0 only
  std::vector<T> wq_a, bq_a;         // [q_lora_rank, d_model], [q_lora_rank]: q_lora_rank > 0
  std::vector<float> q_a_norm;       // [q_lora_rank]
  std::vector<T> wq_b;               // [H * (nope + rope), q_lora_rank]
  std::vector<T> wkv_a, bkv_a;       // [kv_lora_rank + rope, d_model], [kv_lora_rank + rope]
  std::vector<float> kv_a_norm;      // [kv_lora_rank]
  std::vector<T> wkv_b;              // [H * (nope + v_head_dim), kv_lora_rank]
  std::vector<T> wo, bo;             // [d_model, H * v_head_dim], [d_model]
};

// A batch of sequences [B, S, E], C order (row stride E). Pointer is const void* (ConstSeqView,
// inputs) or void* (SeqView, outputs); a SeqView converts to a ConstSeqView.
template <class Pointer>
struct BasicSeqView {
  Pointer data = nullptr;
  DType dtype = DType::f32;
  std::int64_t B = 0, S = 0, E = 0;

  BasicSeqView() = default;
  template <class T>
    requires std::is_convertible_v<T*, Pointer>
  BasicSeqView(T* d, std::int64_t b, std::int64_t s, std::int64_t e)
      : data(d), dtype(dtype_of<std::remove_const_t<T>>()), B(b), S(s), E(e) {}
  template <class P>
    requires(!std::is_same_v<P, Pointer> && std::is_convertible_v<P, Pointer>)
  BasicSeqView(const BasicSeqView<P>& o)  // NOLINT: SeqView -> ConstSeqView, implicit by design
      : data(o.data), dtype(o.dtype), B(o.B), S(o.S), E(o.E) {}
};
using ConstSeqView = BasicSeqView<const void*>;
using SeqView = BasicSeqView<void*>;

struct MhaOptions {
  Causal causal = Causal::none;
  // [B, Sk], nonzero = padding (that key is ignored), as torch's key_padding_mask. Empty: none.
  std::span<const std::uint8_t> key_padding_mask;
  // Additive float mask (f32, f64, bf16 or f16), broadcastable to [B, H, Sq, Sk] as in
  // attention().
  ConstTensorView attn_mask;
  // Self-attention with rope: each token's position, [B, S] (>= 0; e.g. for left-padded
  // batches). Empty: 0 .. S-1, or continuing from the cache's lengths.
  std::span<const std::int64_t> positions = {};
  // Optional output: the attention weights (torch's need_weights), [B, H, Sq, Sk] per head or
  // [B, 1, Sq, Sk] averaged over the heads (average_attn_weights), f32 or f64; in incremental
  // mode Sk is the cache's capacity (keys past a sequence's length weigh 0). Only this output is
  // Sq x Sk; the layer's output is computed as without it.
  TensorView attn_weights = {};
  int threads = 0;
  Backend backend = Backend::native;
};

class KvCache;
namespace detail {
struct CacheAccess;
struct CacheState;
}

// One request's step in MultiHeadAttention::forward_batch: its new tokens (query
// [cache->batch(), T, d_model]), appended to its cache and attended over it, and its output
// (out, the query's shape), as forward(query, *cache, out) computes them.
struct DecodeStep {
  ConstSeqView query;
  KvCache* cache = nullptr;
  SeqView out;
  std::span<const std::int64_t> positions = {};  // as MhaOptions::positions, this step's
};

// One sequence's step in MultiHeadAttention::forward_pool: its new tokens (query [1, T,
// d_model]: T = 1 a decode step, T > 1 a prompt or a chunk of one), appended to the sequence in
// the pool and attended over all its tokens, and its output (out, the query's shape).
struct PoolStep {
  ConstSeqView query;
  KvPool::Sequence sequence = -1;
  SeqView out;
  std::span<const std::int64_t> positions = {};  // as MhaOptions::positions, [1, T]
  // Speculative decoding: the step's T tokens as a draft tree, [T, T] row-major (nonzero: token j
  // sees token j'), attention_paged's tree mask M_i (paged.hpp): each token sees the sequence's
  // tokens before the step and those its row lists. Empty: causal (each sees those before it and
  // itself). positions then give the tokens' RoPE positions (depth in the tree). A layer with a
  // window or ALiBi takes none (Error("steps[i].tree_mask")).
  std::span<const std::uint8_t> tree_mask = {};
};

class SIMDATTN_API MultiHeadAttention {
 public:
  // Validates the configuration and the weight sizes; throws Error naming the weight.
  MultiHeadAttention(const MhaConfig& config, MhaWeights<float> weights);
  MultiHeadAttention(const MhaConfig& config, MhaWeights<double> weights);
  // bf16/f16 layers keep weights, activations and (by default) the cache in their dtype: each
  // projection sums its products and bias in f32 and rounds to nearest even.
  MultiHeadAttention(const MhaConfig& config, MhaWeights<bfloat16> weights);
  MultiHeadAttention(const MhaConfig& config, MhaWeights<float16> weights);
  // Multi-head Latent Attention (config.mla set): validates the configuration and every weight's
  // size (Error naming it).
  MultiHeadAttention(const MhaConfig& config, MlaWeights<float> weights);
  MultiHeadAttention(const MhaConfig& config, MlaWeights<double> weights);
  MultiHeadAttention(const MhaConfig& config, MlaWeights<bfloat16> weights);
  MultiHeadAttention(const MhaConfig& config, MlaWeights<float16> weights);

  // Loads one layer from a safetensors file (see docs/design.md for the two naming conventions):
  // torch's in_proj_weight / q_proj_weight+k_proj_weight+v_proj_weight, in_proj_bias,
  // out_proj.weight, out_proj.bias; or Hugging Face's q_proj/k_proj/v_proj/o_proj .weight with
  // optional .bias. Names are looked up under `prefix`. d_model, head_dim, kdim and vdim come
  // from the shapes; kv_heads too when given as 0. The layer has `dtype` (f32, f64, bf16 or
  // f16); F32, F64, BF16 and F16 tensors are kept as they are when that is their dtype, else
  // rounded to it once (nearest even).
  static MultiHeadAttention from_safetensors(const std::string& path, std::int64_t heads,
                                             std::int64_t kv_heads = 0, const std::string& prefix = "",
                                             DType dtype = DType::f32);
  // The same with the position and score options of `options` (rope, q_norm, k_norm,
  // qk_norm_eps, scale, softcap, window, alibi_slopes, sinks); its shape fields are ignored.
  static MultiHeadAttention from_safetensors(const std::string& path, std::int64_t heads, std::int64_t kv_heads,
                                             const std::string& prefix, DType dtype, const MhaConfig& options);

  // One attention sub-layer (projections, attention, output projection; no residual, norm or
  // MLP) of a Hugging Face model directory: config.json and model.safetensors, or the shards of
  // model.safetensors.index.json. The family comes from config.json's model_type (bert,
  // roberta, vit, deit, gpt2, t5, bloom, llama, mistral, qwen2, qwen3, gemma2, gpt_oss,
  // deepseek_v2, deepseek_v3: MhaConfig::mla) and every
  // attention parameter from the config, as docs/models.md lists; `layer` counts from 0.
  // Decoder families come back causal (MhaConfig::causal). Throws Error naming the file, the
  // config key or the tensor at fault.
  static MultiHeadAttention from_pretrained(const std::string& dir, std::int64_t layer,
                                            const PretrainedOptions& options = {});
  // A diffusers transformer block's attn1 (self) or attn2 (cross: to_k and to_v of width
  // cross_attention_dim) under `prefix` (e.g. "down_blocks.0.attentions.0.transformer_blocks.0")
  // in a safetensors file: to_q, to_k, to_v without bias, to_out.0 with one. A prefix whose last
  // component is attn1 or attn2 (as the tensor names spell it, "...transformer_blocks.0.attn2")
  // selects that sub-layer; options.attention must then be empty or agree (Error("attention")).
  static MultiHeadAttention from_diffusers(const std::string& path, const std::string& prefix, std::int64_t heads,
                                           const PretrainedOptions& options = {});
  // The dtype the checkpoint stores that layer's weights in (its query weight's: f32, f64, bf16
  // or f16), from the config and the files' headers alone (no weight is read); the errors of
  // from_pretrained / from_diffusers.
  static DType pretrained_dtype(const std::string& dir, std::int64_t layer, const PretrainedOptions& options = {});
  static DType diffusers_dtype(const std::string& path, const std::string& prefix, std::int64_t heads,
                               const PretrainedOptions& options = {});

  // One attention sub-layer of a llama.cpp GGUF file (versions 2 and 3), architecture llama
  // (Mistral converts to it), qwen2 or qwen3: the sizes, RoPE (freq_base, dimension_count,
  // linear scaling, Llama 3.1's rope_freqs factors), sliding window and QK-norm from the
  // metadata, blk.N.attn_{q,k,v,output} (and their biases, attn_{q,k}_norm where present) in
  // F32, F16, BF16 or Q8_0, dequantized once to the layer's dtype; llama's q / k row
  // permutation (llama.cpp's converter's) is undone, so the layer equals from_pretrained's on
  // the model directory the file was converted from (docs/models.md). `dtype`: f32, f64, bf16
  // or f16; absent: the query weight's (f32 for Q8_0). Comes back causal. Throws Error naming
  // the file and the metadata key or tensor at fault (any other tensor type among them).
  static MultiHeadAttention from_gguf(const std::string& path, std::int64_t layer, std::optional<DType> dtype = {});
  // The dtype from_gguf gives that layer by default (its query weight's; f32 for Q8_0), from the
  // metadata and the tensor table alone; from_gguf's errors.
  static DType gguf_dtype(const std::string& path, std::int64_t layer);

  ~MultiHeadAttention();
  MultiHeadAttention(MultiHeadAttention&&) noexcept;
  MultiHeadAttention& operator=(MultiHeadAttention&&) noexcept;

  const MhaConfig& config() const noexcept;  // with every 0 resolved
  DType dtype() const noexcept;

  // Self-attention: query [B, S, d_model] -> out [B, S, d_model]. Needs kdim == vdim == d_model.
  void forward(const ConstSeqView& query, const SeqView& out, const MhaOptions& options = {}) const;

  // Cross-attention: query [B, Sq, d_model], key [B, Sk, kdim], value [B, Sk, vdim].
  void forward(const ConstSeqView& query, const ConstSeqView& key, const ConstSeqView& value,
               const SeqView& out, const MhaOptions& options = {}) const;

  // Incremental self-attention: appends the projected K/V of the T new tokens of every sequence
  // (query [B, T, d_model]) to `cache`, then attends with bottom-right causal alignment over
  // each sequence's cached keys (so T = 1 is a decode step and T > 1 a prefill or chunk).
  // options.causal must be none or bottom_right; masks are not supported here. Throws (leaving
  // the cache as it was) when a sequence would exceed the cache's capacity.
  void forward(const ConstSeqView& query, KvCache& cache, const SeqView& out,
               const MhaOptions& options = {}) const;
  // Incremental steps of many independent requests in one call (continuous batching): the same
  // results as forward(step.query, *step.cache, step.out, options) for each step in turn, but the
  // projections of all the steps' tokens run as one GEMM (the weights read once for all) and the
  // steps' attention cores run side by side, one thread each. Every step has a cache of its own
  // (steps of different lengths and token counts mix freely). options: causal (none or
  // bottom_right), threads, backend; positions are per step; no masks or attention weights.
  // Every step is checked before anything changes: a bad one throws Error naming
  // "steps[i].<argument>" and leaves every cache and output as it was.
  void forward_batch(std::span<const DecodeStep> steps, const MhaOptions& options = {}) const;
  // Checks one step as forward_batch does (the same Error, naming "query", "cache", "out" or
  // "options.positions"), computing nothing: DecodeScheduler sorts out a bad request this way
  // before it joins a batch.
  void check_step(const DecodeStep& step, const MhaOptions& options = {}) const;

  // Steps of many sequences of a pool at layer `layer` of the pool (each sequence once): the
  // projections of all the steps' tokens as one GEMM (the weights read once), each step's K and
  // V appended into its sequence's blocks at that layer (rotated and normalized as in
  // forward(query, cache, out)), the attention of every step in one attention_paged() call
  // (bottom-right causal over the sequence's tokens, balanced over the threads), the output
  // projection as one GEMM. The same results as forward(query, cache, out) step by step, within
  // the rounding of GEMMs of another shape. options: causal (none or bottom_right), threads,
  // backend (native or reference); positions per step; no masks or attention weights. Checked
  // before anything changes: Error naming "steps[i].<argument>", "pool" (another layer's pool,
  // or too few free blocks for the batch's new blocks and copy-on-write copies) or "layer".
  void forward_pool(std::span<const PoolStep> steps, KvPool& pool, std::int64_t layer = 0,
                    const MhaOptions& options = {}) const;
  // Checks one pool step as forward_pool does (Error naming "query", "out", "positions",
  // "sequence", "pool" or an option), computing nothing and changing nothing.
  void check_step(const PoolStep& step, const KvPool& pool, const MhaOptions& options = {}) const;


 private:
  struct Storage;  // the built layer (engine/src/layer/storage.hpp)
  std::unique_ptr<Storage> storage_;
};

// Keys and values of one layer for a batch of sequences, each with its own length.
// Storage: K and V [B, Hkv, capacity, head_dim], so a decode step streams each head's keys
// contiguously. An MLA layer's cache holds its latent rows instead (bytes_per_token below).
class SIMDATTN_API KvCache {
 public:
  // A cache in the layer's dtype, or in a dtype of its own (f32, f64, bf16 or f16; e.g. an f32
  // layer with a bf16 cache, half the bytes a decode step reads). With a dtype of its own the
  // cache holds the layer's K and V rounded to it (nearest even), and the attention core runs in
  // the cache's dtype: q is converted to it, the output back to the layer's.
  // 8-bit caches (int8, fp8_e4m3, fp8_e5m2; a quarter of f32's bytes): each appended K and V row
  // (one kv head of one token) is quantized as it is appended (attention.hpp's formats), codes
  // and one f32 scale per row kept side by side; the attention reads the codes in place with q in
  // the layer's dtype (f64 layers: q rounded to f32). A row with a NaN or an infinity cannot be
  // appended: the step throws Error("cache") naming the sequence and token, the cache unchanged.
  KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity);
  KvCache(const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity, DType dtype);

  ~KvCache();
  KvCache(const KvCache& other);  // copies the keys and values
  KvCache& operator=(const KvCache& other);
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;

  std::int64_t batch() const noexcept;
  std::int64_t capacity() const noexcept;
  std::span<const std::int64_t> lengths() const noexcept;
  DType dtype() const noexcept;

  void reset() noexcept;                                   // every sequence back to length 0
  void truncate(std::int64_t sequence, std::int64_t length);  // keep the first `length` tokens

  // Views of the cached keys/values, [B, Hkv, capacity, head_dim] (rows past lengths() unused).
  ConstTensorView keys() const noexcept;
  ConstTensorView values() const noexcept;
  // 8-bit caches: the rows' scales, [B, Hkv, capacity, 1] f32 (empty views otherwise).
  ConstTensorView key_scales() const noexcept;
  ConstTensorView value_scales() const noexcept;
  // The bytes one token occupies in the cache (per layer): kv_heads x (head_dim K + head_dim V)
  // x the dtype's size, 8-bit caches' f32 row scales included; an MLA layer's latent cache holds
  // one row of kv_lora_rank + qk_rope_head_dim values a token (keys() views it as one kv head;
  // values() is its first kv_lora_rank columns, value_scales() its scales), plus its scale.
  std::int64_t bytes_per_token() const noexcept;

 private:
  friend struct detail::CacheAccess;
  std::unique_ptr<detail::CacheState> state_;  // the storage and lengths (engine/src/layer/cache/kv_cache.hpp)
};

}  // namespace simdattn
