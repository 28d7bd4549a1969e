// Verbose mode's fields for the attention calls (runtime/verbose.hpp): the shapes, the options
// in short form and the path, from the validated problem.
#pragma once

#include <string>

#include "attention/paged/paged.hpp"
#include "core/problem.hpp"
#include "runtime/verbose.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail {

// backend=, path= and not= (the native path table's choice), dtype=, kv_dtype=, q= k= v=, opts=.
void describe_attention(VerboseCall& call, const Problem& p, Backend backend);

// The same for attention_paged: seqs= tokens= blocks=, its options.
void describe_paged(VerboseCall& call, const PagedProblem& p, Backend backend);

// A number as the options write it: "%g".
std::string verbose_number(double x);

}  // namespace simdattn::detail
