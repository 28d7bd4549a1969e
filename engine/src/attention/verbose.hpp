// Verbose mode's fields for the attention calls (runtime/verbose.hpp): the shapes, the options
// in short form and the path, from the validated problem.
#pragma once

#include <string>

#include "core/problem.hpp"
#include "runtime/verbose.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail {

// backend=, path= and not= (the native path table's choice), dtype=, kv_dtype=, q= k= v= (keys
// in blocks, attention_paged's: q= kv_cache= seqs=), opts=.
void describe_attention(VerboseCall& call, const Problem& p, Backend backend);

// A number as the options write it: "%g".
std::string verbose_number(double x);

}  // namespace simdattn::detail
