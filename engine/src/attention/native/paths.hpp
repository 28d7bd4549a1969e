// The native backend's paths. attention_native (native.cpp) takes the first that fits:
//   decode      few query rows per kv head: streams K and V once (native_decode.cpp), in bf16
//               and f16 as they are
//   widened     bf16/f16 decode with strided K or V: dense f32 copies on the f32 decode path
//   short keys  up to 96 keys, no mask: queries on the vector lanes (native_short_keys.cpp),
//               bf16 and f16 widened as K and V^T are packed and Q panels transposed
//   fused       everything else: flash attention on key blocks (native_fused.cpp), bf16 and
//               f16 widened as K/V blocks are packed and Q blocks copied, narrowed as O is written
#pragma once

#include "core/backends.hpp"
#include "core/problem.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {

namespace scratch {
struct NativeAttention : ScratchSlot {};  // the native paths' blocks, packed K^T / V, decode rows
}  // namespace scratch

bool decode_fits(const Problem& p);
void decode_attention(const Problem& p);
// The decode path on bf16/f16 K and V as they are (16-bit GEMV kernels).
bool decode16_fits(const Problem& p);
void decode16_attention(const Problem& p);

bool short_keys_fit(const Problem& p);
void short_keys_attention(const Problem& p);

void fused_attention(const Problem& p);
// The fused path runs p on AMX tiles (bf16, D <= 256, on the amx kernel table): it then also
// takes the problems the short-key path would (their few keys are one tile block).
bool fused_on_tiles(const Problem& p);

}  // namespace simdattn::detail
