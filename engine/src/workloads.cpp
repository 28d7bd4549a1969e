#include "simdattn/workloads.hpp"

#include <algorithm>
#include <array>

namespace simdattn {
namespace {

// docs/design.md's standard workloads. D == Dv and H == Hkv in all of them.
constexpr std::array<Workload, 7> kWorkloads{{
    {"bert", 1, 12, 12, 128, 128, 64, Causal::none},
    {"vit", 1, 12, 12, 197, 197, 64, Causal::none},
    {"gpt", 1, 16, 16, 2048, 2048, 64, Causal::top_left},
    {"long", 1, 8, 8, 8192, 8192, 128, Causal::top_left},
    {"decode", 1, 32, 32, 1, 4096, 128, Causal::none},
    {"sdcross", 2, 8, 8, 4096, 77, 40, Causal::none},
    {"batch", 8, 12, 12, 512, 512, 64, Causal::none},
}};

}  // namespace

std::span<const Workload> standard_workloads() noexcept { return kWorkloads; }

const Workload* find_workload(std::string_view name) noexcept {
  for (const auto& w : kWorkloads)
    if (w.name == name) return &w;
  return nullptr;
}

double attention_flops(std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                       std::int64_t D, std::int64_t Dv, Causal causal) {
  double pairs = 0.0;  // visible (query, key) pairs per (batch, head)
  if (causal == Causal::none) {
    pairs = double(Sq) * double(Sk);
  } else {
    for (std::int64_t i = 0; i < Sq; ++i) {
      const std::int64_t pos = causal == Causal::top_left ? i : i + Sk - Sq;
      pairs += double(std::clamp<std::int64_t>(pos + 1, 0, Sk));
    }
  }
  return 2.0 * double(B) * double(H) * pairs * double(D + Dv);
}

}  // namespace simdattn
