// What the two schedulers (DecodeScheduler, PoolScheduler: simdattn/scheduler.hpp,
// pool_scheduler.hpp) share: requests their callers' threads queue, a thread of the scheduler's
// own that forms and runs the batches, and the wake-up of finished requests.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <stop_token>
#include <thread>

namespace simdattn::detail {

// A queued request: its outcome, and `finished`, the last touch of the request by any thread but
// its caller's (which may then return and destroy it). error and cancelled are written before it.
struct QueuedRequest {
  std::exception_ptr error;
  bool cancelled = false;  // left the queue before a batch took it
  std::atomic<bool> finished{false};
};

// R derives from QueuedRequest.
template <class R>
class BatchQueue {
 public:
  mutable std::mutex mutex;          // the queue, the counters and the requests' other fields
  std::condition_variable work_cv;   // the runner waits here, idle, for a request
  std::deque<R*> pending;
  bool stopping = false;             // the destructor asks the runner to end
  std::size_t last_batch = 1;        // requests in the previous batch
  std::size_t batches = 0;

  // Starts the runner: with the mutex held, until stop(), it waits for a pending request, then
  // calls step(lock) (which forms and runs a batch, and may unlock while it runs).
  void start(std::function<void(std::unique_lock<std::mutex>&)> step) {
    runner_ = std::thread([this, step = std::move(step)] {
      std::unique_lock<std::mutex> lock(mutex);
      for (;;) {
        idle = true;
        work_cv.wait(lock, [&] { return stopping || !pending.empty(); });
        idle = false;
        if (stopping) return;  // no request is in progress (the destructors' precondition)
        step(lock);
      }
    });
  }
  // Ends the runner (no request may be in progress); `also` is woken too (a batch forming).
  void stop(std::condition_variable* also = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    work_cv.notify_one();
    if (also != nullptr) also->notify_one();
    if (runner_.joinable()) runner_.join();
  }
  bool idle = false;  // the runner waits on work_cv

  // Marks the requests finished, then wakes the waiting callers with one call (rather than one
  // wake-up each, in turn, under the mutex: gpt-layer decode, 8 streams at 256 tokens); each
  // then checks its own request.
  void finish(std::span<R* const> requests) {
    for (R* q : requests) q->finished.store(true, std::memory_order_release);
    finished_epoch_.fetch_add(1, std::memory_order_release);
    finished_epoch_.notify_all();
  }
  void finish(R* request) { finish({&request, 1}); }

  // The caller's wait for its request r: until it is finished, or, once `stop` is requested,
  // cancelled where cancel(r) (run with the mutex held) takes it out of the queue (true), then
  // finished here.
  template <class Cancel>
  void wait(R& r, std::stop_token stop, Cancel&& cancel) {
    std::stop_callback on_stop(stop, [&] {
      bool cancelled = false;
      {
        std::lock_guard<std::mutex> guard(mutex);
        cancelled = cancel(r);
      }
      if (cancelled) finish(&r);
    });
    for (;;) {  // (the epoch is read before the flag: a finish after the read changes it)
      const std::uint32_t epoch = finished_epoch_.load(std::memory_order_acquire);
      if (r.finished.load(std::memory_order_acquire)) break;
      finished_epoch_.wait(epoch, std::memory_order_acquire);
    }
  }  // on_stop is destroyed (waiting out a callback that is running) before r's fields are read

  // Takes request r out of the queue if it is there (with the mutex held).
  bool remove(R* r) {
    const auto it = std::find(pending.begin(), pending.end(), r);
    if (it == pending.end()) return false;
    pending.erase(it);
    return true;
  }

 private:
  std::atomic<std::uint32_t> finished_epoch_{0};
  std::thread runner_;  // started last (start), joined first (stop)
};

}  // namespace simdattn::detail
