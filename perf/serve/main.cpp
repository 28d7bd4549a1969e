// Serving benchmarks (docs/performance.md, "Serving"):
//
//   simdattn_serve_bench decode [--streams 8] [--kv 256] [--steps 64] [--reps 5] [--json FILE]
//     Decode throughput of `streams` concurrent gpt-layer sequences (d_model 1024, 16 heads, f32),
//     each with `kv` cached tokens: every stream on its own thread calling
//     MultiHeadAttention::forward(query, cache, out) ("alone"), against the same streams through
//     one DecodeScheduler ("scheduler"). Repetitions alternate the two; tokens/s of each, best and
//     median, and the ratio of the bests. Every scheduler output is checked against the alone
//     run's (the same tokens into the same caches).
//
//   simdattn_serve_bench pool [--streams 8] [--kv 256] [--steps 64] [--reps 5] [--json FILE]
//     The same streams each alone (a KvCache, a thread each), as one forward_pool call per step
//     over a KvPool (the batched step in a loop), and through a PoolScheduler (a request thread
//     each): tokens/s, best and median, the ratios, the batched step's GB/s of weights and K/V.
//
//   simdattn_serve_bench prefill [--streams 8] [--kv 4096] [--steps 64] [--reps 5] [--budget 24] [--json FILE]
//     `streams` decode streams through a PoolScheduler (token budget `budget`) while a `kv`-token
//     prompt joins in chunks: the streams' p99 step latency with and without it, and the prompt's
//     prefill time beside them against alone.
//
//   simdattn_serve_bench memory [--json FILE]
//     64 sequences of random lengths 100-4000 in a KvPool against their tokens' bytes and
//     4096-token slabs; 32 sequences forked from one 2048-token prompt.
//
//   simdattn_serve_bench cascade [--dtype f32|bf16|int8] [--threads 2] [--json FILE]
//     The measurements behind forward_pool's cascade rule: m sequences sharing a prefix in a pool
//     of 16-token blocks (32 heads, 8 kv heads, d 128; 2-32 sequences, 64-2048 shared keys, 64 keys
//     of their own, 1-64 new tokens each), one attention_paged call over every key against the
//     prefix once + each sequence's own keys + merge_attention_states (what the layer runs), best
//     of 7 interleaved; each row with the rule's choice (docs/speculative.md, "Shared prefixes").
//
//   simdattn_serve_bench load [--workload bert|decode] [--kv 256] [--clients 8]
//                        [--loads 30,50,70] [--seconds 2] [--slices 4] [--json FILE]
//     Open-loop load: each of `clients` threads issues requests at the times of a Poisson process
//     (rate: the load's share of the stand-in's saturation rate, split evenly over the clients);
//     a request's latency runs from its scheduled arrival to its completion, so a client that
//     falls behind counts its queueing. The request: bert-sized attention() at default options
//     (bert), or one gpt-layer decode step of the client's own sequence with `kv` cached tokens
//     (decode: the layer alone, and through a DecodeScheduler). The stand-in, driven by the same
//     generator, burns one request's single-thread time (measured in this run) in a plain loop:
//     what the machine gives a perfectly parallel single-thread workload. For each: saturation
//     throughput (every client calling back to back) and, at each load, p50/p99/p999 latency and
//     the achieved rate. Each of these measurements runs in `slices` slices of `seconds` / slices,
//     the servers taking turns slice by slice.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpt_layer.hpp"
#include "serve/serve.hpp"
#include "simdattn/simdattn.hpp"

namespace serve {
namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "simdattn_serve_bench: %s\n"
               "usage: simdattn_serve_bench decode [--streams N] [--kv TOKENS] [--steps N] [--reps N] [--json FILE]\n"
               "       simdattn_serve_bench pool [--streams N] [--kv TOKENS] [--steps N] [--reps N] [--json FILE]\n"
               "       simdattn_serve_bench prefill [--streams N] [--kv PROMPT_TOKENS] [--steps N] [--reps N] [--budget N]\n"
               "       simdattn_serve_bench memory [--json FILE]\n"
               "       simdattn_serve_bench cascade [--dtype f32|bf16|int8] [--threads N] [--json FILE]\n"
               "       simdattn_serve_bench load [--workload bert|decode] [--kv TOKENS] [--clients N]\n"
               "                            [--loads P,P,...] [--seconds S] [--slices N] [--threads N] [--json FILE]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("expected a mode");
  a.mode = argv[1];
  if (a.mode != "decode" && a.mode != "load" && a.mode != "pool" && a.mode != "prefill" && a.mode != "memory" &&
      a.mode != "cascade")
    usage("unknown mode '" + a.mode + "'");
  for (int i = 2; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) usage(f + ": expected a value");
    const std::string v = argv[++i];
    auto num = [&](long lo) {
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < lo) usage(f + ": expected an integer >= " + std::to_string(lo));
      return n;
    };
    if (f == "--streams") a.streams = static_cast<int>(num(1));
    else if (f == "--kv") a.kv = num(1);
    else if (f == "--steps") a.steps = num(1);
    else if (f == "--reps") a.reps = static_cast<int>(num(1));
    else if (f == "--json") a.json = v;
    else if (f == "--dtype") a.dtype = v;
    else if (f == "--workload") {
      if (v != "bert" && v != "decode") usage("--workload: expected bert or decode, got '" + v + "'");
      a.workload = v;
    } else if (f == "--clients") a.clients = static_cast<int>(num(1));
    else if (f == "--threads") a.threads = static_cast<int>(num(0));
    else if (f == "--budget") a.budget = num(1);
    else if (f == "--slices") {
      a.slices = static_cast<int>(num(1));
      if (a.slices > 100) usage("--slices: expected an integer 1..100");
    }
    else if (f == "--seconds") {
      char* end = nullptr;
      a.seconds = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(a.seconds > 0 && a.seconds <= 600)) usage("--seconds: expected 0 < S <= 600");
    } else if (f == "--loads") {
      a.loads.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long p = std::strtol(item.c_str(), &end, 10);
        if (end == item.c_str() || *end != '\0' || p < 1 || p > 100) usage("--loads: expected percentages 1..100, got '" + v + "'");
        a.loads.push_back(static_cast<int>(p));
      }
      if (a.loads.empty()) usage("--loads: expected at least one percentage");
    } else usage("unknown flag " + f);
  }
  return a;
}

}  // namespace

MultiHeadAttention gpt_layer() { return simdattn::perf::gpt_layer(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace serve

int main(int argc, char** argv) {
  const serve::Args a = serve::parse(argc, argv);
  try {
    if (a.mode == "decode") return serve::decode(a);
    if (a.mode == "pool") return serve::pool(a);
    if (a.mode == "prefill") return serve::prefill(a);
    if (a.mode == "memory") return serve::memory(a);
    if (a.mode == "cascade") return serve::cascade(a);
    return serve::load(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "simdattn_serve_bench: %s\n", e.what());
    return 2;
  }
}
