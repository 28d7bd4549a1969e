// The thread runtime switch (thread_runtime.hpp) and its public calls (simdattn/runtime.hpp).
#include "runtime/thread_runtime.hpp"

#include <atomic>

#include "core/validate.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

constexpr int kUndecided = -1;
std::atomic<int> g_runtime{kUndecided};

// SIMDATTN_THREAD_RUNTIME's runtime, team when it is unset or invalid (every computing entry
// point reports an invalid one: core/validate.hpp).
ThreadRuntime env_or_team() noexcept {
  try {
    return env_thread_runtime();
  } catch (const Error&) {
    return ThreadRuntime::team;
  }
}

}  // namespace

ThreadRuntime current_thread_runtime() noexcept {
  int v = g_runtime.load(std::memory_order_relaxed);
  if (v == kUndecided) {
    int expected = kUndecided;
    g_runtime.compare_exchange_strong(expected, static_cast<int>(env_or_team()), std::memory_order_relaxed);
    v = g_runtime.load(std::memory_order_relaxed);
  }
  return static_cast<ThreadRuntime>(v);
}

void set_current_thread_runtime(ThreadRuntime r) noexcept { g_runtime.store(static_cast<int>(r), std::memory_order_relaxed); }

}  // namespace simdattn::detail

namespace simdattn {

std::string_view thread_runtime_name(ThreadRuntime r) noexcept { return r == ThreadRuntime::openmp ? "openmp" : "team"; }

void set_thread_runtime(ThreadRuntime r) {
  if (r != ThreadRuntime::team && r != ThreadRuntime::openmp)
    throw Error("runtime", "expected ThreadRuntime::team or ThreadRuntime::openmp");
  detail::set_current_thread_runtime(r);
}

ThreadRuntime thread_runtime() noexcept { return detail::current_thread_runtime(); }

}  // namespace simdattn
