// Which threads the parallel loops run on (threading.hpp's run_parallel): the calling thread's
// team (team.hpp: bounded spin, then a futex sleep) or OpenMP's (the host's libgomp pool when the
// host is an OpenMP program: PyTorch, oneDNN, OpenBLAS's OpenMP builds). The choice is
// set_thread_runtime()'s, else SIMDATTN_THREAD_RUNTIME's (team|openmp, read once), else the
// default: team, or what an entry point for OpenMP hosts set (set_default_thread_runtime).
#pragma once

#include "simdattn/runtime.hpp"

namespace simdattn::detail {

// The runtime in use: one relaxed load once decided.
ThreadRuntime current_thread_runtime() noexcept;
void set_current_thread_runtime(ThreadRuntime r) noexcept;  // chosen: defaults no longer apply
// r while the runtime was not chosen (set_current_thread_runtime, SIMDATTN_THREAD_RUNTIME).
void set_default_runtime(ThreadRuntime r) noexcept;

}  // namespace simdattn::detail
