// The native backend's paths. attention_native (native.cpp) takes the first that fits:
//   decode      few query rows per kv head: streams K and V once (native_decode.cpp)
//   short keys  up to 96 keys, no mask: queries on the vector lanes (native_short_keys.cpp)
//   fused       everything else: flash attention on key blocks (native_fused.cpp)
#pragma once

#include "problem.hpp"

namespace simdattn::detail {

bool decode_fits(const Problem& p);
void decode_attention(const Problem& p);

bool short_keys_fit(const Problem& p);
void short_keys_attention(const Problem& p);

void fused_attention(const Problem& p);

}  // namespace simdattn::detail
