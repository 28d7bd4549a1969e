// Attention of many sequences in one call over keys and values kept in fixed-size blocks (a
// paged KV cache), with FlashAttention's conventions (flash_attn_with_kvcache's block_table,
// flash_attn_varlen_func's cu_seqlens):
//
//   q        [1, total_q, H, D]    the new query tokens of every sequence, sequence by sequence
//   k_cache  [num_blocks, block_size, Hkv, D ]   any strides (FlashAttention's layout when
//   v_cache  [num_blocks, block_size, Hkv, Dv]   contiguous; a KvPool's view is head-major)
//   out      [1, total_q, H, Dv]
// f32, bf16 or f16, all the same dtype. H % Hkv == 0; query head h reads kv head h / (H / Hkv).
// 8-bit caches: k_cache and v_cache of dtype int8, fp8_e4m3 or fp8_e5m2 (both the same; q and out
// f32, bf16 or f16) hold codes, with options.k_scale and v_scale [num_blocks, block_size, Hkv, 1]
// f32 (attention.hpp's "8-bit K and V"; the scales of the keys read finite and >= 0).
//
// Sequence i has seq_lens[i] keys, its new tokens counted (they are already in the cache): its
// key t sits in block block_table[i, t / block_size], slot t % block_size. Its query tokens are
// q[query_start[i] : query_start[i + 1]] (query_start empty: one token per sequence, a decode
// step), query j at key position p = seq_lens[i] - (query_start[i + 1] - query_start[i]) + j.
// Visibility and the score modifiers are attention()'s for a batch of one with that alignment:
// causal bottom_right (the default) shows keys <= p, none every key; a window shows p - left ..
// p + right; softcap, ALiBi slopes [H], sinks [H] and the scale as in attention.hpp. A query row
// with no visible key writes zeros.
//
// The call is attention()'s over another key source (docs/architecture.md, "Key sources"): the
// native backend runs the same paths (the decode paths for steps of a few tokens, the fused path
// for prompt chunks), reading each block's rows where they lie, and splits a sequence's keys
// when there are few (sequence, kv head) units to spread over the threads. The split depends on
// the shapes only: the output is bitwise identical at any thread count.
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <optional>
#include <span>

#include "simdattn/attention.hpp"
#include "simdattn/tensor.hpp"

namespace simdattn {

// Sequence i's row of block indices: data[i * row_stride + c], c < cols. Only the first
// ceil(seq_lens[i] / block_size) entries of a row are read; each must be in [0, num_blocks).
struct BlockTable {
  const std::int32_t* data = nullptr;
  std::int64_t rows = 0;        // N, the number of sequences
  std::int64_t cols = 0;        // max_blocks
  std::int64_t row_stride = 0;  // elements from one row to the next (0: cols)
};

// The options of attention(), ScoreOptions (attention.hpp: scale, window, softcap, ALiBi slopes
// [H], sinks [H], k_scale / v_scale [num_blocks, block_size, Hkv, 1], threads; backend native or
// reference), and the paged call's own.
struct PagedAttentionOptions : ScoreOptions {
  // [N + 1] increasing offsets into q's tokens, query_start[0] = 0, query_start[N] = total_q
  // (FlashAttention's cu_seqlens_q). Empty: one token per sequence (total_q = N).
  std::span<const std::int64_t> query_start = {};
  Causal causal = Causal::bottom_right;  // bottom_right or none (ignored with a tree mask)

  // Tree masks (speculative decoding: a drafted tree verified in one call). Given (data or size):
  // the concatenation over the sequences i of a row-major [q_len_i, q_len_i] matrix M_i (q_len_i
  // = query_start[i + 1] - query_start[i]), starting at element tree_mask_start[i]; M_i[j, j']
  // nonzero means new token j of sequence i sees its new token j'. New token j of sequence i then
  // sees every key t < seq_lens[i] - q_len_i (its context) and the new tokens its row of M_i
  // lists; causal is ignored, and a window or ALiBi slopes with it are an Error("tree_mask")
  // (positions inside a tree are not linear). tree_mask_start: [N + 1] with tree_mask_start[i +
  // 1] - tree_mask_start[i] == q_len_i^2 and tree_mask_start[N] <= tree_mask.size(); empty: the
  // prefix sums of q_len_i^2 (from 0).
  std::span<const std::uint8_t> tree_mask = {};
  std::span<const std::int64_t> tree_mask_start = {};

  // Optional output: each query row's log-sum-exp of its final scores (after scale, softcap,
  // ALiBi) over its visible keys, with exp(sinks[h]) in the sum when sinks are given: [1,
  // total_q, H, 1] f32 (FlashInfer's attention states with out: merge_attention_states). A row
  // with no visible key: -inf (sinks[h] with sinks). Empty: not written. May not overlap any
  // input or out.
  TensorView lse = {};
};

// Computes the attention of every sequence's new tokens into `out`. Thread-safe. Throws Error
// naming the argument ("q", "k_cache", "v_cache", "block_table", "seq_lens", "out",
// "options.query_start", "tree_mask", "tree_mask_start", "options.<option>") before anything is written: a block index out of
// range, a table row too short for its sequence, query_start not increasing from 0 to total_q,
// more query tokens than keys, mismatched dtypes or shapes, out overlapping an input.
SIMDATTN_API void attention_paged(const ConstTensorView& q, const ConstTensorView& k_cache,
                                  const ConstTensorView& v_cache, const BlockTable& block_table,
                                  std::span<const std::int64_t> seq_lens, const TensorView& out,
                                  const PagedAttentionOptions& options = {});

// Merges two attention states of the same query rows over two sets of keys (FlashInfer's
// merge_state: attention over A and B from attention over A and over B): out_a, out_b [1, T, H,
// Dv] (f32, bf16 or f16, the same dtype as out), lse_a, lse_b [1, T, H, 1] f32 as attention_paged
// and attention() write them. Per row, with m = max(lse_a, lse_b), w_a = exp(lse_a - m) and w_b =
// exp(lse_b - m): out = (w_a out_a + w_b out_b) / (w_a + w_b), lse = m + log(w_a + w_b), in
// double, rounded once; a row whose two lse are -inf gets out 0 and lse -inf, a NaN makes the row
// NaN. out and lse [1, T, H, Dv] / [1, T, H, 1] may be the views of out_a and lse_a (or of out_b
// and lse_b), to merge in place; no other overlap. Throws Error naming the argument (shapes,
// dtypes, overlap) before anything is written. Sinks belong to only one of the two calls.
SIMDATTN_API void merge_attention_states(const ConstTensorView& out_a, const ConstTensorView& lse_a,
                                         const ConstTensorView& out_b, const ConstTensorView& lse_b,
                                         const TensorView& out, const TensorView& lse);

}  // namespace simdattn
