// Benchmarking aids shared by perf/ and tools/ (not part of the umbrella header): the
// standard attention workloads (docs/design.md), their FLOP counts and the machine's peaks.
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <span>
#include <string_view>

#include "simdattn/attention.hpp"

namespace simdattn {

struct Workload {
  std::string_view name;
  std::int64_t B, H, Hkv, Sq, Sk, D;
  Causal causal;
};

SIMDATTN_API std::span<const Workload> standard_workloads() noexcept;

// nullptr if unknown.
SIMDATTN_API const Workload* find_workload(std::string_view name) noexcept;

// FLOPs of one attention call: 2*(D + Dv) per visible (query, key) pair (2*D for QK^T, 2*Dv
// for PV); causal counts only visible pairs.
SIMDATTN_API double attention_flops(std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                       std::int64_t D, std::int64_t Dv, Causal causal);

// This machine's FP32 FMA throughput in GFLOP/s on `threads` threads: independent FMA chains on
// full-width vectors of the dispatched ISA, best of a few runs of about `seconds` in total. The
// yardstick `simdattn compare` and the perf suite state their speeds against (perf/ measures the
// same probe as peak/fma/t<N>).
SIMDATTN_API double measure_fma_peak(int threads, double seconds = 0.2);

// The peak an attention call in `dtype` is measured against here, named:
//   "amx-bf16"  bf16 when the kernels in use have AMX tiles: tdpbf16ps's throughput (four
//               independent tile products on resident tiles, as peak/amx-bf16/t<N>), which the
//               native backend's bf16 products run on (and oneDNN's bf16 matmuls);
//   "vdpbf16ps-bf16"  bf16 when the kernels in use run the attention's bf16 products on vdpbf16ps
//               (AVX512-BF16 on AMD's cores, the fused.tiles path): its throughput (independent
//               chains, as peak/vdpbf16ps/t<N>);
//   "fma-f64"   f64: half the f32 FMA peak (a vector holds half the lanes);
//   "fma-f32"   every other case: f32, f16, and bf16 on neither, whose products the native
//               backend computes in f32 FMAs (K, V and Q widened as they are packed).
struct Peak {
  std::string_view name;
  double gflops = 0.0;
};
SIMDATTN_API Peak measure_peak(DType dtype, int threads, double seconds = 0.2);

}  // namespace simdattn
