// The native backend's paths (native.hpp lists them in order): each one's why_not and runner.
// Every path reads the problem's key source (dense, or a paged cache's blocks) but
// decode.widened and short_keys, which take dense keys and one query block a batch only.
//   decode16        a few query tokens a sequence, bf16/f16 K and V read as they are
//                   (decode.cpp): a group's heads as one block of rows; the decode paths apply
//                   sinks and write lse, not score modifiers
//   decode.widened  bf16/f16 decode with K or V strided along D: dense f32 copies on the f32
//                   decode path (widened.cpp)
//   decode          a few query tokens a sequence: K and V streamed once (decode.cpp)
//   decode8         a few query tokens a sequence, 8-bit K and V codes read as they are
//                   (decode.cpp)
//   fused.tiles     flash attention in the tiles' bf16 layouts (bf16, any D; fused/):
//                   on AMX tiles, or on vdpbf16ps where it runs at the FMA rate (AMD's cores);
//                   it also takes the problems the short-key path would (their few keys are one
//                   tile block). The decode paths' stacked rows of bf16 q (more than 8 a kv
//                   head) run its steps too
//   short_keys      up to 96 keys, no mask: queries on the vector lanes (short_keys.cpp), bf16
//                   and f16 widened as K and V^T are packed and Q panels transposed
//   fused           everything else: flash attention on key blocks (fused/; a few tokens of
//                   grouped heads stacked as the decode paths stack them), bf16 and f16
//                   widened as K/V blocks are packed and Q blocks copied, narrowed as O is written;
//                   8-bit K/V codes dequantized block by block as they are packed
#pragma once

#include "attention/native/native.hpp"
#include "core/problem.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {

namespace scratch {
struct NativeAttention : ScratchSlot {};  // the native paths' blocks, packed K^T / V, decode rows
}  // namespace scratch

// Query tokens a sequence the decode paths take: a decode step, or a speculative step's drafts.
// More go to the fused path, whose prompt blocks of one head reuse each packed key block across
// their rows.
inline constexpr std::int64_t kDecodeMaxTokens = 16;

// Score modifiers, sinks and lse: the fused paths apply them all; the decode paths the sinks and
// lse (at a row's end: finish_row); the short-key path none (the plain online softmax).
inline Refusal needs_more_than_softmax(const Problem& p) {
  if (p.online_softmax_only()) return {};
  return {"score modifiers, sinks or lse (the fused paths apply them)"};
}
inline Refusal needs_modified_scores(const Problem& p) {
  if (!p.scores_modified()) return {};
  return {"score modifiers (the fused paths apply them)"};
}

// Keys in blocks (a paged cache) or varlen queries: the paths that copy or transpose whole
// batches (decode.widened, short_keys) take dense inputs only.
inline Refusal needs_dense_keys(const Problem& p) {
  if (p.paged()) return {"keys in blocks of {} (a paged cache)", p.kv_blocks.block_size};
  if (p.query_start != nullptr) return {"varlen query rows"};
  return {};
}

inline bool is_16bit(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

Refusal decode8_why_not(const Problem& p);
void decode8_attention(const Problem& p);

Refusal decode16_why_not(const Problem& p);
void decode16_attention(const Problem& p);

Refusal widened_why_not(const Problem& p);
void widened_attention(const Problem& p);

Refusal decode_why_not(const Problem& p);
void decode_attention(const Problem& p);

Refusal fused_tiles_why_not(const Problem& p);
// Whether the fused path runs p on AMX tiles.
inline bool fused_on_tiles(const Problem& p) { return !fused_tiles_why_not(p); }

Refusal short_keys_why_not(const Problem& p);
void short_keys_attention(const Problem& p);

void fused_attention(const Problem& p);

}  // namespace simdattn::detail
