// The native backend's paths (native.hpp lists them in order): each one's why_not and runner.
//   decode8         few query rows per kv head, 8-bit K and V codes read as they are (decode.cpp);
//                   the decode paths apply sinks and write lse, not score modifiers
//   decode16        few query rows per kv head, bf16/f16 K and V read as they are (decode.cpp)
//   decode.widened  bf16/f16 decode with K or V strided along D: dense f32 copies on the f32
//                   decode path (widened.cpp)
//   decode          few query rows per kv head: streams K and V once (decode.cpp)
//   fused.tiles     flash attention on AMX tiles (bf16, D <= 256; fused/): it also takes the
//                   problems the short-key path would (their few keys are one tile block)
//   short_keys      up to 96 keys, no mask: queries on the vector lanes (short_keys.cpp), bf16
//                   and f16 widened as K and V^T are packed and Q panels transposed
//   fused           everything else: flash attention on key blocks (fused/), bf16 and f16
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
