// PoolScheduler (simdattn/pool_scheduler.hpp): the scheduler's thread forms batches of decode
// steps and prompt chunks over a KvPool and runs each as one forward_pool call.
#include "simdattn/pool_scheduler.hpp"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <string>
#include <vector>

#include "serving/batch_queue.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

// A pending or running step. Its fields are guarded by the queue's mutex.
struct PoolRequest : QueuedRequest {
  PoolStep step;
  std::int64_t tokens = 0, done = 0, start = 0;  // start: the sequence's length before the step
  bool in_batch = false, stop = false;
};

struct PoolSchedulerState {
  PoolSchedulerState(const MultiHeadAttention& l, KvPool& p, const PoolSchedulerOptions& o)
      : layer(l), pool(p), options(o) {}
  const MultiHeadAttention& layer;
  KvPool& pool;
  PoolSchedulerOptions options;
  BatchQueue<PoolRequest> queue;
  mutable std::mutex pool_mutex;        // the pool: held by the scheduler's thread while a batch runs
  std::vector<KvPool::Sequence> busy;   // sequences with a step in progress
  std::size_t tokens_run = 0;

  void run_once(std::unique_lock<std::mutex>& lock);
  void form_batch(std::unique_lock<std::mutex>& lock);
};

namespace {

// Rows [r0, r0 + n) of a [1, T, E] sequence view.
template <class View>
View rows_of(const View& v, std::int64_t r0, std::int64_t n) {
  View out = v;
  out.S = n;
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(v.data)>>, const std::byte, std::byte>;
  out.data = static_cast<Byte*>(v.data) + static_cast<std::size_t>(r0 * v.E) * dtype_size(v.dtype);
  return out;
}

}  // namespace

// With the lock held and a step pending: waits (bounded) for the previous batch's streams to come
// back together, then forms and runs a batch.
void PoolSchedulerState::run_once(std::unique_lock<std::mutex>& lock) {
  if (queue.pending.size() < queue.last_batch) {
    const auto deadline = std::chrono::steady_clock::now() + options.max_wait;
    queue.work_cv.wait_until(lock, deadline, [&] { return queue.stopping || queue.pending.size() >= queue.last_batch; });
    if (queue.stopping) return;
  }
  if (!queue.pending.empty()) form_batch(lock);
}

// With the lock held: takes every pending decode step, then prompt chunks, to the token budget
// and the free blocks; runs them (the queue unlocked, the pool locked); requeues unfinished
// prompts at the front and finishes the rest.
void PoolSchedulerState::form_batch(std::unique_lock<std::mutex>& lock) {
  std::vector<PoolRequest*> batch;
  std::vector<std::int64_t> chunk;
  std::vector<PoolStep> steps;
  std::unique_lock<std::mutex> pool_lock(pool_mutex);
  const std::int64_t free_at_start = pool.free_blocks();
  std::int64_t free_left = free_at_start;
  double budget = static_cast<double>(options.token_budget);
  // A prompt chunk of n tokens from position L0 costs n + n (L0 + (n + 1) / 2) / (2 d_model): each
  // token's projections (8 d_model^2 multiply-adds) and its attention over the keys up to it (4
  // d_model a key), in units of one token's projections; a decode step costs 1. So a batch's time
  // stays about the same as a long prompt's later chunks attend to more keys.
  const double per_key = 1.0 / (2.0 * static_cast<double>(layer.config().d_model));
  auto chunk_cost = [&](const PoolRequest* q, std::int64_t n) {
    const double l0 = static_cast<double>(q->start + q->done);
    return static_cast<double>(n) * (1.0 + (l0 + static_cast<double>(n + 1) / 2.0) * per_key);
  };
  std::vector<PoolRequest*> failed;
  for (int pass = 0; pass < 2; ++pass)  // decode steps, then prompts
    for (PoolRequest* q : queue.pending) {
      if ((q->tokens == 1) != (pass == 0) || budget < 1.0) continue;
      std::int64_t n = 1;
      const bool tree = !q->step.tree_mask.empty();  // a draft tree runs whole, in one batch
      if (pass == 1 && tree) {
        n = q->tokens;
        if (chunk_cost(q, n) > budget && !batch.empty()) continue;  // the next batch
        if (pool.blocks_needed(q->step.sequence, n, options.layer) > free_left) {
          if (free_left == free_at_start) failed.push_back(q);
          continue;
        }
      } else if (pass == 1) {  // the longest chunk within the budget (at least a token in an empty batch)
        std::int64_t lo = 0, hi = q->tokens - q->done + 1;  // cost(lo) <= budget < cost(hi)
        if (chunk_cost(q, hi - 1) <= budget) lo = hi - 1;
        else
          while (hi - lo > 1) {
            const std::int64_t mid = lo + (hi - lo) / 2;
            (chunk_cost(q, mid) <= budget ? lo : hi) = mid;
          }
        n = std::max<std::int64_t>(lo, batch.empty() ? 1 : 0);
        if (n == 0) continue;
      }
      // the most of those tokens that fit in the free blocks (blocks_needed grows with n)
      while (n > 0 && pool.blocks_needed(q->step.sequence, n, options.layer) > free_left) {
        std::int64_t lo = 0, hi = n;  // fits(lo), !fits(hi)
        while (hi - lo > 1) {
          const std::int64_t mid = lo + (hi - lo) / 2;
          (pool.blocks_needed(q->step.sequence, mid, options.layer) <= free_left ? lo : hi) = mid;
        }
        n = lo;
      }
      if (n == 0) {
        if (free_left == free_at_start) failed.push_back(q);  // not even the whole pool's free blocks
        continue;                                              // else: the next batch
      }
      free_left -= pool.blocks_needed(q->step.sequence, n, options.layer);
      budget -= pass == 0 ? 1.0 : chunk_cost(q, n);
      q->in_batch = true;
      batch.push_back(q);
      chunk.push_back(n);
      const std::span<const std::int64_t> pos = q->step.positions;
      steps.push_back({rows_of(q->step.query, q->done, n), q->step.sequence, rows_of(q->step.out, q->done, n),
                       pos.size() == static_cast<std::size_t>(q->tokens)
                           ? pos.subspan(static_cast<std::size_t>(q->done), static_cast<std::size_t>(n))
                           : std::span<const std::int64_t>{}});
      steps.back().tree_mask = q->step.tree_mask;  // whole steps only (n == tokens)
    }
  for (PoolRequest* q : failed) {
    queue.pending.erase(std::find(queue.pending.begin(), queue.pending.end(), q));
    try {
      const bool tree = !q->step.tree_mask.empty();
      throw Error("pool", "sequence " + std::to_string(q->step.sequence) + " needs " +
                              std::to_string(pool.blocks_needed(q->step.sequence, tree ? q->tokens : 1, options.layer)) +
                              " free block(s) for " + (tree ? "its draft tree" : "its next token") + "; the pool has " +
                              std::to_string(free_at_start) +
                              " of " + std::to_string(pool.num_blocks()) + " free");
    } catch (...) {
      q->error = std::current_exception();
    }
    queue.finish(q);
  }
  if (batch.empty()) return;
  for (PoolRequest* q : batch) queue.pending.erase(std::find(queue.pending.begin(), queue.pending.end(), q));
  lock.unlock();
  std::exception_ptr failure;
  try {
    MhaOptions opt;
    opt.threads = options.threads;
    opt.backend = options.backend;
    layer.forward_pool(steps, pool, options.layer, opt);
  } catch (...) {
    failure = std::current_exception();
  }
  pool_lock.unlock();
  lock.lock();
  queue.last_batch = batch.size();
  ++queue.batches;
  std::vector<PoolRequest*> again;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    PoolRequest* q = batch[i];
    q->in_batch = false;
    if (failure) {
      q->error = failure;
    } else {
      q->done += chunk[i];
      tokens_run += static_cast<std::size_t>(chunk[i]);
      if (q->done < q->tokens) {
        if (q->stop) q->cancelled = true;
        else again.push_back(q);
        if (!q->stop) continue;
      }
    }
    queue.finish(q);
  }
  queue.pending.insert(queue.pending.begin(), again.begin(), again.end());  // prompts keep their turn
}

}  // namespace simdattn::detail

namespace simdattn {

PoolScheduler::PoolScheduler(const MultiHeadAttention& layer, KvPool& pool, const PoolSchedulerOptions& options)
    : state_(std::make_unique<detail::PoolSchedulerState>(layer, pool, options)) {
  if (options.token_budget < 1)
    throw Error("options.token_budget", "expected >= 1, got " + std::to_string(options.token_budget));
  if (options.max_wait.count() < 0)
    throw Error("options.max_wait", "expected >= 0 us, got " + std::to_string(options.max_wait.count()));
  if (options.layer < 0 || options.layer >= pool.layers())
    throw Error("options.layer", "expected 0 <= layer < " + std::to_string(pool.layers()) + ", got " +
                                     std::to_string(options.layer));
  if (options.backend == Backend::onednn)
    throw Error("options.backend", "a pool runs on the native and reference backends");
  detail::PoolSchedulerState* s = state_.get();
  s->queue.start([s](std::unique_lock<std::mutex>& lock) { s->run_once(lock); });
}

PoolScheduler::~PoolScheduler() { state_->queue.stop(); }

KvPool::Sequence PoolScheduler::open(std::optional<KvPool::Sequence> prefix) {
  std::lock_guard<std::mutex> lock(state_->pool_mutex);
  return prefix ? state_->pool.fork(*prefix) : state_->pool.add();
}

void PoolScheduler::close(KvPool::Sequence sequence) {
  std::lock_guard<std::mutex> lock(state_->pool_mutex);
  state_->pool.release(sequence);
}

void PoolScheduler::accept(KvPool::Sequence seq, std::int64_t first, std::span<const std::int64_t> kept) {
  std::lock_guard<std::mutex> lock(state_->pool_mutex);
  state_->pool.accept(seq, first, kept);
}

std::int64_t PoolScheduler::length(KvPool::Sequence sequence) const {
  std::lock_guard<std::mutex> lock(state_->pool_mutex);
  return state_->pool.length(sequence, state_->options.layer);
}

std::int64_t PoolScheduler::free_blocks() const {
  std::lock_guard<std::mutex> lock(state_->pool_mutex);
  return state_->pool.free_blocks();
}

std::size_t PoolScheduler::batches() const {
  std::lock_guard<std::mutex> lock(state_->queue.mutex);
  return state_->queue.batches;
}

std::size_t PoolScheduler::tokens_run() const {
  std::lock_guard<std::mutex> lock(state_->queue.mutex);
  return state_->tokens_run;
}

bool PoolScheduler::step(const PoolStep& step, std::stop_token stop) {
  detail::PoolSchedulerState& s = *state_;
  MhaOptions check;
  check.backend = s.options.backend;
  detail::PoolRequest r;
  r.step = step;
  r.tokens = step.query.S;
  {
    std::lock_guard<std::mutex> lock(s.pool_mutex);
    s.layer.check_step(step, s.pool, check);  // a bad request fails alone, before it can join a batch
    r.start = s.pool.length(step.sequence, s.options.layer);
  }
  if (r.tokens == 0) return true;
  {
    std::lock_guard<std::mutex> lock(s.queue.mutex);
    if (stop.stop_requested()) return false;
    if (std::find(s.busy.begin(), s.busy.end(), step.sequence) != s.busy.end())
      throw Error("sequence", "sequence " + std::to_string(step.sequence) + " has a step in progress already");
    s.busy.push_back(step.sequence);
    s.queue.pending.push_back(&r);
  }
  s.queue.work_cv.notify_one();
  // a stop cancels the step between its chunks: the chunk running finishes, no other joins a batch
  s.queue.wait(r, stop, [&](detail::PoolRequest& q) {
    q.stop = true;
    if (q.in_batch || q.finished.load(std::memory_order_relaxed) || !s.queue.remove(&q)) return false;
    return q.cancelled = true;
  });
  {
    std::lock_guard<std::mutex> lock(s.queue.mutex);
    s.busy.erase(std::find(s.busy.begin(), s.busy.end(), step.sequence));
  }
  if ((r.cancelled || r.error) && r.done > 0) {  // the chunks that ran go again
    std::lock_guard<std::mutex> lock(s.pool_mutex);
    s.pool.truncate(step.sequence, r.start);
  }
  if (r.cancelled) return false;
  if (r.error) std::rethrow_exception(r.error);
  return true;
}

}  // namespace simdattn
