// What sharded_attention, ring_attention and the sharded cache share: the description of the
// arguments every rank must give alike, and the checks of the options a sharded call takes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "distributed/comm.hpp"
#include "simdattn/mpi.hpp"

namespace simdattn::detail::mpi {

using simdattn::mpi::RingOptions;
using simdattn::mpi::ShardOptions;
using simdattn::mpi::shard_length;
using simdattn::mpi::shard_order_name;
using simdattn::mpi::shard_ranges;
using simdattn::mpi::TokenRange;

// q's, k's and v's shapes and dtypes (k's and v's key axis excepted: each rank's own; q's too
// unless same_queries) and every option whose value must agree across the ranks.
void describe(Shared& shared, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
              const AttentionOptions& options, bool same_queries);

// The start a sharded call (sharded_attention, ring_attention) makes on every rank: MPI errors
// returned for its duration, its rank among the ranks, and the description of what they must
// give alike (describe) for the ranks' agreement (comm.hpp's agree).
// `own`: the call's own arguments that must agree too, by name.
struct ShardedCall {
  ShardedCall(MPI_Comm comm, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
              const AttentionOptions& options, bool same_queries,
              std::initializer_list<std::pair<const char*, std::int64_t>> own)
      : errors_return(comm), ranks(size_of(comm)), me(rank_of(comm)) {
    describe(shared, q, k, v, options, same_queries);
    for (const auto& [name, value] : own) shared.add(name, value);
  }
  ErrorsReturn errors_return;
  int ranks, me;
  Shared shared;
};

// Error(option, "<what> does not take it (...)") for the options no sharded call takes:
// global_tokens, block_mask and scores (their positions are local key indices).
void refuse_local_positions(const AttentionOptions& options, const char* what);

// out of dtype q's and shape `shape` (the output attention() would write), options.lse (when
// given) f32 [B, H, Sq, 1]: Error naming out or options.lse.
void check_outputs(DType q_dtype, const Shape4& shape, const TensorView& out, const TensorView& lse);

// options.sinks: one finite logit per query head (or none).
void check_sinks(const AttentionOptions& options, std::int64_t heads);

std::string shape_text(const Shape4& s);

}  // namespace simdattn::detail::mpi
