// GEMM micro-kernels with B in 16-bit floats (Gemm16Ukernel in kernels.hpp), the conversion
// layout: each row of the B panel is widened to f32 as it is loaded (bf16 by a shift, f16 by
// F16C's vcvtph2ps; SSE2 converts f16 in scalar code), then MR x NV FMAs with broadcasts of the
// packed f32 A. Half the bytes of an f32 B panel for the same FMAs: what a decode step, which
// reads every weight once, turns into time (guarded by decode/native/gpt-layer-kv4096.bf16).
// The AVX512-BF16 pair layout's kernel is in kernels_avx512_bf16.cpp.
#pragma once

#include <cstdint>

#include "impl/batch.hpp"
#include "impl/convert/widen16.hpp"

namespace simdattn::simd::impl {

template <class Arch, bool kBf16, int M, int MR, int NV>
void gemm16_ukernel(std::int64_t kc, const void* Ap_, const std::uint16_t* Bp, float* C, std::int64_t ldc,
                       float alpha, float beta) {
  using B = batch<float, Arch>;
  constexpr int W = static_cast<int>(B::size);
  constexpr int NR = NV * W;
  const float* Ap = static_cast<const float*>(Ap_);
  if constexpr (M == 1) {
    // One row (a decode step's projection): a chain of NV FMAs per k would wait on the FMA
    // latency, so four chains take every fourth k and are summed at the end (guarded by
    // decode/native/gpt-layer-kv4096.f16).
    B part[4][NV];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) part[u][j] = B(0.0f);
    std::int64_t k = 0;
    for (; k + 4 <= kc; k += 4)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const B a(Ap[(k + u) * MR]);
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) part[u][j] = xsimd::fma(a, load16<Arch, kBf16>(Bp + (k + u) * NR + j * W), part[u][j]);
      }
    for (; k < kc; ++k) {
      const B a(Ap[k * MR]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) part[0][j] = xsimd::fma(a, load16<Arch, kBf16>(Bp + k * NR + j * W), part[0][j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      float* c = C + j * W;
      const B r = ((part[0][j] + part[1][j]) + (part[2][j] + part[3][j])) * B(alpha);
      (beta == 0.0f ? r : xsimd::fma(B::load_unaligned(c), B(beta), r)).store_unaligned(c);
    }
    return;
  }
  B acc[M][NV];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = B(0.0f);
  for (std::int64_t k = 0; k < kc; ++k) {
    B b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) b[j] = load16<Arch, kBf16>(Bp + k * NR + j * W);
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      const B a(Ap[k * MR + i]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = xsimd::fma(a, b[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      float* c = C + i * ldc + j * W;
      const B r = acc[i][j] * B(alpha);
      (beta == 0.0f ? r : xsimd::fma(B::load_unaligned(c), B(beta), r)).store_unaligned(c);
    }
}

}  // namespace simdattn::simd::impl
