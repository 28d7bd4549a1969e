// `simdattn compare`: every backend of the build on the same random inputs (docs/design.md's
// command-line contract). For each backend: median wall time of repeated calls after a warm-up,
// GFLOP/s (causal counts visible pairs), % of this machine's FMA peak (measured in the same run),
// and max |O - O_ref| against the reference backend. When the reference would take too long
// (more than kReferenceFullFlops per call), it is not timed and the errors are taken on a sample
// of query rows, every batch and head, which the output says.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "args.hpp"
#include "simdattn/bench.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct CompareArgs {
  std::string workload, b, h, hkv, sq, sk, d, dv, causal, threads;
  bool json = false;
};

// Above this many FLOPs per call the reference (double-precision loops, ~1 GFLOP/s) is not timed
// and checks only a sample of query rows.
constexpr double kReferenceFullFlops = 2e9;
constexpr std::int64_t kSampleRows = 16;
// Timing: at least kMinRuns calls and kMinSeconds per backend, at most kMaxRuns.
constexpr int kMinRuns = 5, kMaxRuns = 200;
constexpr double kMinSeconds = 0.3;
// Refuse problems whose tensors would not fit comfortably in memory.
constexpr double kMaxBytes = 8.0 * (1ull << 30);

struct Problem {
  std::string name;
  std::int64_t B = 1, H = 12, Hkv = 12, Sq = 128, Sk = 128, D = 64, Dv = 64;
  Causal causal = Causal::none;
};

std::string describe(const Problem& p) {
  return "B=" + std::to_string(p.B) + " H=" + std::to_string(p.H) + " Hkv=" + std::to_string(p.Hkv) +
         " Sq=" + std::to_string(p.Sq) + " Sk=" + std::to_string(p.Sk) + " D=" + std::to_string(p.D) +
         " Dv=" + std::to_string(p.Dv) + " causal=" + std::string(causal_name(p.causal));
}

Problem make_problem(const CompareArgs& a) {
  const bool explicit_sizes = !a.b.empty() || !a.h.empty() || !a.hkv.empty() || !a.sq.empty() ||
                              !a.sk.empty() || !a.d.empty() || !a.dv.empty();
  Problem p;
  if (!a.workload.empty() && explicit_sizes)
    throw UsageError("--workload: give either a named workload or explicit sizes (--b --h --hkv --sq "
                     "--sk --d --dv), not both");
  if (explicit_sizes) {
    constexpr std::int64_t kMax = std::int64_t{1} << 31;
    if (!a.b.empty()) p.B = parse_int("--b", a.b, 1, kMax);
    if (!a.h.empty()) p.H = parse_int("--h", a.h, 1, kMax);
    p.Hkv = a.hkv.empty() ? p.H : parse_int("--hkv", a.hkv, 1, kMax);
    if (!a.sq.empty()) p.Sq = parse_int("--sq", a.sq, 1, kMax);
    p.Sk = a.sk.empty() ? p.Sq : parse_int("--sk", a.sk, 1, kMax);
    if (!a.d.empty()) p.D = parse_int("--d", a.d, 1, kMax);
    p.Dv = a.dv.empty() ? p.D : parse_int("--dv", a.dv, 1, kMax);
    if (p.H % p.Hkv != 0)
      throw UsageError("--hkv: expected a divisor of --h " + std::to_string(p.H) + ", got " +
                       std::to_string(p.Hkv));
    if (!a.causal.empty()) p.causal = parse_causal("--causal", a.causal);
    p.name = "custom:" + describe(p);
    for (char& c : p.name)
      if (c == ' ') c = ',';
  } else {
    const std::string name = a.workload.empty() ? "bert" : a.workload;
    const Workload* w = find_workload(name);
    if (w == nullptr) {
      std::string names;
      for (const auto& s : standard_workloads()) names += (names.empty() ? "" : ", ") + std::string(s.name);
      throw UsageError("--workload: unknown workload '" + name + "' (expected one of: " + names + ")");
    }
    p.name = std::string(w->name);
    p.B = w->B, p.H = w->H, p.Hkv = w->Hkv, p.Sq = w->Sq, p.Sk = w->Sk, p.D = w->D, p.Dv = w->D;
    p.causal = w->causal;
    if (!a.causal.empty()) {
      const Causal c = parse_causal("--causal", a.causal);
      if (c != p.causal) p.name += "(causal=" + std::string(causal_name(c)) + ")";
      p.causal = c;
    }
  }
  const double elems = double(p.B) * double(p.H) * double(p.Sq) * double(p.D) +
                       double(p.B) * double(p.Hkv) * double(p.Sk) * double(p.D + p.Dv) +
                       3.0 * double(p.B) * double(p.H) * double(p.Sq) * double(p.Dv);
  if (elems * 4.0 > kMaxBytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f GiB", elems * 4.0 / double(1ull << 30));
    throw UsageError("sizes: " + describe(p) + " needs " + buf + " for inputs and outputs (limit 8 GiB)");
  }
  return p;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  Backend backend;
  bool timed = false;
  int runs = 0;
  double median_ms = 0, gflops = 0, percent_of_peak = 0, max_abs_err = 0;
};

void progress(bool on, const std::string& msg) {
  if (on) std::cerr << "simdattn compare: " << msg << std::endl;
}

void compare(const CompareArgs& a) {
  const Problem p = make_problem(a);
  const int threads = a.threads.empty() ? std::max(1, omp_get_max_threads())
                                        : static_cast<int>(parse_int("--threads", a.threads, 1, 4096));
  const double flops = attention_flops(p.B, p.H, p.Sq, p.Sk, p.D, p.Dv, p.causal);
  const bool full_reference = flops <= kReferenceFullFlops;
  const bool verbose = !full_reference;  // anything that takes more than a few seconds

  // Inputs: standard normal, fixed seed; [B, H, S, D] contiguous.
  const auto numel = [](std::int64_t a0, std::int64_t a1, std::int64_t a2, std::int64_t a3) {
    return static_cast<std::size_t>(a0 * a1 * a2 * a3);
  };
  std::vector<float> q(numel(p.B, p.H, p.Sq, p.D)), k(numel(p.B, p.Hkv, p.Sk, p.D)),
      v(numel(p.B, p.Hkv, p.Sk, p.Dv));
  {
    std::mt19937_64 rng(0);
    std::normal_distribution<float> n(0.f, 1.f);
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = n(rng);
  }
  const ConstTensorView qv(q.data(), {p.B, p.H, p.Sq, p.D}), kv(k.data(), {p.B, p.Hkv, p.Sk, p.D}),
      vv(v.data(), {p.B, p.Hkv, p.Sk, p.Dv});
  const Shape4 oshape{p.B, p.H, p.Sq, p.Dv};
  double max_v = 0.0;
  for (float x : v) max_v = std::max(max_v, double(std::abs(x)));
  const double tolerance = 1e-5 * std::max(1.0, max_v);

  // The FMA peak, measured before and after the backends (this VM's second core is sometimes
  // unavailable for a fraction of a second; the larger of the two is the machine's).
  progress(verbose, "measuring the FMA peak on " + std::to_string(threads) + " threads");
  double peak = measure_fma_peak(threads);

  // The oracle: the reference on every row, or on kSampleRows evenly spaced query rows (each a
  // one-row problem whose causal visibility becomes a key length).
  std::vector<std::int64_t> rows;
  if (full_reference) {
    for (std::int64_t i = 0; i < p.Sq; ++i) rows.push_back(i);
  } else {
    const std::int64_t n = std::min(p.Sq, kSampleRows);
    for (std::int64_t s = 0; s < n; ++s) rows.push_back(n == 1 ? 0 : s * (p.Sq - 1) / (n - 1));
  }
  std::vector<Result> results;
  std::vector<float> ref(numel(p.B, p.H, std::int64_t(rows.size()), p.Dv));
  if (!full_reference) {
    progress(verbose, "reference on " + std::to_string(rows.size()) + " sampled query rows");
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(p.B));
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const std::int64_t i = rows[r];
      AttentionOptions opt;
      opt.backend = Backend::reference;
      std::int64_t visible = p.Sk;
      if (p.causal == Causal::top_left) visible = std::clamp<std::int64_t>(i + 1, 0, p.Sk);
      if (p.causal == Causal::bottom_right) visible = std::clamp<std::int64_t>(i + p.Sk - p.Sq + 1, 0, p.Sk);
      std::fill(lengths.begin(), lengths.end(), visible);
      opt.key_lengths = lengths;
      const ConstTensorView qi(q.data() + i * p.D, {p.B, p.H, 1, p.D}, {p.H * p.Sq * p.D, p.Sq * p.D, p.D, 1});
      const TensorView oi(ref.data() + std::int64_t(r) * p.Dv, {p.B, p.H, 1, p.Dv},
                          {p.H * std::int64_t(rows.size()) * p.Dv, std::int64_t(rows.size()) * p.Dv, p.Dv, 1});
      attention(qi, kv, vv, oi, opt);
    }
  }

  std::vector<float> out(numel(p.B, p.H, p.Sq, p.Dv));
  for (Backend be : {Backend::reference, Backend::native, Backend::onednn}) {
    if (!backend_available(be)) continue;
    if (be == Backend::reference && !full_reference) continue;
    const std::string bname(backend_name(be));
    AttentionOptions opt;
    opt.backend = be;
    opt.causal = p.causal;
    opt.threads = be == Backend::reference ? 1 : threads;  // the reference is single-threaded
    const TensorView ov(out.data(), oshape);
    progress(verbose, "timing " + bname);
    attention(qv, kv, vv, ov, opt);  // warm-up: caches, primitives, page faults
    std::vector<double> times;
    const auto start = std::chrono::steady_clock::now();
    const int min_runs = be == Backend::reference ? 3 : kMinRuns;
    while (int(times.size()) < kMaxRuns &&
           (int(times.size()) < min_runs || seconds_since(start) < kMinSeconds)) {
      const auto t0 = std::chrono::steady_clock::now();
      attention(qv, kv, vv, ov, opt);
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    const std::size_t m = times.size();
    const double median = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
    Result res;
    res.backend = be;
    res.timed = true;
    res.runs = int(m);
    res.median_ms = median * 1e3;
    res.gflops = flops / median * 1e-9;
    if (be == Backend::reference) ref = out;  // full_reference: rows are every row
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t h = 0; h < p.H; ++h)
        for (std::size_t r = 0; r < rows.size(); ++r)
          for (std::int64_t d = 0; d < p.Dv; ++d) {
            const double x = out[std::size_t(((b * p.H + h) * p.Sq + rows[r]) * p.Dv + d)];
            const double y = ref[std::size_t(((b * p.H + h) * std::int64_t(rows.size()) + std::int64_t(r)) * p.Dv + d)];
            const double e = std::isnan(x) != std::isnan(y) ? INFINITY : std::isnan(x) ? 0.0 : std::abs(x - y);
            res.max_abs_err = std::max(res.max_abs_err, e);
          }
    results.push_back(res);
  }

  peak = std::max(peak, measure_fma_peak(threads));
  for (Result& r : results) r.percent_of_peak = 100.0 * r.gflops / peak;

  const std::string checked = full_reference
                                  ? "all " + std::to_string(p.Sq) + " query rows"
                                  : std::to_string(rows.size()) + " of " + std::to_string(p.Sq) +
                                        " query rows (evenly spaced; every batch and head)";
  if (a.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const Result& r : results)
      arr.push_back({{"backend", std::string(backend_name(r.backend))},
                     {"workload", p.name},
                     {"threads", r.backend == Backend::reference ? 1 : threads},
                     {"median_ms", r.median_ms},
                     {"gflops", r.gflops},
                     {"max_abs_err", r.max_abs_err},
                     {"percent_of_peak", r.percent_of_peak},
                     {"runs", r.runs},
                     {"tolerance", tolerance},
                     {"rows_checked", full_reference ? p.Sq : std::int64_t(rows.size())},
                     {"flops", flops},
                     {"peak_gflops", peak}});
    std::cout << arr.dump(2) << std::endl;
  } else {
    char line[256];
    std::cout << "simdattn compare: " << p.name << " (" << describe(p) << "), f32, " << threads
              << (threads == 1 ? " thread" : " threads") << '\n';
    std::snprintf(line, sizeof line, "%.3g GFLOP per call; FMA peak measured now: %.1f GFLOP/s on %d thread(s)\n",
                  flops * 1e-9, peak, threads);
    std::cout << line;
    std::snprintf(line, sizeof line, "%-10s %12s %10s %8s %13s %6s\n", "backend", "median ms", "GFLOP/s",
                  "% peak", "max abs err", "runs");
    std::cout << line;
    for (const Result& r : results) {
      std::snprintf(line, sizeof line, "%-10s %12.3f %10.1f %7.1f%% %13.3g %6d%s\n",
                    std::string(backend_name(r.backend)).c_str(), r.median_ms, r.gflops, r.percent_of_peak,
                    r.max_abs_err, r.runs, r.backend == Backend::reference ? "  (1 thread)" : "");
      std::cout << line;
    }
    if (!full_reference)
      std::cout << "reference: not timed (" << flops * 1e-9
                << " GFLOP per call would take too long); errors are against it on " << checked << '\n';
    else
      std::cout << "errors: against the reference on " << checked << '\n';
    std::snprintf(line, sizeof line, "tolerance: max abs err <= 1e-5 * max(1, max|V|) = %.3g\n", tolerance);
    std::cout << line;
  }
  for (const Result& r : results)
    if (!(r.max_abs_err <= tolerance))
      throw std::runtime_error(std::string(backend_name(r.backend)) +
                               " disagrees with the reference beyond the tolerance");
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* sub = app.add_subcommand(
      "compare", "Every backend on the same random inputs: median time, GFLOP/s, % of FMA peak, error");
  sub->add_option("--workload", args->workload,
                  "bert | vit | gpt | long | decode | sdcross | batch (default bert)");
  sub->add_option("--b", args->b, "batch size (explicit sizes; default 1)");
  sub->add_option("--h", args->h, "query heads (default 12)");
  sub->add_option("--hkv", args->hkv, "key/value heads, a divisor of --h (default --h)");
  sub->add_option("--sq", args->sq, "query length (default 128)");
  sub->add_option("--sk", args->sk, "key length (default --sq)");
  sub->add_option("--d", args->d, "head size (default 64)");
  sub->add_option("--dv", args->dv, "value head size (default --d)");
  sub->add_option("--causal", args->causal, "none | top-left | bottom-right (default: the workload's)");
  sub->add_option("--threads", args->threads, "threads (>= 1; default: OpenMP's)");
  sub->add_flag("--json", args->json,
                "print a JSON array of {backend, workload, threads, median_ms, gflops, max_abs_err, ...}");
  return [args, sub] {
    if (*sub) compare(*args);
  };
}

}  // namespace simdattn::cli
