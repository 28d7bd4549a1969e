// Matrix-vector products with B in 16-bit floats (Gemv16Kernels): bf16 or f16 elements are
// widened to f32 as they are loaded, and x, y and the sums stay in f32. Decode reads K and V this
// way: half the bytes of f32, which a step bound by reading them turns into time (guarded by
// attention/native/decode.bf16 and decode.f16). Short rows are fetched ahead as gemv.hpp fetches
// them (guarded by the same rows).
#pragma once

#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "impl/batch.hpp"
#include "impl/products/gemv.hpp"  // the prefetch rule

namespace simdattn::simd::impl {

// One 16-bit float widened to f32 (exact). A template on Arch like everything in impl/ (half.hpp's
// inline conversions are not: compiled here, an AVX-512 body could be the one the linker keeps).
template <class Arch, bool kBf16>
inline float widen16(std::uint16_t h) {
  std::uint32_t u = std::uint32_t{h} << 16;
  if constexpr (!kBf16) {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
      const float v = static_cast<float>(mant) * 0x1p-24f;
      return sign ? -v : v;
    }
    u = sign | (exp == 0x1f ? 0x7f800000u | (mant << 13) : ((exp + 112u) << 23) | (mant << 13));
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// W consecutive 16-bit floats at p, widened to an f32 batch.
template <class Arch, bool kBf16>
__attribute__((always_inline)) inline batch<float, Arch> load16(const std::uint16_t* p) {
  using B = batch<float, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kBf16) return B(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    else return B(_mm512_cvtph_ps(v));
  } else if constexpr (B::size == 8) {  // AVX2 (with F16C)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kBf16) return B(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    else return B(_mm256_cvtph_ps(v));
  } else if constexpr (kBf16) {  // SSE2: a bf16 is the high half of its f32
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return B(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), v)));
  } else {  // SSE2 has no f16 conversion
    alignas(16) float f[4];
    for (int i = 0; i < 4; ++i) f[i] = widen16<Arch, false>(p[i]);
    return B::load_aligned(f);
  }
}

// y[j] = alpha * sum_p x[p] * B[j * ldb + p] + beta * y[j] for j < n: each row of B dotted with
// x (decode's scores, K's rows against q). Four rows at a time; beta == 0 never reads y.
template <class Arch, bool kBf16>
void gemv16_t(std::int64_t n, std::int64_t k, float alpha, const float* x, const std::uint16_t* Bm,
                   std::int64_t ldb, float beta, float* y) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  const std::int64_t kv = k / W * W;
  auto finish = [&](std::int64_t j, float s) { y[j] = beta == 0.0f ? alpha * s : alpha * s + beta * y[j]; };
  auto tail = [&](const std::uint16_t* row) {
    float s = 0.0f;
    for (std::int64_t p = kv; p < k; ++p) s += x[p] * widen16<Arch, kBf16>(row[p]);
    return s;
  };
  const std::int64_t row_bytes = k * static_cast<std::int64_t>(sizeof(std::uint16_t));
  std::int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const std::uint16_t* r0 = Bm + j * ldb;
    const std::uint16_t *r1 = r0 + ldb, *r2 = r1 + ldb, *r3 = r2 + ldb;
    prefetch_four_rows_ahead(r0, ldb, row_bytes);
    B a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    for (std::int64_t p = 0; p < kv; p += W) {
      const B xv = B::load_unaligned(x + p);
      a0 = xsimd::fma(xv, load16<Arch, kBf16>(r0 + p), a0);
      a1 = xsimd::fma(xv, load16<Arch, kBf16>(r1 + p), a1);
      a2 = xsimd::fma(xv, load16<Arch, kBf16>(r2 + p), a2);
      a3 = xsimd::fma(xv, load16<Arch, kBf16>(r3 + p), a3);
    }
    finish(j, xsimd::hadd(a0) + tail(r0));
    finish(j + 1, xsimd::hadd(a1) + tail(r1));
    finish(j + 2, xsimd::hadd(a2) + tail(r2));
    finish(j + 3, xsimd::hadd(a3) + tail(r3));
  }
  for (; j < n; ++j) {
    const std::uint16_t* r = Bm + j * ldb;
    B a(0.0f);
    for (std::int64_t p = 0; p < kv; p += W) a = xsimd::fma(B::load_unaligned(x + p), load16<Arch, kBf16>(r + p), a);
    finish(j, xsimd::hadd(a) + tail(r));
  }
}

// y[j] = alpha * sum_p x[p] * B[p * ldb + j] + beta * y[j] for j < n: B's rows weighted by x and
// summed (decode's P V). Columns in chunks of 4 vectors, 4 accumulators across the k loop;
// beta == 0 never reads y.
template <class Arch, bool kBf16>
void gemv16_n(std::int64_t n, std::int64_t k, float alpha, const float* x, const std::uint16_t* Bm,
                   std::int64_t ldb, float beta, float* y) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  auto store = [&](float* out, const B& acc) {
    const B r = acc * B(alpha);
    (beta == 0.0f ? r : xsimd::fma(B::load_unaligned(out), B(beta), r)).store_unaligned(out);
  };
  std::int64_t j = 0;
  for (; j + 4 * W <= n; j += 4 * W) {
    B a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    const std::uint16_t* row = Bm + j;
    for (std::int64_t p = 0; p < k; ++p, row += ldb) {
      prefetch_row(row, kGemvPrefetchRows, ldb, 4 * W * static_cast<std::int64_t>(sizeof(std::uint16_t)));
      const B xv(x[p]);
      a0 = xsimd::fma(xv, load16<Arch, kBf16>(row), a0);
      a1 = xsimd::fma(xv, load16<Arch, kBf16>(row + W), a1);
      a2 = xsimd::fma(xv, load16<Arch, kBf16>(row + 2 * W), a2);
      a3 = xsimd::fma(xv, load16<Arch, kBf16>(row + 3 * W), a3);
    }
    store(y + j, a0), store(y + j + W, a1), store(y + j + 2 * W, a2), store(y + j + 3 * W, a3);
  }
  for (; j + W <= n; j += W) {
    B a(0.0f);
    const std::uint16_t* row = Bm + j;
    for (std::int64_t p = 0; p < k; ++p, row += ldb) a = xsimd::fma(B(x[p]), load16<Arch, kBf16>(row), a);
    store(y + j, a);
  }
  for (; j < n; ++j) {
    float s = 0.0f;
    for (std::int64_t p = 0; p < k; ++p) s += x[p] * widen16<Arch, kBf16>(Bm[p * ldb + j]);
    y[j] = beta == 0.0f ? alpha * s : alpha * s + beta * y[j];
  }
}

}  // namespace simdattn::simd::impl
