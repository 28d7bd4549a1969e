// Verbose mode: one line per public call on stderr (docs/design.md, "Verbose mode"), as
//   simdattn: op=attention backend=native path=fused not=decode16:dtype_f32_(bf16_and_f16_only),... isa=avx512_bf16 ...
// SIMDATTN_VERBOSE in the environment (read on first use) or set_verbose() turns it on. Off, a
// call pays one relaxed load (verbose_on()); nothing is timed or formatted.
//
// A public entry point runs
//   if (!verbose_on()) return run(..., nullptr);
//   VerboseCall call("attention");
//   run(..., &call);     // fills the call's fields once it has its validated problem
//   call.write();        // times, adds isa= and threads=, writes the line
// A call made inside another one on the same thread (the layer's attention core), or on a worker
// the outer call handed its VerboseCall to (VerboseAdopt), writes nothing: it gives its path and
// its passed-over paths to the outer call, whose line names them.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace simdattn::detail {

// 0 off, 1 on, 2 not read from the environment yet.
extern std::atomic<int> g_verbose;
bool verbose_from_environment() noexcept;

// The one test on a call's path when verbose mode is off: a relaxed load.
inline bool verbose_on() noexcept {
  const int v = g_verbose.load(std::memory_order_relaxed);
  return v == 1 || (v == 2 && verbose_from_environment());
}

void set_verbose(bool on) noexcept;

// A value as the line writes it: spaces, '=' and ',' become '_', so that the line splits on
// spaces, each field on its first '=' and a list on ','. "16 query rows > 8" -> "16_query_rows_>_8".
std::string verbose_token(std::string_view text);

// "1x12x128x64"
std::string verbose_shape(std::initializer_list<std::int64_t> dims);

class VerboseCall {
 public:
  explicit VerboseCall(std::string_view op);
  ~VerboseCall();
  VerboseCall(const VerboseCall&) = delete;
  VerboseCall& operator=(const VerboseCall&) = delete;

  // The fields, in the order they are written (empty ones left out); values are tokens.
  std::string backend, path, not_taken, dtype, kv_dtype, opts;
  // A shape or size field, written after kv_dtype= in the order given: shape("q", "1x12x128x64").
  void shape(std::string_view key, std::string_view value);

  // The path a call took and the faster ones that declined ("name:reason,..."): this call's,
  // or, nested, given to the outer call (which keeps each distinct path, joined by '+', and the
  // first nonempty not=). Thread-safe on an outer call (workers report to it side by side).
  void take_path(std::string_view taken, std::string_view declined);

  // A layer's pool step that took the cascade (layer/cache/pool_core.hpp): one item per group,
  // "<sequences>x<shared keys>", in the cascade= field. Nested, given to the outer call.
  void add_cascade(std::string_view item);

  // Threads the call used, when its own parallel loops do not show it (onednn's OpenMP threads).
  // Nested, given to the outer call. Called on the calling thread only.
  void set_threads(int threads) noexcept {
    if (outer_ != nullptr) return outer_->set_threads(threads);
    threads_ = std::max(threads_, threads);
  }

  // Writes the line (outermost calls only; a call that throws writes none).
  void write();

  bool nested() const noexcept { return outer_ != nullptr; }

  // The outermost verbose call this thread runs (null when none).
  static VerboseCall* current() noexcept;

 private:
  friend class VerboseAdopt;
  std::string op_;
  std::string shapes_;  // " q=1x12x128x64 k=..."
  std::string cascade_;
  VerboseCall* outer_;
  std::chrono::steady_clock::time_point start_;
  int threads_ = 0;
  std::mutex paths_;
};

// While alive, calls on this thread (a worker of the outer call) report to `outer`.
class VerboseAdopt {
 public:
  explicit VerboseAdopt(VerboseCall* outer) noexcept;
  ~VerboseAdopt();
  VerboseAdopt(const VerboseAdopt&) = delete;
  VerboseAdopt& operator=(const VerboseAdopt&) = delete;

 private:
  VerboseCall* saved_;
};

}  // namespace simdattn::detail

namespace simdattn::detail {

// A public entry point: run(nullptr) when verbose mode is off (one relaxed load), else
// run(&call) on a VerboseCall named `op`, then its line.
template <class Run>
void verbose_entry(std::string_view op, Run&& run) {
  if (!verbose_on()) return run(static_cast<VerboseCall*>(nullptr));
  VerboseCall call(op);
  run(&call);
  call.write();
}

}  // namespace simdattn::detail
