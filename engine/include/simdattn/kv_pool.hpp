// A paged KV cache shared by many sequences (docs/serving.md, "The KV pool").
//
// The pool holds the keys and values of `layers` attention layers in `num_blocks` blocks of
// `block_size` tokens each, allocated once. A sequence is a handle with a list of blocks (its
// block table): token t of the sequence lies in its block t / block_size, slot t % block_size, in
// every layer. A block holds, per layer, K then V, each [kv_heads, block_size, head_dim] (each kv
// head's rows of the block are one contiguous run, the rows a decode step streams; keys(layer)
// and values(layer) view them as attention_paged() reads caches, [num_blocks, block_size,
// kv_heads, head_dim] with these strides).
//
// Sequences grow through MultiHeadAttention::forward_pool (which appends the K/V of the step's
// tokens at layer `layer` and attends over them), one block at a time as they need them. fork()
// makes a sequence that shares every block of its parent: blocks are reference-counted, and a
// sequence about to write into a block it shares (the partly filled last block after a fork, or
// any block after truncate) first copies that block to a free one (copy-on-write), so a write
// to one sequence never changes another. release() returns a sequence's blocks whose count drops
// to zero. Every call that needs blocks checks that enough are free before anything changes:
// running out is Error("pool", ...).
//
// A pool belongs to one caller at a time (a DecodeScheduler serializes its own).
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <memory>
#include <span>

#include "simdattn/tensor.hpp"

namespace simdattn {

class MultiHeadAttention;
namespace detail {
struct PoolAccess;
}

// The default block size: 64 tokens, the smallest block at which a decode step over blocks is
// within 10% of the contiguous decode path in f32 and bf16 (attention/native/paged-decode-bs<N>,
// the decode workload, 32 heads x 4096 keys, d 128, against attention/native/decode, measured on
// the AMX Xeon: 16 tokens 1.39x / 1.62x, 32 1.03x / 1.12x, 64 0.99x / 1.03x, 128 0.93x / 0.89x):
// every block is a jump to another place, and each kv head's run of 64 keys (16 KiB in bf16) is
// long enough for the run to stream. It is four 16-key AMX tiles. The unused tail of a
// sequence's last block averages 32 tokens (1.6% of a 2000-token sequence).
inline constexpr std::int64_t kDefaultBlockSize = 64;

class SIMDATTN_API KvPool {
 public:
  using Sequence = std::int64_t;

  // A pool for layers of `layer`'s kv_heads and head_dim, in the layer's dtype (f32, bf16 or
  // f16) or `dtype` (also the 8-bit int8, fp8_e4m3 and fp8_e5m2: each row quantized as it is
  // appended, attention.hpp's formats; a block then holds after its codes, per layer, K's then V's
  // f32 scales [kv_heads, block_size], from a 64-byte boundary; a step whose K or V rows hold a NaN
  // or an infinity is Error("steps[i]") naming the sequence and token, the pool unchanged).
  // Throws Error naming the argument: num_blocks and block_size >= 1, layers >= 1, a dtype above,
  // and a size that fits in memory (std::bad_alloc otherwise).
  KvPool(const MultiHeadAttention& layer, std::int64_t num_blocks, std::int64_t block_size = kDefaultBlockSize,
         std::int64_t layers = 1);
  KvPool(const MultiHeadAttention& layer, std::int64_t num_blocks, std::int64_t block_size, std::int64_t layers,
         DType dtype);
  KvPool(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t num_blocks, std::int64_t block_size,
         std::int64_t layers, DType dtype);
  ~KvPool();
  KvPool(KvPool&&) noexcept;
  KvPool& operator=(KvPool&&) noexcept;

  // A new, empty sequence.
  Sequence add();
  // A new sequence holding every token of `parent` (sharing its blocks).
  Sequence fork(Sequence parent);
  // Keeps the first `length` tokens of every layer (0 <= length <= length(s)); blocks past them
  // are given back.
  void truncate(Sequence s, std::int64_t length);
  // Speculative decoding's accepted drafts: of s's tokens at positions first .. length(s) - 1
  // (the drafts a verification step appended), keeps those at relative indices `kept` (strictly
  // increasing, each in [0, length(s) - first)), moved to positions first, first + 1, .. in that
  // order, in every layer (K, V and an 8-bit pool's scales; a layer holding fewer tokens keeps
  // those of its tokens that are kept); the length becomes first + kept.size(). Blocks past the
  // new length go back to the pool; a block shared with a fork is copied before a row of it
  // changes (Error("pool") when too few are free). Error naming "seq", "first" or "kept" (or
  // "pool") before anything changes.
  void accept(Sequence seq, std::int64_t first, std::span<const std::int64_t> kept);
  // Ends the sequence; its handle is invalid afterwards (and may be reused by add or fork).
  void release(Sequence s);

  // The tokens sequence s holds in layer `layer` (its layers grow one forward_pool at a time),
  // and in its longest layer.
  std::int64_t length(Sequence s, std::int64_t layer) const;
  std::int64_t length(Sequence s) const;
  // s's blocks, in token order (valid until the next call that changes the pool).
  std::span<const std::int32_t> block_table(Sequence s) const;
  // The free blocks appending `tokens` tokens to s at `layer` would take: new blocks past its
  // table and copies of the shared blocks it would write into.
  std::int64_t blocks_needed(Sequence s, std::int64_t tokens, std::int64_t layer = 0) const;
  bool contains(Sequence s) const noexcept;
  std::int64_t sequences() const noexcept;  // live sequences

  std::int64_t num_blocks() const noexcept;
  std::int64_t free_blocks() const noexcept;
  std::int64_t block_size() const noexcept;
  std::int64_t layers() const noexcept;
  std::int64_t kv_heads() const noexcept;
  std::int64_t head_dim() const noexcept;
  DType dtype() const noexcept;
  std::int64_t bytes() const noexcept;  // the blocks' storage
  // The bytes one token occupies per layer (KvCache::bytes_per_token's count: K and V rows of
  // every kv head, 8-bit row scales included; an MLA layer's pool: its one latent row). A pool
  // made from an MLA layer holds per layer only its latent rows: keys() views them as one kv head
  // of kv_lora_rank + qk_rope_head_dim, values() as their first kv_lora_rank columns.
  std::int64_t bytes_per_token() const noexcept;

  // Layer `layer`'s keys and values as [num_blocks, block_size, kv_heads, head_dim] views
  // (strides {block, head_dim, block_size * head_dim, 1} elements), for attention_paged().
  ConstTensorView keys(std::int64_t layer) const;
  ConstTensorView values(std::int64_t layer) const;
  // 8-bit pools (int8, fp8_e4m3, fp8_e5m2): the rows' f32 scales, [num_blocks, block_size,
  // kv_heads, 1] (attention_paged's k_scale / v_scale); empty views for other dtypes.
  ConstTensorView key_scales(std::int64_t layer) const;
  ConstTensorView value_scales(std::int64_t layer) const;

 private:
  friend struct detail::PoolAccess;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace simdattn
