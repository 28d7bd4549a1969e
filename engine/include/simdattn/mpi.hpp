// Attention over one sequence split across processes (context parallelism) on MPI: the optional
// component simdattn::mpi (library simdattn_mpi, built when CMake finds MPI; docs/distributed.md).
//
// Every function here is collective over the communicator it is given: each rank of it calls
// the same function with the same shared arguments (shapes, options) and its own shard.
//   sharded_attention  each rank holds a shard of K/V and all the queries; partials merge by
//                      log-sum-exp in rank order, so every rank gets the same output
//   ring_attention     queries, keys and values all sharded (self-attention, typically causal):
//                      K/V shards travel the ring while each rank computes on the one it holds
//   ShardedKvCache     one long sequence's K/V cache spread over the ranks, decoded step by step
//
// Errors: every rank checks its arguments, then the ranks agree on validity before any data
// moves; an argument that is bad on one rank is the same Error on every rank (the lowest failing
// rank's), never a hang. An MPI call that fails throws Error naming the call (the communicator's
// error handler is MPI_ERRORS_RETURN for the call's duration).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/export.hpp"

namespace simdattn::mpi {

// Consecutive positions [start, start + length) of the sequence.
struct TokenRange {
  std::int64_t start = 0;
  std::int64_t length = 0;
  bool operator==(const TokenRange&) const = default;
};

// How a sequence of `total` tokens is dealt to `ranks` ranks.
//   contiguous  rank r holds part r of `ranks` near-equal parts (the first total % ranks parts
//               one token longer)
//   zigzag      the sequence is cut in 2 * ranks near-equal chunks; rank r holds chunks r and
//               2 * ranks - 1 - r, so every rank gets the same share of a causal triangle
enum class ShardOrder : std::uint8_t { contiguous, zigzag };

// The ranges rank `rank` holds, in position order (empty ranges left out). Throws Error on
// total < 0, ranks < 1 or rank outside [0, ranks).
SIMDATTN_API std::vector<TokenRange> shard_ranges(std::int64_t total, int ranks, int rank, ShardOrder order);
// The number of tokens rank `rank` holds (the sum of its ranges' lengths).
SIMDATTN_API std::int64_t shard_length(std::int64_t total, int ranks, int rank, ShardOrder order);

// "contiguous", "zigzag".
SIMDATTN_API std::string_view shard_order_name(ShardOrder order) noexcept;

struct ShardOptions {
  // The number of keys of the whole sequence (Sk of the unsharded call). Required (>= 0).
  std::int64_t total_keys = -1;
  // The positions of this rank's keys: k's and v's key axis holds these ranges one after the
  // other (their lengths sum to k's Sk). Over all ranks they cover [0, total_keys) exactly once.
  std::span<const TokenRange> key_ranges = {};
  // -1: every rank receives the output (and lse); r >= 0: only rank r does (the other ranks'
  // out and lse may be empty views and are not written).
  int root = -1;
};

// Attention of the same queries over keys and values sharded across the ranks of `comm`, equal
// to attention(q, k_all, v_all, out, options) on the unsharded K/V within the dtype's rounding.
//   q    [B, H, Sq, D]    the same on every rank
//   k    [B, Hkv, n, D]   this rank's keys: the positions of shard.key_ranges (n may be 0)
//   v    [B, Hkv, n, Dv]
//   out  [B, H, Sq, Dv]   the whole output, on every rank (or on shard.root)
// `options` describes the unsharded call: key_lengths, query_offsets and the causal alignment
// are about the whole sequence (bottom_right aligns the queries with total_keys or L[b]), and
// positions (causal, window, ALiBi, T5's bias) are the keys' absolute positions. Per-key inputs
// are this rank's columns: mask [.., Sq, n] (or a key axis of 1), k_scale and v_scale
// [B, Hkv, n, 1]. lse [B, H, Sq, 1] is the whole row's. Not taken (Error naming the option):
// global_tokens, block_mask and scores, whose positions are the local key index.
// Each rank's partial (output and lse per row) is exchanged once; every rank merges them in rank
// order in double, so the result is bitwise the same on every rank and at any thread count.
SIMDATTN_API void sharded_attention(MPI_Comm comm, const ConstTensorView& q, const ConstTensorView& k,
                                    const ConstTensorView& v, const TensorView& out,
                                    const AttentionOptions& options, const ShardOptions& shard);

struct RingOptions {
  // The number of tokens of the whole sequence. Required (>= 0).
  std::int64_t total_tokens = -1;
  // How the tokens are dealt (shard_ranges): zigzag balances a causal triangle.
  ShardOrder order = ShardOrder::zigzag;
};

// Self-attention of one sequence whose queries, keys and values are all sharded the same way:
// rank r holds the tokens of shard_ranges(total_tokens, ranks, r, order), one after the other.
//   q    [B, H, n, D],  k [B, Hkv, n, D],  v [B, Hkv, n, Dv],  out [B, H, n, Dv]  (n: this rank's)
// Equal to attention() on the whole sequence (Sq = Sk = total_tokens) within the dtype's
// rounding, out holding this rank's queries. The K/V shards pass around the ring (each rank
// sends to rank + 1 and receives from rank - 1 with non-blocking calls) while each rank computes
// on the one it holds; with causal, a query range and key range wholly hidden from each other
// are skipped. options: scale, causal (either alignment: Sq = Sk), window, softcap,
// alibi_slopes, relative_bias, sinks, lse (this rank's rows, [B, H, n, 1]), threads, backend.
// Not taken (Error naming it): mask, key_lengths, query_offsets, global_tokens, block_mask,
// scores and 8-bit K/V.
SIMDATTN_API void ring_attention(MPI_Comm comm, const ConstTensorView& q, const ConstTensorView& k,
                                 const ConstTensorView& v, const TensorView& out, const AttentionOptions& options,
                                 const RingOptions& ring);

// One sequence's K/V cache spread over the ranks of a communicator: rank r holds positions
// [r * capacity_per_rank, (r + 1) * capacity_per_rank); the sequence fills rank 0 first, and an
// append stores its tokens on the rank (or ranks) that own the positions at the tail. A decode
// step sends no K/V: each rank attends over its part and the partials merge (sharded_attention).
// Every member function but the accessors is collective.
class SIMDATTN_API ShardedKvCache {
 public:
  // dtype: f32, f64, bf16 or f16 (the dtype of the K/V given to append and of the queries given
  // to attend), or int8, fp8_e4m3 or fp8_e5m2: 8-bit codes with an f32 scale per (kv head,
  // token) row, quantized by append from K/V of any float dtype exactly as quantize_kv does
  // (attention.hpp), read in place by attend. The communicator is duplicated (the cache's
  // messages never meet the caller's).
  ShardedKvCache(MPI_Comm comm, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                 std::int64_t capacity_per_rank, DType dtype = DType::f32);
  ~ShardedKvCache();
  ShardedKvCache(const ShardedKvCache&) = delete;
  ShardedKvCache& operator=(const ShardedKvCache&) = delete;

  // Appends T tokens: k [1, Hkv, T, D], v [1, Hkv, T, Dv], of the same shape on every rank; the
  // owners of positions size() .. size() + T - 1 store their values (the other ranks' are not
  // read past the checks). Throws Error (on every rank, the cache unchanged) when the tokens do
  // not fit in ranks() * capacity_per_rank(), or, 8-bit, when an owner's row holds NaN or an
  // infinity (quantize_kv's Error).
  void append(const ConstTensorView& k, const ConstTensorView& v);

  // Attention of q [1, H, Sq, D] over the cached tokens into out [1, H, Sq, Dv], on every rank:
  // sharded_attention with total_keys = size(). options as there (bottom_right puts the queries
  // at the last Sq positions); a mask's key axis is 1 or this rank's local_size().
  void attend(const ConstTensorView& q, const TensorView& out, const AttentionOptions& options = {});

  void clear();  // forgets every token (collective)

  std::int64_t size() const noexcept { return size_; }         // tokens in the whole sequence
  std::int64_t local_size() const noexcept;                     // of them, held on this rank
  std::int64_t capacity_per_rank() const noexcept { return capacity_; }
  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  DType dtype() const noexcept { return dtype_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, ranks_ = 1;
  std::int64_t kv_heads_, head_dim_, v_head_dim_, capacity_;
  DType dtype_;
  std::int64_t size_ = 0;
  std::vector<unsigned char> k_, v_;  // [1, Hkv, capacity, D] and [1, Hkv, capacity, Dv]
  std::vector<float> k_scale_, v_scale_;  // 8-bit: [1, Hkv, capacity, 1]

  // Rows [at, at + count) of a code store of rows `width` wide, and of a scale store.
  TensorView code_rows(std::vector<unsigned char>& store, std::int64_t width, std::int64_t at, std::int64_t count);
  TensorView scale_rows(std::vector<float>& scales, std::int64_t at, std::int64_t count);
};

}  // namespace simdattn::mpi
