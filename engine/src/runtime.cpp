#include "simdattn/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>

#include <omp.h>

#include "simdattn/attention.hpp"
#include "problem.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/isa.hpp"
#include "simdattn/simd/kernels.hpp"
#include "simdattn/version.hpp"

#ifdef SIMDATTN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace simdattn {

void detail::check_isa() {
  try {
    simd::selected_isa();
  } catch (const std::runtime_error& e) {
    throw Error("SIMDATTN_ISA", e.what());
  }
}

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.version = kVersionString;
  detail::check_isa();
  info.isa = std::string(simd::isa_name(simd::selected_isa()));
  info.isa_forced = simd::isa_forced();
  for (simd::Isa isa : simd::available_isas()) info.isas.emplace_back(simd::isa_name(isa));
  info.default_threads = omp_get_max_threads();
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn})
    if (backend_available(b)) info.backends.emplace_back(backend_name(b));
#ifdef SIMDATTN_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  info.onednn_version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                        std::to_string(v->patch);
#endif
  return info;
}

double measure_fma_peak(int threads, double seconds) {
  if (threads < 1) throw Error("threads", "expected >= 1, got " + std::to_string(threads));
  detail::check_isa();
  const auto& probe = simd::kernels().probe;
  constexpr std::int64_t kIters = std::int64_t{1} << 20;  // ~3 ms per chain run at this peak
  const auto start = std::chrono::steady_clock::now();
  double best = 0.0;
  float sink = 0.f;
  for (int run = 0; run < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += probe.fma_chains(kIters, 0.5f + static_cast<float>(omp_get_thread_num()));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(kIters) * probe.flops_per_iter * threads / dt * 1e-9);
  }
  volatile float keep = sink;  // the chains' result must be used
  (void)keep;
  return best;
}

}  // namespace simdattn
