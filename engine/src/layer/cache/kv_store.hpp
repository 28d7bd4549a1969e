// A layer's cached keys and values as a step writes and reads them, one view for both caches: a
// KvCache (a dense key source: sequence b's keys in its one block, b) and a KvPool's layer (a
// paged one: blocks through each sequence's table). A step's new rows are checked and appended
// the same way for both, and its attention core is one problem over the store (core/problem.hpp's
// key source), run on the one engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "layer/storage.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// Element (block, kv head hk, slot, d) of K at k + block * block_stride + (hk * block_size + slot)
// * head_dim + d (elements of dtype), V's likewise (its first v_dim columns); 8-bit stores' row
// scales at k_scale[block * scale_stride + hk * block_size + slot]. A latent store (an MLA
// layer's: one kv head of the latent rows) has v == k and v_scale == k_scale: V is K's first
// v_dim columns.
struct KvStore {
  DType dtype = DType::f32;
  std::int64_t kv_heads = 0, head_dim = 0, block_size = 0, blocks = 0;
  std::int64_t v_dim = 0;  // V's columns (head_dim, or a latent store's fewer)
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  std::int64_t block_stride = 0;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  std::int64_t scale_stride = 0;
  bool paged = false;  // blocks through the sequences' tables (a pool), else sequence b's in block b
};

// One sequence of a step: its index (dense: its block; a pool: its handle), its keys' blocks
// (paged: the pool sequence's table, read when the step writes and attends, once its blocks are
// taken), the keys it holds before the step and the step's tokens, which are rows row0 .. row0 +
// tokens - 1 of the call's projected rows (every step's, one after another).
struct StoreSeq {
  std::int64_t index = 0;
  const std::vector<std::int32_t>* blocks = nullptr;
  std::int64_t start = 0, tokens = 0, row0 = 0;
  const std::uint8_t* tree_mask = nullptr;  // a pool step's draft tree, [tokens, tokens]; null: causal
};

// The checks every cached step makes (over a KvCache or a pool): query [B, S, d_model] (B: the
// step's sequences, -1 any) and out of the layer's dtype and rows, positions (with RoPE or
// QK-norm); and the options: bottom-right alignment (top-left refused), no masks (truncate the
// sequence instead). `what`: "a KvCache" or "a pool" in messages. Error naming the argument.
template <class T>
void check_step_rows(const LayerStorage<T>& layer, const ConstSeqView& query, const SeqView& out,
                     std::span<const std::int64_t> positions, std::int64_t B);
void check_cached_options(const MhaOptions& opt, const char* what);

// 8-bit stores: the first K or V row among the step's projected rows p (N apart) that holds a NaN
// or an infinity, which no code represents (its sequence of seqs, token, kv head and K or V);
// none (seq -1) for other stores. Checked before anything is written.
struct BadRow {
  std::int64_t seq = -1, token = 0, kv_head = 0;
  const char* which = "K";
};
template <class T>
BadRow first_bad_row(const LayerStorage<T>& layer, const T* p, std::int64_t N, const KvStore& store,
                     std::span<const StoreSeq> seqs);
// Its message: "sequence <id>, token <t>: its K row of kv head <h> holds a NaN or an infinity,
// which an int8 <what> cannot represent (the <what> is unchanged)".
std::string bad_row_text(const BadRow& bad, std::int64_t id, DType dtype, const char* what);

// The step's K and V rows (rotated) written past each sequence's keys, converted or quantized to
// the store's dtype. Never throws (check_store_rows first).
template <class T>
void append_store_rows(const LayerStorage<T>& layer, const T* p, std::int64_t N, const KvStore& store,
                       std::span<const StoreSeq> seqs);

// A latent store's (an MLA layer's) new rows: row r of `rows` (width head_dim, T) written at
// sequence i's position start + t for r = row0 + t, converted or quantized per row. The rows are
// finite for an 8-bit store (checked before).
template <class T>
void append_latent_rows(const KvStore& store, std::span<const StoreSeq> seqs, const T* rows);

// A latent store's first n rows of sequence s (its positions 0 .. n-1) read back as T into dst
// (n x head_dim): converted, or an 8-bit row's codes times its scale (as the kernels read them).
template <class T>
void read_latent_rows(const KvStore& store, const StoreSeq& s, std::int64_t n, T* dst);

// The attention core over a store (dense: attention() over its views; paged: pool_core.hpp's
// pool_attention): each sequence's query rows (qd, ldq apart; H heads of head_dim) over its keys
// into its rows of od (ldo apart; H heads of v_dim), in the core's dtype.
void core_attention(const KvStore& store, std::span<const StoreSeq> seqs, DType core, std::int64_t H, const void* qd,
                    std::int64_t ldq, void* od, std::int64_t ldo, const AttentionOptions& a);

// A step's attention core for a layer whose query rows are nq wide (p, N apart) and output rows
// no wide (o, no apart), in T: core_attention with q converted to the store's core dtype and the
// output back when they differ.
template <class T>
void store_attention_rows(std::int64_t H, std::int64_t nq, std::int64_t no, const T* p, std::int64_t N,
                          const KvStore& store, std::span<const StoreSeq> seqs, T* o, const AttentionOptions& a);

// The attention core of a step (its sequences' rows consecutive in p from the first's row0): each
// sequence's query rows (from p, N apart) over its keys (start
// + tokens of them, bottom-right aligned) into its rows of o (nq apart), with options a (the
// layer's config's scale, window and modifiers, threads, backend; a KvCache's step also the
// weights' output), as one problem on the engine: a KvCache's attention() over dense views of it
// (every sequence the same tokens, rows in order), a pool's problem over its blocks (varlen). A
// store of another dtype than the layer's runs in the store's (8-bit: the layer's; f64 layers:
// f32): q converted to it, the output back.
template <class T>
void store_attention(const LayerStorage<T>& layer, const T* p, std::int64_t N, const KvStore& store,
                     std::span<const StoreSeq> seqs, T* o, const AttentionOptions& a);

// The dtype a store's attention core runs in: the store's, or for 8-bit codes the layer's (an f64
// layer's: f32, as 8-bit K and V come with f32, bf16 or f16 q).
inline DType core_dtype(DType store, DType layer) {
  if (!is_kv_code(store)) return store;
  return layer == DType::f64 ? DType::f32 : layer;
}

}  // namespace simdattn::detail
