// Matrix-vector products (M = 1: decode), GemmKernels::gemv_n and gemv_t. Both stream B
// exactly once.
#pragma once

#include <cstdint>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

// B's rows are fetched into L1 this many rows ahead of the row being multiplied, where the
// rows are short (a decode step's K and V rows, one head wide: 4 KiB ahead at 64 f32): the
// hardware prefetchers alone leave the FMA units waiting on the stream (on a Zen 5; guarded by
// decode/native/gpt-layer-kv4096 and attention/native/decode).
constexpr std::int64_t kGemvPrefetchRows = 16;
// ... for rows of at most this many bytes (a longer row is a stream of its own, which the
// prefetchers follow).
constexpr std::int64_t kGemvPrefetchMaxRowBytes = 1024;

// Fetches the lines of the `bytes` bytes that start `rows` rows of ldb elements past p into L1.
// The address is computed as an integer: past B's end it points at nothing, and a prefetch
// there reads nothing and cannot fault.
template <class T>
__attribute__((always_inline)) inline void prefetch_row(const T* p, std::int64_t rows, std::int64_t ldb,
                                                        std::int64_t bytes) {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(rows * ldb) * sizeof(T);
  for (std::uintptr_t line = at & ~std::uintptr_t{63}; line < at + static_cast<std::uintptr_t>(bytes); line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
}

// The dot-product kernels' step: rows r0 .. r0 + 3 (ldb elements apart, row_bytes each) are being
// multiplied; fetches the four rows kGemvPrefetchRows further on, if rows are short.
template <class T>
__attribute__((always_inline)) inline void prefetch_four_rows_ahead(const T* r0, std::int64_t ldb,
                                                                    std::int64_t row_bytes) {
  if (row_bytes > kGemvPrefetchMaxRowBytes) return;
  for (std::int64_t q = 0; q < 4; ++q) prefetch_row(r0, kGemvPrefetchRows + q, ldb, row_bytes);
}

// y[0:W] := r + beta * y (r already scaled by alpha); beta == 0 never reads y.
template <class Arch, class T>
__attribute__((always_inline)) inline void store_y(T* y, const batch<T, Arch>& r, T beta) {
  using B = batch<T, Arch>;
  (beta == T(0) ? r : xsimd::fma(B::load_unaligned(y), B(beta), r)).store_unaligned(y);
}

// One element: y := alpha * s + beta * y; beta == 0 never reads y.
template <class Arch, class T>
__attribute__((always_inline)) inline void store_y1(T& y, T s, T alpha, T beta) {
  y = beta == T(0) ? alpha * s : alpha * s + beta * y;
}

template <class Arch, class T>
void gemv_n(std::int64_t n, std::int64_t k, T alpha, const T* x, const T* Bm, std::int64_t ldb, T beta,
            T* y) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  // Columns in chunks of 4 vectors: 4 accumulators live across the whole k loop.
  std::int64_t j = 0;
  for (; j + 4 * W <= n; j += 4 * W) {
    B a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
    const T* row = Bm + j;
    for (std::int64_t p = 0; p < k; ++p, row += ldb) {
      prefetch_row(row, kGemvPrefetchRows, ldb, 4 * W * static_cast<std::int64_t>(sizeof(T)));
      const B xv(x[p]);
      a0 = xsimd::fma(xv, B::load_unaligned(row), a0);
      a1 = xsimd::fma(xv, B::load_unaligned(row + W), a1);
      a2 = xsimd::fma(xv, B::load_unaligned(row + 2 * W), a2);
      a3 = xsimd::fma(xv, B::load_unaligned(row + 3 * W), a3);
    }
    const B va(alpha);
    B* acc[4] = {&a0, &a1, &a2, &a3};
    for (int q = 0; q < 4; ++q) store_y<Arch, T>(y + j + q * W, *acc[q] * va, beta);
  }
  // Narrower rests (and the panels of a pre-packed B, two vectors wide on AVX-512 f32): the k
  // loop split into even and odd rows, so that four FMA chains are in flight, not one or two
  // that each wait out an FMA's 4-cycle latency per row (guarded by
  // decode/native/gpt-layer-kv512/t1, whose projections read pre-packed weights).
  for (; j + 2 * W <= n; j += 2 * W) {
    B a0(T(0)), a1(T(0)), b0(T(0)), b1(T(0));
    const T* row = Bm + j;
    std::int64_t p = 0;
    for (; p + 2 <= k; p += 2, row += 2 * ldb) {
      const B x0(x[p]), x1(x[p + 1]);
      a0 = xsimd::fma(x0, B::load_unaligned(row), a0);
      a1 = xsimd::fma(x0, B::load_unaligned(row + W), a1);
      b0 = xsimd::fma(x1, B::load_unaligned(row + ldb), b0);
      b1 = xsimd::fma(x1, B::load_unaligned(row + ldb + W), b1);
    }
    if (p < k) {
      a0 = xsimd::fma(B(x[p]), B::load_unaligned(row), a0);
      a1 = xsimd::fma(B(x[p]), B::load_unaligned(row + W), a1);
    }
    const B r0 = (a0 + b0) * B(alpha), r1 = (a1 + b1) * B(alpha);
    store_y<Arch, T>(y + j, r0, beta);
    store_y<Arch, T>(y + j + W, r1, beta);
  }
  for (; j + W <= n; j += W) {
    B a[4] = {B(T(0)), B(T(0)), B(T(0)), B(T(0))};
    const T* row = Bm + j;
    std::int64_t p = 0;
    for (; p + 4 <= k; p += 4, row += 4 * ldb)
      for (int q = 0; q < 4; ++q) a[q] = xsimd::fma(B(x[p + q]), B::load_unaligned(row + q * ldb), a[q]);
    for (; p < k; ++p, row += ldb) a[0] = xsimd::fma(B(x[p]), B::load_unaligned(row), a[0]);
    store_y<Arch, T>(y + j, ((a[0] + a[1]) + (a[2] + a[3])) * B(alpha), beta);
  }
  for (; j < n; ++j) {
    T s = T(0);
    for (std::int64_t p = 0; p < k; ++p) s += x[p] * Bm[p * ldb + j];
    store_y1<Arch, T>(y[j], s, alpha, beta);
  }
}

template <class Arch, class T>
void gemv_t(std::int64_t n, std::int64_t k, T alpha, const T* x, const T* Bm, std::int64_t ldb, T beta,
            T* y) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  auto finish = [&](std::int64_t j, T s) { store_y1<Arch, T>(y[j], s, alpha, beta); };
  const std::int64_t row_bytes = k * static_cast<std::int64_t>(sizeof(T));
  std::int64_t j = 0;
  for (; j + 4 <= n; j += 4) {  // four rows of B at once: four independent dot products
    const T* r0 = Bm + j * ldb;
    const T* r1 = r0 + ldb;
    const T* r2 = r1 + ldb;
    const T* r3 = r2 + ldb;
    prefetch_four_rows_ahead(r0, ldb, row_bytes);
    B a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
    std::int64_t p = 0;
    for (; p + W <= k; p += W) {
      const B xv = B::load_unaligned(x + p);
      a0 = xsimd::fma(xv, B::load_unaligned(r0 + p), a0);
      a1 = xsimd::fma(xv, B::load_unaligned(r1 + p), a1);
      a2 = xsimd::fma(xv, B::load_unaligned(r2 + p), a2);
      a3 = xsimd::fma(xv, B::load_unaligned(r3 + p), a3);
    }
    T s0 = xsimd::hadd(a0), s1 = xsimd::hadd(a1), s2 = xsimd::hadd(a2), s3 = xsimd::hadd(a3);
    for (; p < k; ++p) {
      s0 += x[p] * r0[p];
      s1 += x[p] * r1[p];
      s2 += x[p] * r2[p];
      s3 += x[p] * r3[p];
    }
    finish(j, s0);
    finish(j + 1, s1);
    finish(j + 2, s2);
    finish(j + 3, s3);
  }
  for (; j < n; ++j) {
    const T* r0 = Bm + j * ldb;
    B a0(T(0));
    std::int64_t p = 0;
    for (; p + W <= k; p += W) a0 = xsimd::fma(B::load_unaligned(x + p), B::load_unaligned(r0 + p), a0);
    T s = xsimd::hadd(a0);
    for (; p < k; ++p) s += x[p] * r0[p];
    finish(j, s);
  }
}

}  // namespace simdattn::simd::impl
