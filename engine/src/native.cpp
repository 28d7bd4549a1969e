// The native backend: picks one of its paths (native.hpp) for a validated problem.
#include "native.hpp"

namespace simdattn::detail {

void attention_native(const Problem& p) {
  if (decode_fits(p)) decode_attention(p);
  else if (short_keys_fit(p)) short_keys_attention(p);
  else fused_attention(p);
}

}  // namespace simdattn::detail
