// What this build and this machine offer (for `simdattn info` and diagnostics).
#pragma once

#include <string>
#include <vector>

namespace simdattn {

struct RuntimeInfo {
  std::string version;               // simdattn version
  std::string isa;                   // ISA the SIMD kernels dispatch to (sse2/avx2/avx512)
  bool isa_forced = false;           // chosen by SIMDATTN_ISA rather than detection
  std::vector<std::string> isas;     // ISAs the CPU supports, best first
  int default_threads = 1;           // OpenMP's default thread count
  std::vector<std::string> backends; // backends built in
  std::string onednn_version;        // empty if the oneDNN backend is not built
};

// Throws Error("SIMDATTN_ISA", ...) if the environment forces an unknown or unavailable ISA.
RuntimeInfo runtime_info();

// This machine's FP32 FMA throughput in GFLOP/s on `threads` threads: independent FMA chains on
// full-width vectors of the dispatched ISA, best of a few runs of about `seconds` in total. The
// yardstick `simdattn compare` and the perf suite state their speeds against (perf/ measures the
// same probe as peak/fma/t<N>).
double measure_fma_peak(int threads, double seconds = 0.2);

}  // namespace simdattn
