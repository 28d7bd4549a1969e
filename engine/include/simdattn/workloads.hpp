// The standard attention workloads, shared by perf/, tools/ and tests (see docs/design.md).
#pragma once

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

std::span<const Workload> standard_workloads() noexcept;

// nullptr if unknown.
const Workload* find_workload(std::string_view name) noexcept;

// FLOPs of one attention call: 4*D per visible (query, key) pair (2*D for QK^T, 2*Dv for PV
// with D == Dv); causal counts only visible pairs.
double attention_flops(std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                       std::int64_t D, std::int64_t Dv, Causal causal);

}  // namespace simdattn
