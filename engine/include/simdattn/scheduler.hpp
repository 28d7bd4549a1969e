// Continuous batching of incremental decode steps across request threads.
//
// A service's request threads each call step() with their own sequence's new tokens and KV
// cache. Steps that are pending together run as one MultiHeadAttention::forward_batch call: the
// layer's weights are read once for all of them, and each request gets exactly its own output
// (the same as forward(query, cache, out) alone, within the dtype's rounding of a GEMM of other
// shape). The scheduler runs every batch on a thread of its own, started by the constructor and
// joined by the destructor: every batch uses the same team of workers and the same scratch,
// warm, and the request threads only wait (request threads taking turns to run batches would
// run each batch on another thread's cold buffers and sleeping team; guarded by
// simdattn_serve_bench decode, docs/serving.md).
//
// Forming a batch: when no batch is running, a pending step starts one at once if the previous
// batch had no more steps than are pending now (a lone stream is never held back); otherwise it
// waits, at most max_wait, for as many steps as the previous batch had (streams that were
// batched together come back together), then runs whatever is pending (up to max_batch steps;
// a second step on a cache already in the batch waits for the next).
//
// Waking: when a batch ends, one call wakes every waiting request thread, and each returns once
// its own step is finished. Steps left pending (more than max_batch, or a cache's second step)
// therefore wake at each batch's end and wait again: set max_batch to at least the number of
// streams that run at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <stop_token>

#include "simdattn/export.hpp"
#include "simdattn/mha.hpp"

namespace simdattn {

namespace detail {
struct DecodeSchedulerState;
}

struct DecodeSchedulerOptions {
  std::chrono::microseconds max_wait{500};  // the longest a step waits for others to join (>= 0)
  std::size_t max_batch = 64;                // steps per batched call (>= 1)
  int threads = 0;                           // each batched call's threads, as MhaOptions::threads
  Backend backend = Backend::native;         // each batched call's backend
};

class SIMDATTN_API DecodeScheduler {
 public:
  // The layer must outlive the scheduler. Throws Error("options.max_batch") for max_batch 0,
  // Error("options.max_wait") for a negative wait, std::system_error if its thread cannot start.
  explicit DecodeScheduler(const MultiHeadAttention& layer, const DecodeSchedulerOptions& options = {});
  DecodeScheduler(const DecodeScheduler&) = delete;
  DecodeScheduler& operator=(const DecodeScheduler&) = delete;
  // Must not run while a step() is in progress.
  ~DecodeScheduler();

  // Runs `step` (query [cache->batch(), T, d_model] appended to *step.cache and attended over it,
  // into step.out) in a batch with the steps other threads submit meanwhile, and returns true
  // once step.out holds its output. Thread-safe. A bad step throws its own Error (naming "query",
  // "cache", "out" or "options.positions", as MultiHeadAttention::check_step) and joins no batch;
  // a failure of the batched call itself (e.g. std::bad_alloc) reaches the steps of that batch.
  // On failure the step's cache is as it was. Returns false, having written nothing and left the
  // cache as it was, if `stop` is requested before the step joins a batch (cancellation).
  bool step(const DecodeStep& step, std::stop_token stop = {});

  // Batched calls made so far and the steps they ran (for tests and monitoring).
  std::size_t batches() const;
  std::size_t steps_run() const;

 private:
  std::unique_ptr<detail::DecodeSchedulerState> state_;  // the queue and its thread (engine/src/serving/scheduler.cpp)
};

}  // namespace simdattn
