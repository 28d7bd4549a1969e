// Benchmarking aids shared by perf/ and tools/ (not part of the umbrella header): the
// standard attention workloads (docs/design.md), their FLOP counts and the machine's FMA peak.
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

}  // namespace simdattn
