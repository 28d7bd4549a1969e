// What this build and this machine offer (for `simdattn info` and diagnostics).
#pragma once

#include "simdattn/export.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace simdattn {

struct RuntimeInfo {
  std::string version;               // simdattn version
  std::string isa;                   // ISA the SIMD kernels dispatch to (sse2/avx2/avx512)
  bool isa_forced = false;           // chosen by SIMDATTN_ISA rather than detection
  std::vector<std::string> isas;     // ISAs the CPU supports, best first
  // Why a better ISA than `isa` is not in use, one line each: the CPU has AMX but the OS does not
  // enable its tile state or Linux refused the tile data permission (arch_prctl's error), or
  // SIMDATTN_ISA forces a lower level than the best usable one.
  std::vector<std::string> isa_notes;
  int default_threads = 1;           // threads a call with threads = 0 asks for
  int thread_budget = 1;             // set_thread_budget()
  std::vector<std::string> backends; // backends built in
  std::string onednn_version;        // empty if the oneDNN backend is not built
  // The native backend's paths in the order it tries them, each "name: what it is for"; a
  // call runs the first that takes its problem.
  std::vector<std::string> native_paths;
  std::string thread_runtime;        // the threads parallel loops run on: "team" or "openmp"
};

// Throws Error("SIMDATTN_ISA", ...) if the environment forces an unknown or unavailable ISA.
SIMDATTN_API RuntimeInfo runtime_info();

// The process-wide thread budget: the most threads all concurrent calls of the library use
// together, each call's own thread included (default, or after set_thread_budget(0): the CPUs
// the process may run on, its affinity mask). A lone call gets every thread it asks for; calls
// running at the same time share the budget and run on fewer threads each rather than
// oversubscribing the cores (each always runs on at least its calling thread), and for 10 ms
// after a call began while another was running, calls run on their calling thread alone.
// Results do not depend on it. The onednn backend's OpenMP threads are outside it. Throws
// Error("threads", ...) for a negative value.
SIMDATTN_API void set_thread_budget(int threads);
SIMDATTN_API int thread_budget() noexcept;

// The threads every backend's parallel loops run on. team (the default): each calling thread's
// own workers, which wait for work spinning at most 50 us and then sleep in the kernel, so a
// call never burns a core waiting for a thread another process keeps off the CPU. openmp: OpenMP
// parallel regions, i.e. the host's OpenMP pool (libgomp's, shared with PyTorch, oneDNN, ...)
// when simdattn runs inside an OpenMP program, so the host's spinning workers compute the call
// instead of competing with a second pool for the cores (OMP_NUM_THREADS and the thread budget
// respected). Either way a call made from inside a parallel region runs on its calling thread,
// and results are bitwise identical (the work split does not depend on the runtime).
// thread_runtime(): set_thread_runtime()'s choice, else SIMDATTN_THREAD_RUNTIME=team|openmp's,
// else the default: team (beside other processes openmp's spinning teams can make a call 30x
// slower; docs/serving.md, "Thread runtimes"), or what set_default_thread_runtime set: an entry
// point made for OpenMP hosts (simdattn.torch) sets openmp, and a choice, once made, stands.
// Process-wide; calls already running finish on the runtime they started with.
enum class ThreadRuntime { team, openmp };
SIMDATTN_API std::string_view thread_runtime_name(ThreadRuntime r) noexcept;
SIMDATTN_API void set_thread_runtime(ThreadRuntime r);
SIMDATTN_API void set_default_thread_runtime(ThreadRuntime r);
SIMDATTN_API ThreadRuntime thread_runtime() noexcept;

// Verbose mode: one line per public call on stderr (attention, attention_paged, linear_attention,
// a layer's forwards), `simdattn: op=... backend=... path=... not=... isa=... dtype=... threads=...
// time_us=...`, written whole even when threads call at once (docs/design.md, "Verbose mode").
// Off by default; SIMDATTN_VERBOSE set to anything but "" or "0" turns it on (read at the first
// call), set_verbose overrides it for the process. Off, a call pays one relaxed atomic load.
SIMDATTN_API void set_verbose(bool on) noexcept;
SIMDATTN_API bool verbose() noexcept;

}  // namespace simdattn
