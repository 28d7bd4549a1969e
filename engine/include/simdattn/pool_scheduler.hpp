// Continuous batching over a KvPool: decode steps and prompts of many request threads, prompts
// cut into chunks that join the running decode steps (docs/serving.md, "Continuous batching").
//
// Each request thread opens a sequence (empty, or forked from a shared prefix: a sequence of the
// pool that holds a prompt many requests start with), then calls step() with its new tokens: a
// prompt (T > 1) or a decode step (T = 1). The scheduler's thread forms every batch: every
// pending decode step first, then chunks of pending prompts in the order they came, until the
// batch's cost reaches `token_budget`: a decode step costs 1, a prompt token 1 + (the keys it
// attends) / (2 d_model), its projections' and its attention's work in units of a token's
// projections. So a 4096-token prompt joining does not stall the running streams for a whole
// prefill: it runs a chunk a batch beside them, shorter as its tokens attend to more keys, and
// the batches take about the same time. A batch is one MultiHeadAttention::forward_pool call.
//
// Blocks: a request whose next tokens need more blocks than are free (after the requests before
// it in the batch took theirs) fails alone, with Error("pool"), its sequence as before its step;
// a prompt takes as many of its tokens as fit. A failure of the batched call itself (e.g.
// std::bad_alloc) reaches the requests of that batch. Cancellation (the stop token) takes effect
// between chunks: step() returns false and the sequence is as it was before the step.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>

#include "simdattn/export.hpp"
#include "simdattn/kv_pool.hpp"
#include "simdattn/mha.hpp"

namespace simdattn {

namespace detail {
struct PoolSchedulerState;
}

struct PoolSchedulerOptions {
  std::int64_t token_budget = 24;           // a batch's cost in tokens (>= 1): decode steps, then prompt chunks
  std::chrono::microseconds max_wait{500};  // the longest a batch waits for the previous batch's streams
  std::int64_t layer = 0;                   // the pool's layer the scheduler's layer writes
  int threads = 0;                          // each batched call's threads, as MhaOptions::threads
  Backend backend = Backend::native;        // native or reference
};

class SIMDATTN_API PoolScheduler {
 public:
  // The layer and the pool must outlive the scheduler; while it lives, the pool is changed only
  // through it. Throws Error naming the option, std::system_error if its thread cannot start.
  PoolScheduler(const MultiHeadAttention& layer, KvPool& pool, const PoolSchedulerOptions& options = {});
  PoolScheduler(const PoolScheduler&) = delete;
  PoolScheduler& operator=(const PoolScheduler&) = delete;
  // Must not run while a step() is in progress.
  ~PoolScheduler();

  // A new sequence: empty, or forked from `prefix` (a live sequence of the pool). Thread-safe.
  KvPool::Sequence open(std::optional<KvPool::Sequence> prefix = std::nullopt);
  // Releases a sequence whose steps are done. Thread-safe.
  void close(KvPool::Sequence sequence);
  // KvPool::accept on the scheduler's pool (speculative decoding: the drafts a tree step appended,
  // reduced to the accepted ones), between the sequence's steps. Thread-safe.
  void accept(KvPool::Sequence seq, std::int64_t first, std::span<const std::int64_t> kept);
  // The sequence's tokens (at the scheduler's layer). Thread-safe.
  std::int64_t length(KvPool::Sequence sequence) const;
  std::int64_t free_blocks() const;

  // Appends step.query's T tokens to step.sequence and writes their outputs to step.out, in
  // batches with the other threads' steps (T > 1 in chunks; a step with a tree_mask, a draft
  // tree, whole in one batch: Error("pool") if the whole pool's free blocks cannot hold its T
  // tokens). Returns true once step.out holds
  // every row. A bad step throws its Error (as MultiHeadAttention::check_step) and joins no
  // batch. Returns false, the sequence as it was, if `stop` is requested before its last chunk
  // joins a batch. One step at a time per sequence.
  bool step(const PoolStep& step, std::stop_token stop = {});

  std::size_t batches() const;
  std::size_t tokens_run() const;

 private:
  std::unique_ptr<detail::PoolSchedulerState> state_;  // the queue and its thread (engine/src/serving/pool_scheduler.cpp)
};

}  // namespace simdattn
