// The pieces of sharded_attention that ring_attention and the sharded cache reuse.
#pragma once

#include <span>

#include "distributed/comm.hpp"
#include "distributed/options.hpp"
#include "distributed/partial.hpp"
#include "simdattn/mpi.hpp"

namespace simdattn::detail::mpi {

// Query 0's position in batch b of the unsharded call (attention.hpp, "Visibility").
std::int64_t global_query_offset(const AttentionOptions& options, std::int64_t b, std::int64_t total_keys,
                                 std::int64_t sq);

// Attention of q over this rank's keys (k's key axis holds `ranges`, in order) merged into acc
// (B * H * Sq rows), each range one attention() call with the positions of the unsharded call.
// No sinks (merge_and_write adds them once).
void attend_local(Accumulator& acc, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                  const AttentionOptions& options, std::int64_t total_keys, std::span<const TokenRange> ranges);

// Collective: every rank's rows (output and lse, as doubles) to every rank (root -1) or to root,
// merged in rank order in double, the sinks added, written to out and options.lse.
void merge_and_write(MPI_Comm comm, const Accumulator& acc, const ConstTensorView& q, std::int64_t dv,
                     const TensorView& out, const AttentionOptions& options, int root);

// Ranges as (start, length) pairs, the form agree() gathers them in.
std::vector<std::int64_t> flatten(std::span<const TokenRange> ranges);

// Throws Error(argument) unless the ranks' gathered ranges (flatten's pairs) together cover
// [0, total) exactly once: every rank gets the same gathered values, so every rank throws alike.
void check_cover(const Gathered& ranges, std::int64_t total, const char* argument);

// A view's slice along its last axis: columns [start, start + length).
inline ConstTensorView slice_last(const ConstTensorView& t, std::int64_t start, std::int64_t length) {
  ConstTensorView s = t;
  s.data = static_cast<const unsigned char*>(t.data) + start * t.strides[3] * static_cast<std::int64_t>(dtype_size(t.dtype));
  s.shape[3] = length;
  return s;
}

}  // namespace simdattn::detail::mpi
