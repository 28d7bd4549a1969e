// The thread runtime switch (thread_runtime.hpp) and its public calls (simdattn/runtime.hpp).
#include "runtime/thread_runtime.hpp"

#include <atomic>
#include <optional>

#include "core/validate/validate.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

constexpr int kUndecided = -1;
std::atomic<int> g_runtime{kUndecided};
std::atomic<bool> g_chosen{false};  // by set_thread_runtime (or, when read, the environment)

// SIMDATTN_THREAD_RUNTIME's runtime, if it names one (every computing entry point reports an
// invalid value: core/validate/validate.hpp; here it counts as unset).
std::optional<ThreadRuntime> env_runtime() noexcept {
  try {
    return env_thread_runtime();
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

ThreadRuntime current_thread_runtime() noexcept {
  int v = g_runtime.load(std::memory_order_relaxed);
  if (v == kUndecided) {
    const std::optional<ThreadRuntime> env = env_runtime();
    if (env) g_chosen.store(true, std::memory_order_relaxed);
    int expected = kUndecided;
    g_runtime.compare_exchange_strong(expected, static_cast<int>(env.value_or(ThreadRuntime::team)),
                                      std::memory_order_relaxed);
    v = g_runtime.load(std::memory_order_relaxed);
  }
  return static_cast<ThreadRuntime>(v);
}

void set_current_thread_runtime(ThreadRuntime r) noexcept {
  g_chosen.store(true, std::memory_order_relaxed);
  g_runtime.store(static_cast<int>(r), std::memory_order_relaxed);
}

void set_default_runtime(ThreadRuntime r) noexcept {
  if (g_chosen.load(std::memory_order_relaxed) || env_runtime()) return;
  g_runtime.store(static_cast<int>(r), std::memory_order_relaxed);
}

}  // namespace simdattn::detail

namespace simdattn {

std::string_view thread_runtime_name(ThreadRuntime r) noexcept { return r == ThreadRuntime::openmp ? "openmp" : "team"; }

void set_thread_runtime(ThreadRuntime r) {
  if (r != ThreadRuntime::team && r != ThreadRuntime::openmp)
    throw Error("runtime", "expected ThreadRuntime::team or ThreadRuntime::openmp");
  detail::set_current_thread_runtime(r);
}

ThreadRuntime thread_runtime() noexcept { return detail::current_thread_runtime(); }

void set_default_thread_runtime(ThreadRuntime r) {
  if (r != ThreadRuntime::team && r != ThreadRuntime::openmp)
    throw Error("runtime", "expected ThreadRuntime::team or ThreadRuntime::openmp");
  detail::set_default_runtime(r);
}

}  // namespace simdattn
