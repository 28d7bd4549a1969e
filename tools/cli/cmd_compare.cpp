// `simdattn compare`: every backend of the build on the same random inputs (docs/cli.md's
// command-line contract). For each backend: median wall time of repeated calls after a warm-up,
// GFLOP/s (causal counts visible pairs), % of the peak that applies to the dtype here (measured in
// the same run, measure_peak: the AMX tile peak for bf16 on AMX, vdpbf16ps's for bf16 where the
// attention's products run on it (AMD), half the f32 FMA peak for f64,
// else the f32 FMA peak; the table's header names it), and max |O - O_ref| against the reference
// backend. When the reference would take too long
// (more than kReferenceFullFlops per call), it is not timed and the errors are taken on a sample
// of query rows, every batch and head, which the output says. --dtype runs every backend that
// takes it here on the same inputs rounded to it (the reference computes in f64 and rounds its
// output to the dtype), within docs/design.md's tolerance for that dtype.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include "args.hpp"
#include "simdattn/bench.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct CompareArgs {
  std::string workload, b, h, hkv, sq, sk, d, dv, causal, threads, dtype;
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

// Explicit sizes start from bert's; --hkv, --sk and --dv default to --h, --sq and --d.
Problem sized_problem(const CompareArgs& a) {
  constexpr std::int64_t kMax = std::int64_t{1} << 31;
  Problem p;
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
  std::replace(p.name.begin(), p.name.end(), ' ', ',');
  return p;
}

// A standard workload (default bert); a --causal other than its own is added to its name.
Problem named_problem(const CompareArgs& a) {
  const std::string name = a.workload.empty() ? "bert" : a.workload;
  const Workload* w = find_workload(name);
  if (w == nullptr) {
    std::string names;
    for (const auto& s : standard_workloads()) names += (names.empty() ? "" : ", ") + std::string(s.name);
    throw UsageError("--workload: unknown workload '" + name + "' (expected one of: " + names + ")");
  }
  Problem p;
  p.name = std::string(w->name);
  p.B = w->B, p.H = w->H, p.Hkv = w->Hkv, p.Sq = w->Sq, p.Sk = w->Sk, p.D = w->D, p.Dv = w->D;
  p.causal = w->causal;
  if (!a.causal.empty()) {
    const Causal c = parse_causal("--causal", a.causal);
    if (c != p.causal) p.name += "(causal=" + std::string(causal_name(c)) + ")";
    p.causal = c;
  }
  return p;
}

Problem make_problem(const CompareArgs& a, DType dtype) {
  const bool explicit_sizes = !a.b.empty() || !a.h.empty() || !a.hkv.empty() || !a.sq.empty() ||
                              !a.sk.empty() || !a.d.empty() || !a.dv.empty();
  if (!a.workload.empty() && explicit_sizes)
    throw UsageError("--workload: give either a named workload or explicit sizes (--b --h --hkv --sq "
                     "--sk --d --dv), not both");
  const Problem p = explicit_sizes ? sized_problem(a) : named_problem(a);
  const double elems = double(p.B) * double(p.H) * double(p.Sq) * double(p.D) +
                       double(p.B) * double(p.Hkv) * double(p.Sk) * double(p.D + p.Dv) +
                       3.0 * double(p.B) * double(p.H) * double(p.Sq) * double(p.Dv);
  const double bytes = elems * double(dtype_size(dtype));
  if (bytes > kMaxBytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1ull << 30));
    throw UsageError("sizes: " + describe(p) + " needs " + buf + " for inputs and outputs (limit 8 GiB)");
  }
  return p;
}

// An array of `dtype` and `shape`, zeroed.
NpyArray array_of(DType dtype, std::vector<std::int64_t> shape) {
  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.resize(static_cast<std::size_t>(a.numel()) * dtype_size(dtype));
  return a;
}

// docs/design.md's tolerance factor per dtype: max|O - O_ref| <= factor * max(1, max|V|).
double tolerance_factor(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::bf16: return 1e-2;
    case DType::f16: return 2e-3;
    default: return 1e-5;
  }
}

// One comparison: the problem, its inputs ([B, H, S, D] contiguous, in the compared dtype) and the
// oracle's output on the query rows that are checked.
struct Bench {
  Problem p;
  DType dtype = DType::f32;
  int threads = 1;
  double flops = 0;
  bool full_reference = true;  // the reference is timed and checks every row
  NpyArray q, k, v;
  double tolerance = 0;
  std::vector<std::int64_t> rows;
  NpyArray ref;  // [B, H, rows.size(), Dv]

  ConstTensorView q_view() const { return ConstTensorView(q.data.data(), dtype, {p.B, p.H, p.Sq, p.D}); }
  ConstTensorView k_view() const { return ConstTensorView(k.data.data(), dtype, {p.B, p.Hkv, p.Sk, p.D}); }
  ConstTensorView v_view() const { return ConstTensorView(v.data.data(), dtype, {p.B, p.Hkv, p.Sk, p.Dv}); }
  std::int64_t rows_checked() const { return std::int64_t(rows.size()); }
};

// Standard normal inputs from a fixed seed, so that every run times the same numbers (in f32,
// then rounded to the dtype); the tolerance scales with V, which bounds the output.
void make_inputs(Bench& b) {
  const Problem& p = b.p;
  std::mt19937_64 rng(0);
  std::normal_distribution<float> n(0.f, 1.f);
  auto draw = [&](std::vector<std::int64_t> shape) {
    NpyArray a = array_of(DType::f32, std::move(shape));
    for (std::int64_t i = 0; i < a.numel(); ++i) a.as<float>()[i] = n(rng);
    return converted(a, b.dtype);
  };
  b.q = draw({p.B, p.H, p.Sq, p.D});
  b.k = draw({p.B, p.Hkv, p.Sk, p.D});
  b.v = draw({p.B, p.Hkv, p.Sk, p.Dv});
  double max_v = 0.0;
  for (std::int64_t i = 0; i < b.v.numel(); ++i) max_v = std::max(max_v, std::abs(element(b.v, std::size_t(i))));
  b.tolerance = tolerance_factor(b.dtype) * std::max(1.0, max_v);
}

// Every query row, or kSampleRows evenly spaced ones when the reference is too slow for all.
std::vector<std::int64_t> checked_rows(const Problem& p, bool full_reference) {
  std::vector<std::int64_t> rows;
  if (full_reference) {
    for (std::int64_t i = 0; i < p.Sq; ++i) rows.push_back(i);
  } else {
    const std::int64_t n = std::min(p.Sq, kSampleRows);
    for (std::int64_t s = 0; s < n; ++s) rows.push_back(n == 1 ? 0 : s * (p.Sq - 1) / (n - 1));
  }
  return rows;
}

// The reference on the sampled rows only: each a one-row problem whose causal visibility becomes
// a key length.
void reference_on_rows(Bench& b) {
  const Problem& p = b.p;
  const std::int64_t n = b.rows_checked();
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(p.B));
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t i = b.rows[std::size_t(r)];
    AttentionOptions opt;
    opt.backend = Backend::reference;
    std::int64_t visible = p.Sk;
    if (p.causal == Causal::top_left) visible = std::clamp<std::int64_t>(i + 1, 0, p.Sk);
    if (p.causal == Causal::bottom_right) visible = std::clamp<std::int64_t>(i + p.Sk - p.Sq + 1, 0, p.Sk);
    std::fill(lengths.begin(), lengths.end(), visible);
    opt.key_lengths = lengths;
    const std::size_t es = dtype_size(b.dtype);
    const ConstTensorView qi(b.q.data.data() + std::size_t(i * p.D) * es, b.dtype, {p.B, p.H, 1, p.D},
                             {p.H * p.Sq * p.D, p.Sq * p.D, p.D, 1});
    const TensorView oi(b.ref.data.data() + std::size_t(r * p.Dv) * es, b.dtype, {p.B, p.H, 1, p.Dv},
                        {p.H * n * p.Dv, n * p.Dv, p.Dv, 1});
    attention(qi, b.k_view(), b.v_view(), oi, opt);
  }
}

// What a peak's name means, for the table's header line.
const char* peak_meaning(std::string_view name) {
  if (name == "amx-bf16") return "AMX tile products, tdpbf16ps: bf16 runs on tiles here";
  if (name == "vdpbf16ps-bf16") return "vdpbf16ps pair products: bf16 attention runs on them here";
  if (name == "fma-f64") return "f64 FMAs, half the f32 FMA peak";
  return "f32 FMAs of the ISA in use";
}

struct Result {
  Backend backend;
  int runs = 0;
  double median_ms = 0, gflops = 0, percent_of_peak = 0, max_abs_err = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void progress(bool on, const std::string& msg) {
  if (on) std::cerr << "simdattn compare: " << msg << std::endl;
}

// A warm-up call (caches, primitives, page faults), then the median of timed calls into `out`.
Result time_backend(const Bench& b, Backend be, NpyArray& out) {
  AttentionOptions opt;
  opt.backend = be;
  opt.causal = b.p.causal;
  opt.threads = be == Backend::reference ? 1 : b.threads;  // the reference is single-threaded
  const TensorView ov(out.data.data(), b.dtype, {b.p.B, b.p.H, b.p.Sq, b.p.Dv});
  progress(!b.full_reference, "timing " + std::string(backend_name(be)));
  attention(b.q_view(), b.k_view(), b.v_view(), ov, opt);
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  const int min_runs = be == Backend::reference ? 3 : kMinRuns;
  while (int(times.size()) < kMaxRuns && (int(times.size()) < min_runs || seconds_since(start) < kMinSeconds)) {
    const auto t0 = std::chrono::steady_clock::now();
    attention(b.q_view(), b.k_view(), b.v_view(), ov, opt);
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const std::size_t m = times.size();
  const double median = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
  Result res;
  res.backend = be;
  res.runs = int(m);
  res.median_ms = median * 1e3;
  res.gflops = b.flops / median * 1e-9;
  return res;
}

// max |O - O_ref| over the checked rows; a NaN on one side only is an infinite error.
double max_abs_error(const Bench& b, const NpyArray& out) {
  const Problem& p = b.p;
  const std::int64_t n = b.rows_checked();
  double err = 0.0;
  for (std::int64_t bi = 0; bi < p.B; ++bi)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          const double x = element(out, std::size_t(((bi * p.H + h) * p.Sq + b.rows[std::size_t(r)]) * p.Dv + d));
          const double y = element(b.ref, std::size_t(((bi * p.H + h) * n + r) * p.Dv + d));
          const double e = std::isnan(x) != std::isnan(y) ? INFINITY : std::isnan(x) ? 0.0 : std::abs(x - y);
          err = std::max(err, e);
        }
  return err;
}

// Every backend of the build that takes the dtype here, the reference first: with full_reference
// its output is the oracle the others are measured against.
std::vector<Result> run_backends(Bench& b) {
  std::vector<Result> results;
  NpyArray out = array_of(b.dtype, {b.p.B, b.p.H, b.p.Sq, b.p.Dv});
  for (Backend be : {Backend::reference, Backend::native, Backend::onednn}) {
    if (!backend_takes(be, b.dtype)) continue;
    if (be == Backend::reference && !b.full_reference) continue;
    Result res = time_backend(b, be, out);
    if (be == Backend::reference) b.ref = out;  // full_reference: rows are every row
    res.max_abs_err = max_abs_error(b, out);
    results.push_back(res);
  }
  return results;
}

void print_json(const Bench& b, const std::vector<Result>& results, const Peak& peak) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Result& r : results)
    arr.push_back({{"backend", std::string(backend_name(r.backend))},
                   {"workload", b.p.name},
                   {"dtype", std::string(dtype_name(b.dtype))},
                   {"threads", r.backend == Backend::reference ? 1 : b.threads},
                   {"median_ms", r.median_ms},
                   {"gflops", r.gflops},
                   {"max_abs_err", r.max_abs_err},
                   {"percent_of_peak", r.percent_of_peak},
                   {"runs", r.runs},
                   {"tolerance", b.tolerance},
                   {"rows_checked", b.full_reference ? b.p.Sq : b.rows_checked()},
                   {"flops", b.flops},
                   {"peak", std::string(peak.name)},
                   {"peak_gflops", peak.gflops}});
  std::cout << arr.dump(2) << std::endl;
}

void print_table(const Bench& b, const std::vector<Result>& results, const Peak& peak) {
  const Problem& p = b.p;
  char line[256];
  std::cout << "simdattn compare: " << p.name << " (" << describe(p) << "), " << dtype_name(b.dtype) << ", " << b.threads
            << (b.threads == 1 ? " thread" : " threads") << '\n';
  std::snprintf(line, sizeof line, "%.3g GFLOP per call; %% peak is of the %s peak (%s): %.1f GFLOP/s on %d thread(s), measured now\n",
                b.flops * 1e-9, std::string(peak.name).c_str(), peak_meaning(peak.name), peak.gflops, b.threads);
  std::cout << line;
  std::snprintf(line, sizeof line, "%-10s %12s %10s %8s %13s %6s\n", "backend", "median ms", "GFLOP/s", "% peak",
                "max abs err", "runs");
  std::cout << line;
  for (const Result& r : results) {
    std::snprintf(line, sizeof line, "%-10s %12.3f %10.1f %7.1f%% %13.3g %6d%s\n",
                  std::string(backend_name(r.backend)).c_str(), r.median_ms, r.gflops, r.percent_of_peak,
                  r.max_abs_err, r.runs, r.backend == Backend::reference ? "  (1 thread)" : "");
    std::cout << line;
  }
  if (!b.full_reference)
    std::cout << "reference: not timed (" << b.flops * 1e-9
              << " GFLOP per call would take too long); errors are against it on " << b.rows.size() << " of "
              << p.Sq << " query rows (evenly spaced; every batch and head)\n";
  else
    std::cout << "errors: against the reference on all " << p.Sq << " query rows\n";
  for (Backend be : {Backend::native, Backend::onednn})
    if (backend_available(be) && !backend_takes(be, b.dtype))
      std::cout << backend_name(be) << ": not run (takes no " << dtype_name(b.dtype) << " inputs here; see simdattn info)\n";
  std::snprintf(line, sizeof line, "tolerance: max abs err <= %g * max(1, max|V|) = %.3g\n", tolerance_factor(b.dtype),
                b.tolerance);
  std::cout << line;
}

void compare(const CompareArgs& a) {
  Bench b;
  b.dtype = a.dtype.empty() ? DType::f32 : parse_dtype("--dtype", a.dtype);
  b.p = make_problem(a, b.dtype);
  b.threads = a.threads.empty() ? std::max(1, omp_get_max_threads()) : parse_threads(a.threads);
  b.flops = attention_flops(b.p.B, b.p.H, b.p.Sq, b.p.Sk, b.p.D, b.p.Dv, b.p.causal);
  b.full_reference = b.flops <= kReferenceFullFlops;
  const bool verbose = !b.full_reference;  // anything that takes more than a few seconds
  make_inputs(b);

  // The peak that applies to the dtype (measure_peak), measured before and after the backends
  // (this VM's second core is sometimes unavailable for a fraction of a second; the larger of the
  // two is the machine's).
  progress(verbose, "measuring the peak on " + std::to_string(b.threads) + " threads");
  Peak peak = measure_peak(b.dtype, b.threads);
  b.rows = checked_rows(b.p, b.full_reference);
  b.ref = array_of(b.dtype, {b.p.B, b.p.H, b.rows_checked(), b.p.Dv});
  if (!b.full_reference) {
    progress(verbose, "reference on " + std::to_string(b.rows.size()) + " sampled query rows");
    reference_on_rows(b);
  }
  std::vector<Result> results = run_backends(b);
  peak.gflops = std::max(peak.gflops, measure_peak(b.dtype, b.threads).gflops);
  for (Result& r : results) r.percent_of_peak = 100.0 * r.gflops / peak.gflops;

  if (a.json) print_json(b, results, peak);
  else print_table(b, results, peak);
  for (const Result& r : results)
    if (!(r.max_abs_err <= b.tolerance))
      throw std::runtime_error(std::string(backend_name(r.backend)) +
                               " disagrees with the reference beyond the tolerance");
}

void add_options(CLI::App& sub, CompareArgs& a) {
  sub.add_option("--workload", a.workload, "bert | vit | gpt | long | decode | sdcross | batch (default bert)");
  sub.add_option("--b", a.b, "batch size (explicit sizes; default 1)");
  sub.add_option("--h", a.h, "query heads (default 12)");
  sub.add_option("--hkv", a.hkv, "key/value heads, a divisor of --h (default --h)");
  sub.add_option("--sq", a.sq, "query length (default 128)");
  sub.add_option("--sk", a.sk, "key length (default --sq)");
  sub.add_option("--d", a.d, "head size (default 64)");
  sub.add_option("--dv", a.dv, "value head size (default --d)");
  sub.add_option("--causal", a.causal, "none | top-left | bottom-right (default: the workload's)");
  add_threads_option(sub, a.threads);
  sub.add_option("--dtype", a.dtype,
                 "f32 | f64 | bf16 | f16: the inputs rounded to it and every backend that takes it here run in it "
                 "(default f32)");
  sub.add_flag("--json", a.json,
               "print a JSON array of {backend, workload, threads, median_ms, gflops, max_abs_err, ...}");
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  return add_command<CompareArgs>(
      app, "compare", "Every backend on the same random inputs: median time, GFLOP/s, % of the dtype's peak, error",
      add_options, compare);
}

}  // namespace simdattn::cli
