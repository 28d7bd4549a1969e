// `simdattn run --context-parallel zigzag|contiguous` under mpirun: the keys (and, for causal
// self-attention, the queries) of one run dealt to the ranks of MPI_COMM_WORLD; rank 0 writes
// the outputs (docs/distributed.md).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "simdattn/attention.hpp"

namespace simdattn::cli {

// MPI for the command's duration (initialized when constructed, finalized when destroyed), and
// the run's sharded attention. Throws UsageError when the build has no MPI.
class ContextParallel {
 public:
  explicit ContextParallel(const std::string& mode);  // "zigzag" or "contiguous" (--context-parallel)
  ~ContextParallel();
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

  // Whether this rank writes the outputs (rank 0).
  bool writes() const;
  // Runs `body` (the rest of the command) so that the ranks end together: an error's line is
  // printed on this rank, then the ranks wait for each other's (at most kSettleSeconds) before
  // any of them exits, since mpirun ends every rank once one exits with an error and would cut
  // off the lines of the ranks that have not printed theirs yet. The error then leaves as
  // Reported (with its exit status).
  void run(const std::function<void()>& body) const;
  // attention(q, k, v, out, options) with the work dealt to the ranks: ring_attention when the
  // call is causal self-attention (Sq = Sk, no mask, key lengths or query offsets), else
  // sharded_attention over the keys. out and options.lse are written on rank 0 only.
  void attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const TensorView& out,
                 const AttentionOptions& options) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace simdattn::cli
