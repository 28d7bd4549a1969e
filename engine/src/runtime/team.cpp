// The calling thread's team of workers (team.hpp).
#include "runtime/team.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

namespace simdattn::detail {
namespace {

thread_local bool tl_in_worker = false;  // a team's worker thread
thread_local bool tl_in_region = false;  // a caller running its share of a team call
thread_local int tl_threads_used = 1;     // call_threads_used()

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpinMicros have passed; true if done.
template <class Done>
bool spin_until(Done done) noexcept {
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSpinMicros))
      return false;
  }
}

// Waits until `word` differs from `seen`: spins, then sleeps with `asleep` raised so that the
// thread that changes the word knows to wake it.
template <class T>
void wait_while_equal(const std::atomic<T>& word, T seen, std::atomic<bool>& asleep) noexcept {
  if (spin_until([&] { return word.load(std::memory_order_acquire) != seen; })) return;
  asleep.store(true);  // seq_cst: ordered before the load below, as the waker's change is before its check
  while (word.load() == seen) word.wait(seen);
  asleep.store(false, std::memory_order_relaxed);
}

class Team {
 public:
  Team() = default;
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;
  ~Team() {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& w : workers_) wake(*w);
    for (auto& w : workers_) w->thread.join();
  }

  // Each worker's share is claimed once, by the worker when it wakes or by the caller when it
  // has finished its own share first: a worker that has not started by then (asleep, or waiting
  // for a core another thread holds) costs the call nothing but the share the caller runs in
  // its place, instead of holding the caller at the join for as long as it stays off the CPU.
  void run(int nt, void (*body)(void*, int, int) noexcept, void* context) {
    nt = start_workers(nt);
    body_ = body;
    context_ = context;
    threads_ = nt;
    const std::uint32_t job = ++job_;
    for (int t = 1; t < nt; ++t) workers_[static_cast<std::size_t>(t - 1)]->share.store(kOpen, std::memory_order_release);
    for (int t = 1; t < nt; ++t) wake(*workers_[static_cast<std::size_t>(t - 1)]);
    tl_in_region = true;  // a parallel loop inside the caller's share runs on the caller alone
    body(context, 0, nt);
    for (int t = 1; t < nt; ++t) {
      Worker& w = *workers_[static_cast<std::size_t>(t - 1)];
      int open = kOpen;
      if (w.share.compare_exchange_strong(open, kCaller, std::memory_order_acq_rel)) body(context, t, nt);
      else wait_for(w, job);
    }
    tl_in_region = false;
  }

  int started() const noexcept { return static_cast<int>(workers_.size()); }

 private:
  // A worker's share of the current job: open, or claimed by the worker or by the caller.
  static constexpr int kOpen = 0, kWorker = 1, kCaller = 2;

  struct Worker {
    alignas(64) std::atomic<std::uint32_t> jobs{0};  // jobs handed to this worker so far
    std::atomic<bool> asleep{false};
    std::atomic<int> share{kCaller};                 // nothing to claim until the first job
    alignas(64) std::atomic<std::uint32_t> finished{0};  // the last job whose share it ran
    std::thread thread;
  };

  // Makes sure nt - 1 workers exist; returns the threads the call can have (fewer if the
  // system refuses a thread).
  int start_workers(int nt) noexcept {
    while (static_cast<int>(workers_.size()) < nt - 1) {
      try {
        workers_.push_back(std::make_unique<Worker>());  // listed before its thread starts
      } catch (const std::bad_alloc&) {
        break;
      }
      Worker& w = *workers_.back();
      const int index = static_cast<int>(workers_.size());
      try {
        w.thread = std::thread([this, index, &w] { worker_main(w, index); });
      } catch (...) {  // std::system_error (no thread), or std::bad_alloc (no memory for its state)
        workers_.pop_back();
        break;
      }
    }
    return std::min(nt, static_cast<int>(workers_.size()) + 1);
  }

  void wake(Worker& w) {
    w.jobs.fetch_add(1);  // seq_cst: before the check of asleep, as the sleeper's flag is before its load
    if (w.asleep.load()) w.jobs.notify_one();
  }

  void worker_main(Worker& w, int index) {
    tl_in_worker = true;
    std::uint32_t seen = 0;
    for (;;) {
      wait_while_equal(w.jobs, seen, w.asleep);
      seen = w.jobs.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      // The share of the job published last (a late wake for an earlier job finds the share
      // claimed, or claims the newer job's, whose fields were written before it opened).
      int open = kOpen;
      if (!w.share.compare_exchange_strong(open, kWorker, std::memory_order_acq_rel)) continue;
      const std::uint32_t job = job_;
      body_(context_, index, threads_);
      w.finished.store(job);  // seq_cst: before the check of caller_asleep_, as the caller's flag is before its load
      if (caller_asleep_.load()) w.finished.notify_one();
    }
  }

  // Until worker w has run its share of `job`.
  void wait_for(Worker& w, std::uint32_t job) {
    if (spin_until([&] { return w.finished.load(std::memory_order_acquire) == job; })) return;
    caller_asleep_.store(true);
    for (std::uint32_t f = w.finished.load(); f != job; f = w.finished.load()) w.finished.wait(f);
    caller_asleep_.store(false, std::memory_order_relaxed);
  }

  std::vector<std::unique_ptr<Worker>> workers_;  // worker t - 1 runs body(t)
  void (*body_)(void*, int, int) noexcept = nullptr;             // the current job, written before the wakes
  void* context_ = nullptr;
  int threads_ = 1;
  std::uint32_t job_ = 0;                          // the current job's number, written before the shares open
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
};

Team& calling_thread_team() {
  thread_local Team team;
  return team;
}

int affinity_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  // The process's main thread (its id is the process id): not the calling thread's own mask.
  if (sched_getaffinity(getpid(), sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::atomic<int> g_budget{0};   // 0: the default, affinity_cpus()
std::atomic<int> g_in_use{0};   // threads held by running parallel loops
// When a call last began while another call was running (steady clock, ns; 0: never).
std::atomic<std::int64_t> g_last_overlap{0};

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void set_thread_budget(int threads) noexcept { g_budget.store(std::max(0, threads)); }

int thread_budget() noexcept {
  const int b = g_budget.load(std::memory_order_relaxed);
  if (b > 0) return b;
  static const int cpus = affinity_cpus();
  return cpus;
}

thread_local int tl_call_depth = 0;  // CallScopes open on this thread

ThreadClaim::ThreadClaim(int nt) noexcept : granted_(1) {
  if (nt <= 1) return;
  const int budget = thread_budget();
  // The caller itself: already in use inside a CallScope, else counted here.
  const int self = tl_call_depth > 0 ? 0 : 1;
  // Inside a call, soon after calls overlapped: the calling thread alone (team.hpp).
  if (self == 0) {
    const std::int64_t last = g_last_overlap.load(std::memory_order_relaxed);
    if (last != 0 && now_ns() - last < kOverlapWindowMicros * 1000) return;
  }
  int used = g_in_use.load(std::memory_order_relaxed);
  int extra = 0;
  do extra = std::clamp(budget - used - self, 0, nt - 1);
  while (!g_in_use.compare_exchange_weak(used, used + self + extra, std::memory_order_relaxed));
  granted_ = 1 + extra;
  counted_ = self + extra;
  tl_threads_used = std::max(tl_threads_used, granted_);
}

ThreadClaim::~ThreadClaim() {
  if (counted_ > 0) g_in_use.fetch_sub(counted_, std::memory_order_relaxed);
}

CallScope::CallScope() noexcept : counted_(tl_call_depth == 0 && !tl_in_worker && !tl_in_region) {
  if (tl_call_depth == 0) tl_threads_used = 1;
  ++tl_call_depth;
  if (counted_ && g_in_use.fetch_add(1, std::memory_order_relaxed) > 0)
    g_last_overlap.store(now_ns(), std::memory_order_relaxed);
}

CallScope::~CallScope() {
  --tl_call_depth;
  if (counted_) g_in_use.fetch_sub(1, std::memory_order_relaxed);
}

int call_threads_used() noexcept { return tl_threads_used; }

void run_on_team(int nt, void (*body)(void*, int, int) noexcept, void* context) {
  if (nt <= 1 || tl_in_worker || tl_in_region) {
    body(context, 0, 1);
    return;
  }
  calling_thread_team().run(nt, body, context);
}

bool in_team_worker() noexcept { return tl_in_worker || tl_in_region; }

int team_workers_started() noexcept { return calling_thread_team().started(); }

}  // namespace simdattn::detail
