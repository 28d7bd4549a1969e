// The validated, normalised form of one attention() call that every backend consumes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/element.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail {

// An optional view (a mask, a block mask) counts as given when it has data or a shape: a shape
// without data is then an error, not an absent option.
inline bool view_given(const ConstTensorView& v) noexcept { return v.data != nullptr || v.shape != Shape4{}; }

// How the mask is read: by its dtype (u8 boolean; f32, f64, bf16 or f16 additive).
enum class MaskKind : std::uint8_t { none, boolean, additive };

// Where the keys lie (the key source). Dense (no table): key j of batch b, kv head hk at element
// b * s[0] + hk * s[1] + j * s[2] of K (s = k_strides; V and the 8-bit scales alike). In blocks
// of a paged cache (attention_paged, the KV pool): at blk * s[0] + hk * s[1] + slot * s[2], blk =
// table[b * table_stride + j / block_size], slot = j % block_size. A dense source is the paged one
// with one block per batch, of all its keys.
struct KeyBlocks {
  const std::int32_t* table = nullptr;  // null: dense
  std::int64_t table_stride = 0;
  std::int64_t block_size = 0;
  std::int64_t blocks = 0;  // the cache's (every table entry read is below)
};

// Keys j .. j + n - 1 of one batch that lie one row stride apart (one block's, or a dense batch's
// all): the first at `outer` (the batch, or the block) and `slot` (its key, or its slot).
struct KeyRun {
  std::int64_t outer = 0, slot = 0, n = 0;
};

struct Problem {
  DType dtype = DType::f32;  // of q and out (and of k and v unless they hold 8-bit codes)
  // k and v: dtype, or 8-bit codes (int8, fp8_e4m3, fp8_e5m2; dtype then f32, bf16 or f16) with
  // one f32 scale per row, k_scale[outer * s0 + hk * s1 + slot * s2] (element strides; KeyBlocks).
  DType kv_dtype = DType::f32;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  std::int64_t k_scale_strides[3] = {0, 0, 0}, v_scale_strides[3] = {0, 0, 0};
  bool kv_codes() const { return is_kv_code(kv_dtype); }
  // Element (b, hk, j, d) of K or V codes as attention reads it: decode(code) * scale, rounded to f32.
  double k_code_value(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return code_value(k, k_strides, k_scale, k_scale_strides, key_run(b, j, j + 1), hk, d);
  }
  double v_code_value(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return code_value(v, v_strides, v_scale, v_scale_strides, key_run(b, j, j + 1), hk, d);
  }
  // B batches (sequences), each with Sq query rows (at most Sq: query_start) and Sk keys (at
  // most Sk: key_lengths).
  std::int64_t B = 0, H = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;

  // Element strides; data pointers are typed by `dtype`. q, out and lse over [B, H, Sq, .], K and
  // V over [outer, Hkv, key or slot, .] (KeyBlocks).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  Shape4 q_strides{}, k_strides{}, v_strides{}, o_strides{};
  KeyBlocks kv_blocks;
  bool paged() const { return kv_blocks.table != nullptr; }
  // Varlen queries (attention_paged's query_start): batch b's rows are rows query_start[b] ..
  // query_start[b + 1] - 1 along q's, out's and lse's dimension 2 (their strides[0] then 0).
  // Null: Sq rows each.
  const std::int64_t* query_start = nullptr;
  std::int64_t query_len(std::int64_t b) const { return query_start ? query_start[b + 1] - query_start[b] : Sq; }
  std::int64_t first_row(std::int64_t b) const { return query_start ? query_start[b] : 0; }
  // Element offsets of row i of head (b, h) in q, out and lse.
  std::int64_t q_offset(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return b * q_strides[0] + h * q_strides[1] + (first_row(b) + i) * q_strides[2];
  }
  std::int64_t o_offset(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return b * o_strides[0] + h * o_strides[1] + (first_row(b) + i) * o_strides[2];
  }
  std::int64_t lse_offset(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return b * lse_strides[0] + h * lse_strides[1] + (first_row(b) + i) * lse_strides[2];
  }
  // The run of batch b's keys from j on, to the end of j's block or `end`, whichever comes first.
  KeyRun key_run(std::int64_t b, std::int64_t j, std::int64_t end) const {
    if (!paged()) return {b, j, end - j};
    const std::int64_t bs = kv_blocks.block_size, slot = j % bs;
    return {kv_blocks.table[b * kv_blocks.table_stride + j / bs], slot, std::min(end, j - slot + bs) - j};
  }
  // Element offsets of a run's first K row, V row and scales in kv head hk.
  std::int64_t k_at(const KeyRun& r, std::int64_t hk) const {
    return r.outer * k_strides[0] + hk * k_strides[1] + r.slot * k_strides[2];
  }
  std::int64_t v_at(const KeyRun& r, std::int64_t hk) const {
    return r.outer * v_strides[0] + hk * v_strides[1] + r.slot * v_strides[2];
  }
  std::int64_t k_scale_at(const KeyRun& r, std::int64_t hk) const {
    return r.outer * k_scale_strides[0] + hk * k_scale_strides[1] + r.slot * k_scale_strides[2];
  }
  std::int64_t v_scale_at(const KeyRun& r, std::int64_t hk) const {
    return r.outer * v_scale_strides[0] + hk * v_scale_strides[1] + r.slot * v_scale_strides[2];
  }

  // Mask: strides are 0 on broadcast (size-1) dimensions, so mask_at(b, h, i, j) needs no
  // broadcasting logic.
  MaskKind mask_kind = MaskKind::none;
  const void* mask = nullptr;
  DType mask_dtype = DType::u8;
  Shape4 mask_strides{};

  const std::int64_t* key_lengths = nullptr;  // nullptr: every batch has Sk keys

  Causal causal = Causal::none;
  bool has_window = false;
  std::int64_t window_left = -1, window_right = -1;  // -1 = unbounded

  // Sparse patterns: global tokens G (0 = none) and a block mask [nbq, nbk] of bs x bs blocks.
  std::int64_t global_tokens = 0;
  const std::uint8_t* block_mask = nullptr;
  std::int64_t block_size = 64;
  std::int64_t block_mask_strides[2] = {0, 0};  // element strides of the block mask [nbq, nbk]
  bool sparse() const { return global_tokens > 0 || block_mask != nullptr; }
  bool block_allows(std::int64_t i, std::int64_t j) const {
    return block_mask[(i / block_size) * block_mask_strides[0] + (j / block_size) * block_mask_strides[1]] != 0;
  }

  double scale = 1.0;
  int threads = 0;  // 0 = OpenMP default

  // Score modifiers (modifiers.hpp applies them): softcap (0 = none), ALiBi slopes [H], T5's
  // bias table (num_buckets x H, element strides), sinks [H]; explicit query offsets [B]; the lse
  // output (f32, strides of [B, H, Sq]).
  double softcap = 0.0;
  const float* alibi = nullptr;
  const void* t5_table = nullptr;
  DType t5_dtype = DType::f32;
  std::int64_t t5_buckets = 0, t5_max_distance = 128;
  std::int64_t t5_strides[2] = {0, 0};  // element strides of the table [num_buckets, H]
  bool t5_bidirectional = true;
  const float* sinks = nullptr;
  const std::int64_t* query_offsets = nullptr;
  float* lse = nullptr;
  std::int64_t lse_strides[3] = {0, 0, 0};
  // The opt-in scores output (scores.cpp): null when not asked for.
  void* scores = nullptr;
  DType scores_dtype = DType::f32;
  Shape4 scores_strides{};
  ScoreStage scores_stage = ScoreStage::softmax;
  // Whether anything changes the scores past scale * q.k and the mask.
  bool scores_modified() const { return softcap > 0.0 || alibi != nullptr || t5_table != nullptr; }
  // Whether the output needs more than the plain online softmax (modified scores, sinks, lse).
  bool online_softmax_only() const { return !scores_modified() && sinks == nullptr && lse == nullptr; }

  std::int64_t key_len(std::int64_t b) const { return key_lengths ? key_lengths[b] : Sk; }

  // Position of query 0 of batch b on the key axis (docs/design.md's position rule).
  std::int64_t query_offset(std::int64_t b) const {
    if (query_offsets != nullptr) return query_offsets[b];
    return causal == Causal::top_left ? 0 : key_len(b) - query_len(b);
  }

  std::int64_t mask_offset(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2] + j * mask_strides[3];
  }
  bool mask_allows(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (tree_mask != nullptr) return tree_allows(b, i, j);
    return static_cast<const std::uint8_t*>(mask)[mask_offset(b, h, i, j)] != 0;
  }
  // A tree mask (attention_paged's, speculative decoding) is a boolean mask (mask_kind boolean)
  // of another layout: batch b's query rows see its keys before them (its context, keys <
  // query_offset(b)) and, of its last query_len(b) keys, those its row of the [query_len(b),
  // query_len(b)] matrix at tree_mask + tree_starts[b] lists.
  const std::uint8_t* tree_mask = nullptr;
  std::vector<std::int64_t> tree_starts;
  bool tree_allows(std::int64_t b, std::int64_t i, std::int64_t j) const {
    const std::int64_t ctx = query_offset(b);
    return j < ctx || tree_mask[tree_starts[static_cast<std::size_t>(b)] + i * query_len(b) + (j - ctx)] != 0;
  }
  double mask_add(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return widen_at(mask, mask_dtype, mask_offset(b, h, i, j));
  }

 private:
  double code_value(const void* base, const Shape4& st, const float* sc, const std::int64_t* ss, const KeyRun& r,
                    std::int64_t hk, std::int64_t d) const {
    const std::uint8_t c =
        static_cast<const std::uint8_t*>(base)[r.outer * st[0] + hk * st[1] + r.slot * st[2] + d * st[3]];
    return static_cast<float>(code8_value(kv_dtype, c) * sc[r.outer * ss[0] + hk * ss[1] + r.slot * ss[2]]);
  }
};

}  // namespace simdattn::detail
