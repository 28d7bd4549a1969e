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

}  // namespace simdattn
