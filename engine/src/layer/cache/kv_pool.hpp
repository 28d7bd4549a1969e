// The KV pool as the layer reads and writes it (the public KvPool: simdattn/kv_pool.hpp, defined
// in kv_pool.cpp): its blocks and sequences, the checks and block allocation of a batch of
// writes, and a layer of it as a paged key store (kv_store.hpp), which the forwards append to and
// attend over as they do a KvCache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "layer/cache/kv_store.hpp"
#include "layer/storage.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/kv_pool.hpp"

namespace simdattn::detail {

struct PoolState {
  DType dtype = DType::f32;
  std::int64_t num_blocks = 0, block_size = 0, layers = 0, kv_heads = 0, head_dim = 0;
  // An MLA layer's pool: per layer one part, the latent rows (V their first v_dim columns);
  // otherwise two, K and V (v_dim = head_dim).
  bool latent = false;
  std::int64_t v_dim = 0;
  int parts() const { return latent ? 1 : 2; }
  // Elements of one block: per layer K then V (a latent pool: its rows), each [kv_heads,
  // block_size, head_dim]. 8-bit pools then hold the rows' f32 scales, per layer K then V, each
  // [kv_heads, block_size], from byte scale_offset of the block (block_elems rounded up to 64
  // bytes).
  std::int64_t block_elems = 0;
  std::int64_t block_bytes = 0, scale_offset = 0;
  // The blocks, on transparent huge pages: a decode step reads a kv head's rows of one block, then
  // of another anywhere in the pool, and on 4 KiB pages each such run costs TLB misses that the
  // caches do not hide (attention/native/paged-decode took 1.26x the time of contiguous decode,
  // 1.04x on huge pages).
  AlignedBuffer<std::byte, true> data;
  std::size_t bytes = 0;
  std::vector<std::int32_t> refs;         // per block: the sequences holding it
  std::vector<std::int32_t> free_blocks;  // a stack: the next block to hand out is at the back
  struct Sequence {
    bool live = false;
    std::vector<std::int32_t> blocks;
    std::vector<std::int64_t> lengths;  // per layer
  };
  std::vector<Sequence> sequences;
  std::vector<KvPool::Sequence> free_handles;

  std::size_t esize() const { return dtype_size(dtype); }
  // Element offset of (layer, K or V, kv head hk, slot) in a block (a latent pool's V: its K).
  std::int64_t offset(std::int64_t layer, int kv, std::int64_t hk, std::int64_t slot) const {
    return ((layer * parts() + (latent ? 0 : kv)) * kv_heads + hk) * block_size * head_dim + slot * head_dim;
  }
  std::byte* row(std::int32_t block, std::int64_t layer, int kv, std::int64_t hk, std::int64_t slot) {
    return data.data + static_cast<std::size_t>(block * block_bytes) + static_cast<std::size_t>(offset(layer, kv, hk, slot)) * esize();
  }
  // 8-bit pools: the scale of a row.
  float* scale(std::int32_t block, std::int64_t layer, int kv, std::int64_t hk, std::int64_t slot) {
    return reinterpret_cast<float*>(data.data + static_cast<std::size_t>(block * block_bytes + scale_offset)) +
           ((layer * parts() + (latent ? 0 : kv)) * kv_heads + hk) * block_size + slot;
  }
  ConstTensorView view(std::int64_t layer, int kv) const;
  // 8-bit pools: the scales of layer's K (kv 0) or V rows, [num_blocks, block_size, kv_heads, 1].
  ConstTensorView scale_view(std::int64_t layer, int kv) const;
  // The live sequence s, or Error(argument) naming it.
  Sequence& at(KvPool::Sequence s, const char* argument);
  const Sequence& at(KvPool::Sequence s, const char* argument) const;
};

struct PoolAccess {
  static PoolState& state(KvPool& pool);
  static const PoolState& state(const KvPool& pool);
};

// One step's write into the pool: `tokens` new tokens of sequence `seq` at layer `layer`,
// starting at that layer's length.
struct PoolWrite {
  KvPool::Sequence seq = -1;
  std::int64_t layer = 0, start = 0, tokens = 0;
};

// Checks a batch of writes (each sequence live and in the batch once: Error naming
// "steps[i].sequence"), sets each write's start, and counts the blocks they take: new blocks
// past the sequences' tables and copies of shared blocks they write into. Throws Error("pool")
// if fewer are free. Changes nothing.
void check_pool_writes(const PoolState& pool, std::span<PoolWrite> writes);
// Gives each write the blocks it needs (new ones, and private copies of shared blocks it writes
// into). After check_pool_writes; never throws.
void prepare_pool_writes(PoolState& pool, std::span<const PoolWrite> writes);
// Every write's layer length advanced past its tokens.
void commit_pool_writes(PoolState& pool, std::span<const PoolWrite> writes);

// Layer `layer` of the pool as a paged key store (kv_store.hpp), and the writes' sequences over it
// (their tables hold the blocks the writes take once prepare_pool_writes has run), each write's
// rows following the one before's from row 0, appended to seqs.
KvStore pool_store(PoolState& pool, std::int64_t layer);
void pool_seqs(const PoolState& pool, std::span<const PoolWrite> writes, std::vector<StoreSeq>& seqs);

}  // namespace simdattn::detail
