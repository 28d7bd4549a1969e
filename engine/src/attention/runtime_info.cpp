// runtime_info(): what this build and this machine run (ISA, threads, backends, the native
// paths), and the public thread-budget calls.
#include "simdattn/runtime.hpp"

#include <algorithm>
#include <string>

#include <omp.h>

#include "attention/native/native.hpp"
#include "core/validate/validate.hpp"
#include "runtime/team.hpp"
#include "runtime/thread_runtime.hpp"
#include "runtime/verbose.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/isa.hpp"
#include "simdattn/version.hpp"

#ifdef SIMDATTN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace simdattn {

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.version = kVersionString;
  detail::check_isa();
  info.isa = std::string(simd::isa_name(simd::selected_isa()));
  info.isa_forced = simd::isa_forced();
  for (simd::Isa isa : simd::available_isas()) info.isas.emplace_back(simd::isa_name(isa));
  info.isa_notes = simd::isa_notes();  // the CPU has AMX but the OS does not let it be used
  const auto& usable = simd::available_isas();
  if (info.isa_forced && simd::selected_isa() != usable.front())
    info.isa_notes.push_back(std::string(simd::isa_name(usable.front())) + ": usable here but not used: SIMDATTN_ISA=" +
                             info.isa + " forces a lower level");
  info.thread_budget = detail::thread_budget();
  info.thread_runtime = std::string(thread_runtime_name(thread_runtime()));
  info.default_threads = std::max(1, std::min(omp_get_max_threads(), info.thread_budget));
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn})
    if (backend_available(b)) info.backends.emplace_back(backend_name(b));
  for (const detail::NativePath& path : detail::native_paths())
    info.native_paths.push_back(std::string(path.name) + ": " + std::string(path.what));
#ifdef SIMDATTN_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  info.onednn_version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                        std::to_string(v->patch);
#endif
  return info;
}

void set_thread_budget(int threads) {
  if (threads < 0) throw Error("threads", "expected >= 0 (0 = the CPUs of the process's affinity), got " + std::to_string(threads));
  detail::set_thread_budget(threads);
}

int thread_budget() noexcept { return detail::thread_budget(); }

void set_verbose(bool on) noexcept { detail::set_verbose(on); }

bool verbose() noexcept { return detail::verbose_on(); }

}  // namespace simdattn
