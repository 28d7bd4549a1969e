// The team of worker threads the engine's parallel loops run on (engine/src/runtime/team.hpp): every
// share runs exactly once, the caller takes share 0 and any share whose worker has not started
// when the caller is done, nothing nests, sleeping workers wake, concurrent callers each get
// their own team, and a thread's team ends with it.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "simdattn/error.hpp"
#include "simdattn/runtime.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"

using simdattn::detail::run_on_team;

namespace {

// Runs one team call of nt shares; checks each share ran once with T == nt and share 0 on the
// calling thread. The caller's share waits (up to a second) until every other share has
// started: those then run on workers, each on a thread of its own (a share whose worker has not
// started when the caller is done is the caller's to run; here the caller is never done first).
void check_one_call(int nt) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(nt));
  std::vector<std::thread::id> ids(static_cast<std::size_t>(nt));
  std::atomic<int> wrong_T{0}, started{0};
  auto body = [&](int t, int T) {
    if (T != nt) wrong_T.fetch_add(1);
    runs[static_cast<std::size_t>(t)].fetch_add(1);
    ids[static_cast<std::size_t>(t)] = std::this_thread::get_id();
    started.fetch_add(1);
    if (t == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (started.load() < nt && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    }
  };
  run_on_team(nt, body);
  CHECK(wrong_T.load() == 0);
  for (const auto& r : runs) CHECK(r.load() == 1);
  CHECK(ids[0] == std::this_thread::get_id());
  CHECK(std::set<std::thread::id>(ids.begin(), ids.end()).size() == static_cast<std::size_t>(nt));
}

}  // namespace

TEST_CASE("team: each share runs once, share 0 on the caller, each on a thread of its own") {
  for (int nt : {1, 2, 3, 5, 2, 7}) check_one_call(nt);
  CHECK(simdattn::detail::team_workers_started() >= 6);  // the largest team asked for, less the caller
}

TEST_CASE("team: a share whose worker has not started when the caller is done runs on the caller") {
  // The caller's share is empty, so the caller is done at once; each worker's share blocks until
  // released. Whatever the timing, every share runs exactly once, and the call returns.
  for (int i = 0; i < 200; ++i) {
    std::vector<std::atomic<int>> runs(3);
    std::atomic<int> on_caller{0};
    const std::thread::id me = std::this_thread::get_id();
    auto body = [&](int t, int) {
      runs[static_cast<std::size_t>(t)].fetch_add(1);
      if (t > 0 && std::this_thread::get_id() == me) on_caller.fetch_add(1);
    };
    run_on_team(3, body);
    for (const auto& r : runs) CHECK(r.load() == 1);
    CHECK(on_caller.load() <= 2);
  }
  // A worker kept off the CPU cannot hold the caller: put every worker to sleep, then a call
  // whose shares are trivial completes with each share run once.
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  std::vector<std::atomic<int>> runs(5);
  auto body = [&](int t, int) { runs[static_cast<std::size_t>(t)].fetch_add(1); };
  run_on_team(5, body);
  for (const auto& r : runs) CHECK(r.load() == 1);
}

TEST_CASE("team: workers asleep after a pause wake for the next call") {
  for (int i = 0; i < 5; ++i) {
    // Well past the spin (kSpinMicros): workers and caller go to sleep in between.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    check_one_call(3);
  }
}

TEST_CASE("team: a call from inside a share (the caller's or a worker's) runs on that thread alone") {
  std::atomic<int> nested_runs{0}, nested_on_other_thread{0}, nested_T_not_1{0};
  auto body = [&](int, int) {
    const std::thread::id me = std::this_thread::get_id();
    auto inner = [&](int, int T) {
      nested_runs.fetch_add(1);
      if (T != 1) nested_T_not_1.fetch_add(1);
      if (std::this_thread::get_id() != me) nested_on_other_thread.fetch_add(1);
    };
    CHECK(simdattn::detail::in_team_worker());
    run_on_team(4, inner);
  };
  run_on_team(3, body);
  CHECK_FALSE(simdattn::detail::in_team_worker());  // the caller, after the call
  CHECK(nested_runs.load() == 3);  // the caller's share and the two workers', each alone
  CHECK(nested_T_not_1.load() == 0);
  CHECK(nested_on_other_thread.load() == 0);
}

TEST_CASE("team: many back-to-back calls and concurrent callers add up") {
  constexpr int kCalls = 2000;
  std::atomic<long> total{0};
  auto caller = [&](int nt) {
    for (int i = 0; i < kCalls; ++i) {
      auto body = [&](int t, int) { total.fetch_add(t + 1); };
      run_on_team(nt, body);
    }
  };
  std::vector<std::thread> callers;
  for (int nt : {2, 3, 4}) callers.emplace_back(caller, nt);
  caller(2);
  for (auto& c : callers) c.join();  // each caller's team ends with its thread
  // sum over calls of 1 + 2 + ... + nt
  CHECK(total.load() == long(kCalls) * (3 + 6 + 10 + 3));
}

TEST_CASE("team: parallel_shares hands out every item exactly once, also with stealing") {
  for (int nt : {1, 2, 3, 8}) {
    std::vector<std::int64_t> prefix{0};
    for (int i = 0; i < 500; ++i) prefix.push_back(prefix.back() + 1 + (i % 7 == 0 ? 40 : 0));
    std::vector<std::atomic<int>> hits(500);
    simdattn::detail::parallel_shares(prefix, nt, [&](auto next_run) {
      for (auto run = next_run(); run.first < run.second; run = next_run())
        for (std::int64_t i = run.first; i < run.second; ++i) {
          if (i % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // uneven: others steal
          hits[static_cast<std::size_t>(i)].fetch_add(1);
        }
    });
    for (const auto& h : hits) CHECK(h.load() == 1);
  }
}

TEST_CASE("team: concurrent calls share the thread budget, a lone call gets all it asks for") {
  const int saved = simdattn::thread_budget();
  simdattn::set_thread_budget(4);
  {  // alone: every thread asked for
    int got = 0;
    simdattn::detail::run_parallel(3, [&](int t, int T) {
      if (t == 0) got = T;  // the caller's share: read after the call
    });
    CHECK(got == 3);
  }
  // Four callers, each asking for 3 threads, with bodies long enough to overlap. A call gets
  // workers only while the threads in use are below the budget, and always runs on its own
  // thread, so at no time do more than budget + callers - 1 = 7 bodies run (without the budget
  // up to 12 would).
  std::atomic<int> running{0}, most{0};
  auto caller = [&] {
    for (int i = 0; i < 20; ++i)
      simdattn::detail::run_parallel(3, [&](int, int) {
        const int now = running.fetch_add(1) + 1;
        for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        running.fetch_sub(1);
      });
  };
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) callers.emplace_back(caller);
  caller();
  for (auto& c : callers) c.join();
  CHECK(most.load() >= 2);
  CHECK(most.load() <= 7);
  CHECK_THROWS_AS(simdattn::set_thread_budget(-1), simdattn::Error);
  simdattn::set_thread_budget(0);  // the default: the process's CPUs
  CHECK(simdattn::thread_budget() >= 1);
  simdattn::set_thread_budget(saved);
}

TEST_CASE("team: soon after two calls overlap, a call takes no workers, later a lone call gets all again") {
  using simdattn::detail::CallScope;
  using simdattn::detail::ThreadClaim;
  using Clock = std::chrono::steady_clock;
  const int saved = simdattn::thread_budget();
  simdattn::set_thread_budget(4);
  auto threads_of_a_call = [] {  // a call (CallScope) whose loop asks for 3 threads
    const CallScope call;
    const ThreadClaim claim(3);
    return claim.threads();
  };
  const auto window = std::chrono::microseconds(simdattn::detail::kOverlapWindowMicros);
  std::this_thread::sleep_for(window + std::chrono::milliseconds(5));  // past any overlap of earlier cases
  CHECK(threads_of_a_call() == 3);
  // Another thread is inside a call while this one starts one: with the budget alone it would
  // get 3 (4 less the other call's thread); the overlap leaves it its own thread.
  std::atomic<bool> inside{false}, release{false};
  std::thread other([&] {
    const CallScope call;
    inside = true;
    while (!release) std::this_thread::yield();
  });
  while (!inside) std::this_thread::yield();
  const auto overlap = Clock::now();
  const int during = threads_of_a_call();
  release = true;
  other.join();
  const int after = threads_of_a_call();  // alone again, soon after the overlap
  const bool soon = Clock::now() - overlap < window;
  CHECK(during == 1);
  if (soon) CHECK(after == 1);
  std::this_thread::sleep_for(window + std::chrono::milliseconds(5));
  CHECK(threads_of_a_call() == 3);
  simdattn::set_thread_budget(saved);
}
