// Turning the arguments of attention() into a Problem.
#pragma once

#include "core/problem.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail {

// Resolves the ISA the kernels dispatch to (once per process): an unknown or unavailable
// SIMDATTN_ISA throws Error("SIMDATTN_ISA", ...). Every public entry point calls it first, so a
// bad environment is a named input error on every path, never an escape from a parallel region.
void check_isa();

// Validates the arguments of attention() and builds the Problem. Throws Error.
Problem make_problem(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     const TensorView& out, const AttentionOptions& options);

}  // namespace simdattn::detail
