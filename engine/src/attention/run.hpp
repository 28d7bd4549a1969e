// A validated problem through the backends, as attention() and attention_paged() run theirs
// (attention.cpp), for callers that build their problem from state they keep valid themselves:
// the KV pool's step over its own blocks (layer/cache/kv_pool.cpp), whose table and lengths need
// no second check.
#pragma once

#include <string_view>

#include "core/problem.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail {

// Verbose mode's line named `op` (or, nested, the outer call's path), then p on `backend`
// (reference or native; onednn for dense keys only) and the scores output.
void run_attention(std::string_view op, const Problem& p, Backend backend);

}  // namespace simdattn::detail
