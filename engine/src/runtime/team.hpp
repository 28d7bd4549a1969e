// The threads the engine's parallel loops run on (threading.hpp), in place of OpenMP's.
//
// Each calling thread has its own team of workers, started on first use and kept until the
// thread exits (as OpenMP's runtime keeps a team per master thread). A call hands the team a
// function and runs its own share on the calling thread. What differs from an OpenMP runtime is
// how threads wait: a worker waiting for work, and a caller waiting for its workers, spin for at
// most kSpinMicros and then sleep in the kernel (a futex, through std::atomic::wait). So a call
// never burns its core waiting for a thread that another process keeps off the CPU: two
// processes whose OpenMP teams spin against each other on the same cores can make a call 30x
// slower, whatever the library computes, and OMP_WAIT_POLICY is not ours to set. The spin covers
// the gap between the parallel regions of one call (a layer's GEMMs and attention), so workers
// are awake when the next region starts.
#pragma once

#include <cstdint>

namespace simdattn::detail {

// How long a waiting thread spins before it sleeps.
constexpr std::int64_t kSpinMicros = 50;

// For this long after a call began while another was running, the parallel loops of calls take
// no workers (ThreadClaim).
constexpr std::int64_t kOverlapWindowMicros = 10000;

// Runs body(t, T) for t in [0, T): t = 0 on the calling thread, the others on the calling
// thread's team. T is nt, or fewer when the system refuses to start a thread; nt <= 1, or a call
// from a team's worker (no nesting), runs body(0, 1) on the calling thread alone. body must not
// throw.
void run_on_team(int nt, void (*body)(void*, int, int) noexcept, void* context);

// (An exception escaping body ends the process, as one escaping an OpenMP region does.)
template <class Body>
void run_on_team(int nt, Body& body) {
  run_on_team(nt, [](void* c, int t, int T) noexcept { (*static_cast<Body*>(c))(t, T); }, &body);
}

// The process-wide thread budget: the most threads all concurrent calls of the library use
// together. The threads in use are every calling thread inside a library call (CallScope), busy
// whether or not it is in a parallel loop, plus the workers the running loops hold. A loop
// asking for nt threads gets its caller plus min(nt - 1, budget - threads in use) workers, and
// gives them back when done: a lone call uses every core it asks for, and under load concurrent
// calls run side by side on fewer threads each, waking no worker that would only take a core
// from another call. And for kOverlapWindowMicros after a call began while another was running,
// a loop inside a call (CallScope) gets its caller alone: requests are arriving from several
// threads, and one that took workers now would share their cores with the next arrival's
// thread and wait at its join for a worker put off its core (a bert call of 0.3 ms whose worker
// sleeps takes 75 us to several ms to wake on a VM's idle vCPU), where calls on one thread each
// run side by side without waiting on each other. Results do not depend on how many threads a
// call gets.
class ThreadClaim {
 public:
  explicit ThreadClaim(int nt) noexcept;
  ~ThreadClaim();
  ThreadClaim(const ThreadClaim&) = delete;
  ThreadClaim& operator=(const ThreadClaim&) = delete;
  int threads() const noexcept { return granted_; }

 private:
  int granted_;
  int counted_ = 0;  // threads added to those in use
};

// While alive, the calling thread counts as in use (the public entry points: attention,
// linear_attention, a layer's forward). Nested scopes, and scopes on a team's worker, count once.
class CallScope {
 public:
  CallScope() noexcept;
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  bool counted_;
};

// The most threads one parallel loop of the calling thread's current call ran on (its own thread
// included): the outermost CallScope starts it at 1, each ThreadClaim raises it to what it was
// granted. What verbose mode reports as threads=.
int call_threads_used() noexcept;

// The budget: set_thread_budget(0) restores the default, the CPUs the process may run on (its
// affinity mask) at first use.
void set_thread_budget(int threads) noexcept;
int thread_budget() noexcept;

// True on a team's worker thread, and on a caller while it runs its own share of a team call:
// a parallel loop started there runs on that thread alone (no nesting).
bool in_team_worker() noexcept;

// Workers the calling thread's team has started so far (for tests).
int team_workers_started() noexcept;

}  // namespace simdattn::detail
