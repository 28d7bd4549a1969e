// DecodeScheduler (simdattn/scheduler.hpp): the scheduler's thread runs the batches request threads
// submit.
#include "simdattn/scheduler.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "simdattn/error.hpp"

namespace simdattn {

// A pending or running step. taken and cancelled are guarded by the scheduler's mutex; error is
// written before finished, whose store is the last touch of the request by any thread but its
// own (which may then return and destroy it).
struct DecodeScheduler::Request {
  const DecodeStep* step = nullptr;
  bool taken = false;      // in a batch (running or done)
  bool cancelled = false;  // left the queue before it was taken
  std::exception_ptr error;
  std::atomic<bool> finished{false};
};

DecodeScheduler::DecodeScheduler(const MultiHeadAttention& layer, const DecodeSchedulerOptions& options)
    : layer_(layer), options_(options) {
  if (options.max_batch < 1) throw Error("options.max_batch", "expected >= 1, got 0");
  if (options.max_wait.count() < 0)
    throw Error("options.max_wait", "expected >= 0 us, got " + std::to_string(options.max_wait.count()));
  runner_ = std::thread([this] { run(); });  // last: everything it reads is set
}

DecodeScheduler::~DecodeScheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  forming_cv_.notify_one();  // (a batch forming for steps that were cancelled meanwhile)
  runner_.join();
}

std::size_t DecodeScheduler::batches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return batches_;
}

std::size_t DecodeScheduler::steps_run() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_run_;
}

bool DecodeScheduler::step(const DecodeStep& step, std::stop_token stop) {
  MhaOptions check;
  check.backend = options_.backend;
  layer_.check_step(step, check);  // a bad request fails alone, before it can join a batch
  Request r;
  r.step = &step;
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop.stop_requested()) return false;
  pending_.push_back(&r);
  const bool full = forming_ && pending_.size() >= forming_want_, wake = !full && idle_;
  lock.unlock();
  // (the scheduler outlives its calls: its condition variables can be notified unlocked, so the
  // thread woken does not then wait for this one to release the mutex)
  if (full) forming_cv_.notify_one();  // the batch is full
  else if (wake) work_cv_.notify_one();
  {
    // Cancels the step when a stop is requested while it is pending (runs here at once if it
    // already was).
    std::stop_callback on_stop(stop, [&] {
      bool cancel = false;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        if (!r.taken && !r.cancelled) {
          r.cancelled = cancel = true;
          pending_.erase(std::find(pending_.begin(), pending_.end(), &r));
        }
      }
      if (cancel) finish(&r);
    });
    for (;;) {  // (the epoch is read before the flag: a finish after the read changes it)
      const std::uint32_t epoch = finished_epoch_.load(std::memory_order_acquire);
      if (r.finished.load(std::memory_order_acquire)) break;
      finished_epoch_.wait(epoch, std::memory_order_acquire);
    }
  }  // on_stop is destroyed (waiting out a callback that is running) before r's fields are read
  if (r.cancelled) return false;
  if (r.error) std::rethrow_exception(r.error);
  return true;
}

// Marks the requests finished, then wakes the waiting request threads with one call (rather
// than one wake-up each, in turn, under the mutex: gpt-layer decode, 8 streams at 256 tokens).
void DecodeScheduler::finish(std::span<Request* const> requests) {
  for (Request* q : requests) q->finished.store(true, std::memory_order_release);
  finished_epoch_.fetch_add(1, std::memory_order_release);
  finished_epoch_.notify_all();
}

// The scheduler's thread: a batch whenever steps are pending, until the destructor.
void DecodeScheduler::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    idle_ = true;
    work_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    idle_ = false;
    if (stopping_) return;  // no step is in progress (the destructor's precondition)
    run_batch(lock);
  }
}

// With the lock held: waits (bounded) for the batch to fill, takes the pending steps, runs them
// unlocked, counts the batch, then finishes its requests (unlocked).
void DecodeScheduler::run_batch(std::unique_lock<std::mutex>& lock) {
  const std::size_t want = std::min(last_batch_, options_.max_batch);
  if (pending_.size() < want) {
    forming_ = true;
    forming_want_ = want;
    const auto deadline = std::chrono::steady_clock::now() + options_.max_wait;
    forming_cv_.wait_until(lock, deadline, [&] { return stopping_ || pending_.size() >= want; });
    forming_ = false;
  }
  MhaOptions opt;
  opt.threads = options_.threads;
  opt.backend = options_.backend;
  std::vector<Request*> batch;
  std::vector<DecodeStep> steps;
  try {  // room for the whole batch first: nothing below allocates
    const std::size_t n = std::min(pending_.size(), options_.max_batch);
    batch.reserve(n);
    steps.reserve(n);
  } catch (...) {  // no memory to form a batch: the first pending step fails with it
    Request* q = pending_.front();
    pending_.pop_front();
    q->taken = true;
    q->error = std::current_exception();
    finish(q);
    return;
  }
  for (auto it = pending_.begin(); it != pending_.end() && batch.size() < options_.max_batch;) {
    const bool same_cache = std::any_of(steps.begin(), steps.end(), [&](const DecodeStep& s) {
      return s.cache == (*it)->step->cache;
    });
    if (same_cache) {  // the cache's next step waits for this one
      ++it;
      continue;
    }
    (*it)->taken = true;
    try {  // checked again now: its cache may have moved on since it was submitted
      layer_.check_step(*(*it)->step, opt);
    } catch (...) {
      Request* q = *it;
      it = pending_.erase(it);
      q->error = std::current_exception();
      finish(q);
      continue;
    }
    batch.push_back(*it);
    steps.push_back(*(*it)->step);
    it = pending_.erase(it);
  }
  if (batch.empty()) return;  // every pending step was cancelled or refused meanwhile
  lock.unlock();
  std::exception_ptr failure;
  try {
    layer_.forward_batch(steps, opt);
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  last_batch_ = batch.size();
  ++batches_;
  steps_run_ += batch.size();  // (counted before any of its steps returns)
  lock.unlock();
  for (Request* q : batch) q->error = failure;
  finish(batch);  // (taken: nothing else touches them meanwhile)
  lock.lock();
}

}  // namespace simdattn
