// simdattn inside an OpenMP host: a program whose own work runs in OpenMP parallel regions (an
// OpenMP-parallel f32 matmul, as a framework's intra-op GEMM) calls attention() between them.
// Under the team runtime simdattn's own workers wake while the host's OpenMP workers may still be
// spinning (libgomp's wait policy, OMP_WAIT_POLICY / GOMP_SPINCOUNT); under openmp the call runs on
// the host's pool. Measures, in one process and in alternating rounds:
//   quiet  the attention call's time with no host work between calls
//   host   the attention call's time right after each host region
//   loop   one host iteration (the matmul region and the call)
// and prints each one's median and p90 in microseconds, one line per phase (or --json). The quiet
// phase follows the host's work, whose OpenMP workers may still spin (that is the point of the
// host phase); --host-n 0 runs the calls alone in a process with no host work at all, the
// baseline of a quiet host.
//
//   simdattn_host_bench [--runtime team|openmp] [--workload bert] [--host-n 256] [--rounds 30]
//                       [--calls 20] [--threads 0] [--json]
//
// OMP_WAIT_POLICY is read by libgomp when the process starts: compare policies by running the
// program under each (perf/hosts/host_openmp.py runs the grid: runtimes x policies, interleaved).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

// C = A B for n x n row-major f32 matrices, rows split across the host's OpenMP threads.
void host_matmul(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c, int n) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    float* ci = c.data() + static_cast<std::size_t>(i) * n;
    std::fill(ci, ci + n, 0.f);
    for (int k = 0; k < n; ++k) {
      const float aik = a[static_cast<std::size_t>(i) * n + k];
      const float* bk = b.data() + static_cast<std::size_t>(k) * n;
      for (int j = 0; j < n; ++j) ci[j] += aik * bk[j];
    }
  }
}

int usage(const char* why) {
  std::fprintf(stderr, "simdattn_host_bench: %s\nusage: simdattn_host_bench [--runtime team|openmp] [--workload NAME] "
                       "[--host-n N] [--rounds R] [--calls C] [--threads T] [--json]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string runtime = "team", workload = "bert";
  int host_n = 256, rounds = 30, calls = 20, threads = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--json") json = true;
    else if ((a == "--runtime" || a == "--workload" || a == "--host-n" || a == "--rounds" || a == "--calls" ||
              a == "--threads") && (v = value()) != nullptr) {
      if (a == "--runtime") runtime = v;
      else if (a == "--workload") workload = v;
      else if (a == "--host-n") host_n = std::atoi(v);
      else if (a == "--rounds") rounds = std::atoi(v);
      else if (a == "--calls") calls = std::atoi(v);
      else threads = std::atoi(v);
    } else {
      return usage(("unknown or incomplete argument " + a).c_str());
    }
  }
  if (runtime != "team" && runtime != "openmp") return usage("--runtime: expected team or openmp");
  if (host_n < 0 || rounds < 1 || calls < 1 || threads < 0) return usage("expected positive sizes and counts");
  const simdattn::Workload* w = simdattn::find_workload(workload);
  if (w == nullptr) return usage(("--workload: no standard workload " + workload).c_str());
  simdattn::set_thread_runtime(runtime == "openmp" ? simdattn::ThreadRuntime::openmp : simdattn::ThreadRuntime::team);

  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto random = [&](std::size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  const std::vector<float> q = random(static_cast<std::size_t>(w->B * w->H * w->Sq * w->D)),
                           k = random(static_cast<std::size_t>(w->B * w->Hkv * w->Sk * w->D)),
                           v = random(static_cast<std::size_t>(w->B * w->Hkv * w->Sk * w->D));
  std::vector<float> out(q.size());
  const std::size_t nn = static_cast<std::size_t>(host_n) * host_n;
  const std::vector<float> a = random(nn), b = random(nn);
  std::vector<float> c(nn);
  simdattn::AttentionOptions opt;
  opt.causal = w->causal;
  opt.threads = threads;
  auto call = [&] {
    simdattn::attention(simdattn::ConstTensorView(q.data(), {w->B, w->H, w->Sq, w->D}),
                        simdattn::ConstTensorView(k.data(), {w->B, w->Hkv, w->Sk, w->D}),
                        simdattn::ConstTensorView(v.data(), {w->B, w->Hkv, w->Sk, w->D}),
                        simdattn::TensorView(out.data(), {w->B, w->H, w->Sq, w->D}), opt);
  };

  std::vector<double> quiet, host, loop;
  for (int r = 0; r <= rounds; ++r) {  // round 0 warms up (threads, scratch)
    auto quiet_phase = [&] {
      for (int i = 0; i < calls; ++i) {
        const auto t0 = Clock::now();
        call();
        if (r > 0) quiet.push_back(us_since(t0));
      }
    };
    auto host_phase = [&] {
      for (int i = 0; i < calls && host_n > 0; ++i) {
        const auto t0 = Clock::now();
        host_matmul(a, b, c, host_n);
        const auto t1 = Clock::now();
        call();
        if (r > 0) host.push_back(us_since(t1)), loop.push_back(us_since(t0));
      }
    };
    if (r % 2 == 0) quiet_phase(), host_phase();
    else host_phase(), quiet_phase();
  }
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const std::string pol = policy == nullptr || *policy == '\0' ? "default" : policy;
  if (json) {
    std::printf("{\"runtime\": \"%s\", \"omp_wait_policy\": \"%s\", \"workload\": \"%s\", \"host_n\": %d, "
                "\"omp_threads\": %d, \"quiet_us\": [%.1f, %.1f], \"host_us\": [%.1f, %.1f], \"loop_us\": [%.1f, %.1f]}\n",
                runtime.c_str(), pol.c_str(), workload.c_str(), host_n, omp_get_max_threads(), percentile(quiet, 0.5),
                percentile(quiet, 0.9), percentile(host, 0.5), percentile(host, 0.9), percentile(loop, 0.5),
                percentile(loop, 0.9));
  } else {
    std::printf("runtime %s, OMP_WAIT_POLICY %s, %s, host matmul %d, %d OpenMP threads (median / p90 us)\n",
                runtime.c_str(), pol.c_str(), workload.c_str(), host_n, omp_get_max_threads());
    std::printf("  quiet call  %9.1f %9.1f\n", percentile(quiet, 0.5), percentile(quiet, 0.9));
    std::printf("  host call   %9.1f %9.1f  (%.2fx quiet)\n", percentile(host, 0.5), percentile(host, 0.9),
                percentile(host, 0.5) / percentile(quiet, 0.5));
    std::printf("  host loop   %9.1f %9.1f\n", percentile(loop, 0.5), percentile(loop, 0.9));
  }
  return 0;
}
