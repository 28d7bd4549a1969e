// The attention backends' entry points: each consumes a validated Problem (core/problem.hpp)
// and nothing else. attention() (attention/attention.cpp) picks one by AttentionOptions::backend.
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace simdattn::detail {

// Backends. Each takes a validated problem and writes out. reference and native never throw;
// onednn throws Error for f64 (oneDNN has none) or when oneDNN fails, before writing anything.
void attention_reference(const Problem& p);
// The opt-in scores output (scores.cpp), when asked for; after the backend, whichever it was.
void write_scores(const Problem& p);
void attention_native(const Problem& p);
#ifdef SIMDATTN_HAVE_ONEDNN
void attention_onednn(const Problem& p);
// Primitives the onednn backend has created so far in this process (its cache's misses x 3).
std::uint64_t onednn_primitives_created() noexcept;
// Whether oneDNN has the matmuls for inputs of this dtype on this CPU (probed once per dtype).
bool onednn_takes(DType dtype) noexcept;
#endif

}  // namespace simdattn::detail
