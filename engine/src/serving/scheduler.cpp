// DecodeScheduler (simdattn/scheduler.hpp): the scheduler's thread runs the batches request threads
// submit (the queue, the thread and the wake-ups: batch_queue.hpp, shared with PoolScheduler).
#include "simdattn/scheduler.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "serving/batch_queue.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

// A pending or running step. taken is guarded by the queue's mutex.
struct DecodeRequest : QueuedRequest {
  const DecodeStep* step = nullptr;
  bool taken = false;  // in a batch (running or done)
};

struct DecodeSchedulerState {
  DecodeSchedulerState(const MultiHeadAttention& l, const DecodeSchedulerOptions& o) : layer(l), options(o) {}
  const MultiHeadAttention& layer;
  DecodeSchedulerOptions options;
  BatchQueue<DecodeRequest> queue;
  std::condition_variable forming_cv;  // the runner forming a batch waits here for it to fill
  bool forming = false;                // it waits for forming_want pending steps
  std::size_t forming_want = 0, steps_run = 0;

  void run_batch(std::unique_lock<std::mutex>& lock);
};

// With the lock held: waits (bounded) for the batch to fill, takes the pending steps, runs them
// unlocked, counts the batch, then finishes its requests (unlocked).
void DecodeSchedulerState::run_batch(std::unique_lock<std::mutex>& lock) {
  std::deque<DecodeRequest*>& pending = queue.pending;
  const std::size_t want = std::min(queue.last_batch, options.max_batch);
  if (pending.size() < want) {
    forming = true;
    forming_want = want;
    const auto deadline = std::chrono::steady_clock::now() + options.max_wait;
    forming_cv.wait_until(lock, deadline, [&] { return queue.stopping || pending.size() >= want; });
    forming = false;
  }
  MhaOptions opt;
  opt.threads = options.threads;
  opt.backend = options.backend;
  std::vector<DecodeRequest*> batch;
  std::vector<DecodeStep> steps;
  try {  // room for the whole batch first: nothing below allocates
    const std::size_t n = std::min(pending.size(), options.max_batch);
    batch.reserve(n);
    steps.reserve(n);
  } catch (...) {  // no memory to form a batch: the first pending step fails with it
    DecodeRequest* q = pending.front();
    pending.pop_front();
    q->taken = true;
    q->error = std::current_exception();
    queue.finish(q);
    return;
  }
  for (auto it = pending.begin(); it != pending.end() && batch.size() < options.max_batch;) {
    const bool same_cache = std::any_of(steps.begin(), steps.end(), [&](const DecodeStep& s) {
      return s.cache == (*it)->step->cache;
    });
    if (same_cache) {  // the cache's next step waits for this one
      ++it;
      continue;
    }
    (*it)->taken = true;
    try {  // checked again now: its cache may have moved on since it was submitted
      layer.check_step(*(*it)->step, opt);
    } catch (...) {
      DecodeRequest* q = *it;
      it = pending.erase(it);
      q->error = std::current_exception();
      queue.finish(q);
      continue;
    }
    batch.push_back(*it);
    steps.push_back(*(*it)->step);
    it = pending.erase(it);
  }
  if (batch.empty()) return;  // every pending step was cancelled or refused meanwhile
  lock.unlock();
  std::exception_ptr failure;
  try {
    layer.forward_batch(steps, opt);
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  queue.last_batch = batch.size();
  ++queue.batches;
  steps_run += batch.size();  // (counted before any of its steps returns)
  lock.unlock();
  for (DecodeRequest* q : batch) q->error = failure;
  queue.finish(batch);  // (taken: nothing else touches them meanwhile)
  lock.lock();
}

}  // namespace simdattn::detail

namespace simdattn {

DecodeScheduler::DecodeScheduler(const MultiHeadAttention& layer, const DecodeSchedulerOptions& options)
    : state_(std::make_unique<detail::DecodeSchedulerState>(layer, options)) {
  if (options.max_batch < 1) throw Error("options.max_batch", "expected >= 1, got 0");
  if (options.max_wait.count() < 0)
    throw Error("options.max_wait", "expected >= 0 us, got " + std::to_string(options.max_wait.count()));
  detail::DecodeSchedulerState* s = state_.get();
  s->queue.start([s](std::unique_lock<std::mutex>& lock) { s->run_batch(lock); });  // last: everything it reads is set
}

DecodeScheduler::~DecodeScheduler() { state_->queue.stop(&state_->forming_cv); }  // (a batch forming for steps cancelled meanwhile)

std::size_t DecodeScheduler::batches() const {
  std::lock_guard<std::mutex> lock(state_->queue.mutex);
  return state_->queue.batches;
}

std::size_t DecodeScheduler::steps_run() const {
  std::lock_guard<std::mutex> lock(state_->queue.mutex);
  return state_->steps_run;
}

bool DecodeScheduler::step(const DecodeStep& step, std::stop_token stop) {
  detail::DecodeSchedulerState& s = *state_;
  MhaOptions check;
  check.backend = s.options.backend;
  s.layer.check_step(step, check);  // a bad request fails alone, before it can join a batch
  detail::DecodeRequest r;
  r.step = &step;
  std::unique_lock<std::mutex> lock(s.queue.mutex);
  if (stop.stop_requested()) return false;
  s.queue.pending.push_back(&r);
  const bool full = s.forming && s.queue.pending.size() >= s.forming_want, wake = !full && s.queue.idle;
  lock.unlock();
  // (the scheduler outlives its calls: its condition variables can be notified unlocked, so the
  // thread woken does not then wait for this one to release the mutex)
  if (full) s.forming_cv.notify_one();  // the batch is full
  else if (wake) s.queue.work_cv.notify_one();
  // a stop while the step is pending cancels it (at once if already requested)
  s.queue.wait(r, stop, [&](detail::DecodeRequest& q) {
    if (q.taken || q.cancelled) return false;
    q.cancelled = true;
    return s.queue.remove(&q);
  });
  if (r.cancelled) return false;
  if (r.error) std::rethrow_exception(r.error);
  return true;
}

}  // namespace simdattn
