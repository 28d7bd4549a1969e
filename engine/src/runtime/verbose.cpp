// Verbose mode's switch and its lines (verbose.hpp).
#include "runtime/verbose.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/team.hpp"
#include "runtime/thread_runtime.hpp"
#include "simdattn/simd/isa.hpp"

namespace simdattn::detail {

std::atomic<int> g_verbose{2};

namespace {

thread_local VerboseCall* tl_current = nullptr;

// SIMDATTN_VERBOSE: unset, empty or "0" is off, anything else on.
bool environment_says_on() noexcept {
  const char* env = std::getenv("SIMDATTN_VERBOSE");
  return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
}

// The whole line with one write(2) per attempt, under a lock: a short write (a full pipe, a
// signal) continues where it stopped before another thread's line can start.
void write_line(const std::string& line) noexcept {
  static std::mutex lock;
  const std::lock_guard<std::mutex> hold(lock);
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed: the line is lost, the call is not
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void field(std::string& line, std::string_view key, std::string_view value) {
  if (value.empty()) return;
  line += ' ';
  line += key;
  line += '=';
  line += value;
}

}  // namespace

bool verbose_from_environment() noexcept {
  int expected = 2;
  g_verbose.compare_exchange_strong(expected, environment_says_on() ? 1 : 0, std::memory_order_relaxed);
  return g_verbose.load(std::memory_order_relaxed) == 1;
}

void set_verbose(bool on) noexcept { g_verbose.store(on ? 1 : 0, std::memory_order_relaxed); }

std::string verbose_token(std::string_view text) {
  std::string s(text);
  for (char& c : s)
    if (c == ' ' || c == '=' || c == ',' || c == '\n' || c == '\t') c = '_';
  return s;
}

std::string verbose_shape(std::initializer_list<std::int64_t> dims) {
  std::string s;
  for (std::int64_t d : dims) {
    if (!s.empty()) s += 'x';
    s += std::to_string(d);
  }
  return s;
}

VerboseCall::VerboseCall(std::string_view op)
    : op_(op), outer_(tl_current), start_(std::chrono::steady_clock::now()) {
  if (outer_ == nullptr) tl_current = this;
}

VerboseCall::~VerboseCall() {
  if (outer_ == nullptr) tl_current = nullptr;
}

void VerboseCall::shape(std::string_view key, std::string_view value) { field(shapes_, key, value); }

VerboseCall* VerboseCall::current() noexcept { return tl_current; }

void VerboseCall::take_path(std::string_view taken, std::string_view declined) {
  if (outer_ != nullptr) return outer_->take_path(taken, declined);
  const std::lock_guard<std::mutex> hold(paths_);
  bool seen = false;
  for (std::size_t at = 0; at <= path.size() && !path.empty();) {
    const std::size_t end = std::min(path.find('+', at), path.size());
    if (std::string_view(path).substr(at, end - at) == taken) seen = true;
    at = end + 1;
  }
  if (!seen) {
    if (!path.empty()) path += '+';
    path += taken;
  }
  if (not_taken.empty()) not_taken = declined;
}

void VerboseCall::add_cascade(std::string_view item) {
  if (outer_ != nullptr) return outer_->add_cascade(item);
  const std::lock_guard<std::mutex> hold(paths_);
  if (!cascade_.empty()) cascade_ += ',';
  cascade_ += item;
}

void VerboseCall::write() {
  if (outer_ != nullptr) return;
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
  std::string line = "simdattn:";
  field(line, "op", op_);
  field(line, "backend", backend);
  field(line, "path", path);
  field(line, "not", not_taken.empty() ? std::string_view("-") : std::string_view(not_taken));
  field(line, "isa", simd::isa_name(simd::selected_isa()));
  field(line, "dtype", dtype);
  field(line, "kv_dtype", kv_dtype);
  line += shapes_;
  field(line, "opts", opts.empty() ? std::string_view("-") : std::string_view(opts));
  field(line, "cascade", cascade_);
  field(line, "threads", std::to_string(std::max(threads_, call_threads_used())));
  field(line, "runtime", thread_runtime_name(current_thread_runtime()));
  char time[32];
  std::snprintf(time, sizeof time, "%.1f", us);
  field(line, "time_us", time);
  line += '\n';
  write_line(line);
}

VerboseAdopt::VerboseAdopt(VerboseCall* outer) noexcept : saved_(tl_current) {
  if (outer != nullptr) tl_current = outer;
}

VerboseAdopt::~VerboseAdopt() { tl_current = saved_; }

}  // namespace simdattn::detail
