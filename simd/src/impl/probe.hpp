// The machine-limit probe of ProbeKernels: FMA throughput on full-width f32 vectors.
#pragma once

#include <cstdint>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

// 16 independent chains (2 FMA pipes x 4-cycle latency need 8; 16 leave no doubt), each
// a = a * m + c, which stays finite for |m| < 1.
constexpr int kFmaChains = 16;

template <class Arch>
float fma_chains(std::int64_t iters, float seed) {
  using B = batch<float, Arch>;
  B a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = B(seed + float(i));
  const B m(0.999f), c(0.001f);
  for (std::int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kFmaChains; ++i) a[i] = xsimd::fma(a[i], m, c);
  }
  B s = a[0];
  for (int i = 1; i < kFmaChains; ++i) s += a[i];
  return xsimd::hadd(s);
}

}  // namespace simdattn::simd::impl
