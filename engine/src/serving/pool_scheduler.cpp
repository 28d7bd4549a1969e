// PoolScheduler (simdattn/pool_scheduler.hpp): the scheduler's thread forms batches of decode
// steps and prompt chunks over a KvPool and runs each as one forward_pool call.
#include "simdattn/pool_scheduler.hpp"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <string>
#include <vector>

#include "simdattn/error.hpp"

namespace simdattn {

// A pending or running step. Every field but `finished` is guarded by the scheduler's mutex;
// `finished` is the last touch of the request by any thread but its own.
struct PoolScheduler::Request {
  PoolStep step;
  std::int64_t tokens = 0, done = 0, start = 0;  // start: the sequence's length before the step
  bool in_batch = false, stop = false, cancelled = false;
  std::exception_ptr error;
  std::atomic<bool> finished{false};
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

PoolScheduler::PoolScheduler(const MultiHeadAttention& layer, KvPool& pool, const PoolSchedulerOptions& options)
    : layer_(layer), pool_(pool), options_(options) {
  if (options.token_budget < 1)
    throw Error("options.token_budget", "expected >= 1, got " + std::to_string(options.token_budget));
  if (options.max_wait.count() < 0)
    throw Error("options.max_wait", "expected >= 0 us, got " + std::to_string(options.max_wait.count()));
  if (options.layer < 0 || options.layer >= pool.layers())
    throw Error("options.layer", "expected 0 <= layer < " + std::to_string(pool.layers()) + ", got " +
                                     std::to_string(options.layer));
  if (options.backend == Backend::onednn)
    throw Error("options.backend", "a pool runs on the native and reference backends");
  runner_ = std::thread([this] { run(); });
}

PoolScheduler::~PoolScheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  runner_.join();
}

KvPool::Sequence PoolScheduler::open(std::optional<KvPool::Sequence> prefix) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return prefix ? pool_.fork(*prefix) : pool_.add();
}

void PoolScheduler::close(KvPool::Sequence sequence) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.release(sequence);
}

std::int64_t PoolScheduler::length(KvPool::Sequence sequence) const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return pool_.length(sequence, options_.layer);
}

std::int64_t PoolScheduler::free_blocks() const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return pool_.free_blocks();
}

std::size_t PoolScheduler::batches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return batches_;
}

std::size_t PoolScheduler::tokens_run() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tokens_run_;
}

bool PoolScheduler::step(const PoolStep& step, std::stop_token stop) {
  MhaOptions check;
  check.backend = options_.backend;
  Request r;
  r.step = step;
  r.tokens = step.query.S;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    layer_.check_step(step, pool_, check);  // a bad request fails alone, before it can join a batch
    r.start = pool_.length(step.sequence, options_.layer);
  }
  if (r.tokens == 0) return true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop.stop_requested()) return false;
    if (std::find(busy_.begin(), busy_.end(), step.sequence) != busy_.end())
      throw Error("sequence", "sequence " + std::to_string(step.sequence) + " has a step in progress already");
    busy_.push_back(step.sequence);
    pending_.push_back(&r);
  }
  work_cv_.notify_one();
  {
    std::stop_callback on_stop(stop, [&] {
      bool cancel = false;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        r.stop = true;
        if (!r.in_batch && !r.finished.load(std::memory_order_relaxed)) {
          const auto it = std::find(pending_.begin(), pending_.end(), &r);
          if (it != pending_.end()) pending_.erase(it), r.cancelled = cancel = true;
        }
      }
      if (cancel) finish(&r);
    });
    for (;;) {
      const std::uint32_t epoch = finished_epoch_.load(std::memory_order_acquire);
      if (r.finished.load(std::memory_order_acquire)) break;
      finished_epoch_.wait(epoch, std::memory_order_acquire);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_.erase(std::find(busy_.begin(), busy_.end(), step.sequence));
  }
  if ((r.cancelled || r.error) && r.done > 0) {  // the chunks that ran go again
    std::lock_guard<std::mutex> lock(pool_mutex_);
    pool_.truncate(step.sequence, r.start);
  }
  if (r.cancelled) return false;
  if (r.error) std::rethrow_exception(r.error);
  return true;
}

void PoolScheduler::finish(Request* request) {
  request->finished.store(true, std::memory_order_release);
  finished_epoch_.fetch_add(1, std::memory_order_release);
  finished_epoch_.notify_all();
}

void PoolScheduler::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    if (pending_.size() < last_batch_) {  // the previous batch's streams come back together
      const auto deadline = std::chrono::steady_clock::now() + options_.max_wait;
      work_cv_.wait_until(lock, deadline, [&] { return stopping_ || pending_.size() >= last_batch_; });
      if (stopping_) return;
    }
    if (!pending_.empty()) form_batch(lock);
  }
}

// With the lock held: takes every pending decode step, then prompt chunks, to the token budget
// and the free blocks; runs them (the queue unlocked, the pool locked); requeues unfinished
// prompts at the front and finishes the rest.
void PoolScheduler::form_batch(std::unique_lock<std::mutex>& lock) {
  std::vector<Request*> batch;
  std::vector<std::int64_t> chunk;
  std::vector<PoolStep> steps;
  std::unique_lock<std::mutex> pool_lock(pool_mutex_);
  const std::int64_t free_at_start = pool_.free_blocks();
  std::int64_t free_left = free_at_start;
  double budget = static_cast<double>(options_.token_budget);
  // A prompt chunk of n tokens from position L0 costs n + n (L0 + (n + 1) / 2) / (2 d_model): each
  // token's projections (8 d_model^2 multiply-adds) and its attention over the keys up to it (4
  // d_model a key), in units of one token's projections; a decode step costs 1. So a batch's time
  // stays about the same as a long prompt's later chunks attend to more keys.
  const double per_key = 1.0 / (2.0 * static_cast<double>(layer_.config().d_model));
  auto chunk_cost = [&](const Request* q, std::int64_t n) {
    const double l0 = static_cast<double>(q->start + q->done);
    return static_cast<double>(n) * (1.0 + (l0 + static_cast<double>(n + 1) / 2.0) * per_key);
  };
  std::vector<Request*> failed;
  for (int pass = 0; pass < 2; ++pass)  // decode steps, then prompts
    for (Request* q : pending_) {
      if ((q->tokens == 1) != (pass == 0) || budget < 1.0) continue;
      std::int64_t n = 1;
      if (pass == 1) {  // the longest chunk within the budget (at least a token in an empty batch)
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
      while (n > 0 && pool_.blocks_needed(q->step.sequence, n, options_.layer) > free_left) {
        std::int64_t lo = 0, hi = n;  // fits(lo), !fits(hi)
        while (hi - lo > 1) {
          const std::int64_t mid = lo + (hi - lo) / 2;
          (pool_.blocks_needed(q->step.sequence, mid, options_.layer) <= free_left ? lo : hi) = mid;
        }
        n = lo;
      }
      if (n == 0) {
        if (free_left == free_at_start) failed.push_back(q);  // not even the whole pool's free blocks
        continue;                                              // else: the next batch
      }
      free_left -= pool_.blocks_needed(q->step.sequence, n, options_.layer);
      budget -= pass == 0 ? 1.0 : chunk_cost(q, n);
      q->in_batch = true;
      batch.push_back(q);
      chunk.push_back(n);
      const std::span<const std::int64_t> pos = q->step.positions;
      steps.push_back({rows_of(q->step.query, q->done, n), q->step.sequence, rows_of(q->step.out, q->done, n),
                       pos.size() == static_cast<std::size_t>(q->tokens)
                           ? pos.subspan(static_cast<std::size_t>(q->done), static_cast<std::size_t>(n))
                           : std::span<const std::int64_t>{}});
    }
  for (Request* q : failed) {
    pending_.erase(std::find(pending_.begin(), pending_.end(), q));
    try {
      throw Error("pool", "sequence " + std::to_string(q->step.sequence) + " needs " +
                              std::to_string(pool_.blocks_needed(q->step.sequence, 1, options_.layer)) +
                              " free block(s) for its next token; the pool has " + std::to_string(free_at_start) +
                              " of " + std::to_string(pool_.num_blocks()) + " free");
    } catch (...) {
      q->error = std::current_exception();
    }
    finish(q);
  }
  if (batch.empty()) return;
  for (Request* q : batch) pending_.erase(std::find(pending_.begin(), pending_.end(), q));
  lock.unlock();
  std::exception_ptr failure;
  try {
    MhaOptions opt;
    opt.threads = options_.threads;
    opt.backend = options_.backend;
    layer_.forward_pool(steps, pool_, options_.layer, opt);
  } catch (...) {
    failure = std::current_exception();
  }
  pool_lock.unlock();
  lock.lock();
  last_batch_ = batch.size();
  ++batches_;
  std::vector<Request*> again;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Request* q = batch[i];
    q->in_batch = false;
    if (failure) {
      q->error = failure;
    } else {
      q->done += chunk[i];
      tokens_run_ += static_cast<std::size_t>(chunk[i]);
      if (q->done < q->tokens) {
        if (q->stop) q->cancelled = true;
        else again.push_back(q);
        if (!q->stop) continue;
      }
    }
    finish(q);
  }
  pending_.insert(pending_.begin(), again.begin(), again.end());  // prompts keep their turn
}

}  // namespace simdattn
