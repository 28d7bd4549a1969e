// The gated delta rule's vector kernels (DeltaKernels, kernels.hpp): a decode step's two passes
// over a state, the chunk form's weights, right sides, substitution and row scalings, a finiteness
// test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "impl/batch.hpp"
#include "impl/softmax/exp.hpp"

namespace simdattn::simd::impl {

// sk = S^T k and sq = S^T q of S [rows, cols] (row stride ld), in one pass: 4 vectors of columns
// at a time, their 8 sums in registers down the rows.
template <class Arch>
void delta_state_dots(const float* S, std::int64_t rows, std::int64_t cols, std::int64_t ld, const float* k,
                      const float* q, float* sk, float* sq) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  std::int64_t j = 0;
  for (; j + 4 * W <= cols; j += 4 * W) {
    B a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f), c0(0.0f), c1(0.0f), c2(0.0f), c3(0.0f);
    for (std::int64_t d = 0; d < rows; ++d) {
      const float* r = S + d * ld + j;
      const B kd(k[d]), qd(q[d]);
      const B x0 = B::load_unaligned(r), x1 = B::load_unaligned(r + W), x2 = B::load_unaligned(r + 2 * W),
              x3 = B::load_unaligned(r + 3 * W);
      a0 = xsimd::fma(x0, kd, a0), a1 = xsimd::fma(x1, kd, a1), a2 = xsimd::fma(x2, kd, a2), a3 = xsimd::fma(x3, kd, a3);
      c0 = xsimd::fma(x0, qd, c0), c1 = xsimd::fma(x1, qd, c1), c2 = xsimd::fma(x2, qd, c2), c3 = xsimd::fma(x3, qd, c3);
    }
    a0.store_unaligned(sk + j), a1.store_unaligned(sk + j + W), a2.store_unaligned(sk + j + 2 * W), a3.store_unaligned(sk + j + 3 * W);
    c0.store_unaligned(sq + j), c1.store_unaligned(sq + j + W), c2.store_unaligned(sq + j + 2 * W), c3.store_unaligned(sq + j + 3 * W);
  }
  for (; j + W <= cols; j += W) {
    B a(0.0f), c(0.0f);
    for (std::int64_t d = 0; d < rows; ++d) {
      const B x = B::load_unaligned(S + d * ld + j);
      a = xsimd::fma(x, B(k[d]), a), c = xsimd::fma(x, B(q[d]), c);
    }
    a.store_unaligned(sk + j), c.store_unaligned(sq + j);
  }
  for (; j < cols; ++j) {
    float a = 0.0f, c = 0.0f;
    for (std::int64_t d = 0; d < rows; ++d) a += S[d * ld + j] * k[d], c += S[d * ld + j] * q[d];
    sk[j] = a, sq[j] = c;
  }
}

// dst[d, j] = decay src[d, j] + k[d] u[j] (dst may be src: each element read before it is written).
template <class Arch>
void delta_state_update(const float* src, std::int64_t lds, float* dst, std::int64_t ldd, std::int64_t rows,
                        std::int64_t cols, float decay, const float* k, const float* u) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  const B g(decay);
  for (std::int64_t d = 0; d < rows; ++d) {
    const float* s = src + d * lds;
    float* o = dst + d * ldd;
    const B kd(k[d]);
    std::int64_t j = 0;
    for (; j + W <= cols; j += W)
      xsimd::fma(kd, B::load_unaligned(u + j), B::load_unaligned(s + j) * g).store_unaligned(o + j);
    for (; j < cols; ++j) o[j] = decay * s[j] + k[d] * u[j];
  }
}

// Columns [j, j + V W) of delta_forward_substitute (the first w of them when Tail, V == 1), rows in
// pairs: row i's sums and row i + 1's share each load of a row s < i, row i + 1 then adds row i's
// result last (the order of the single-row loop: the same bits). 2 V FMA chains.
template <class Arch, int V, bool Tail>
void delta_forward_pairs(float* U, std::int64_t ldu, std::int64_t n, std::int64_t j, std::int64_t w, const float* A,
                         std::int64_t lda) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  auto load = [&](const float* p, int v) { return Tail ? load_tail<Arch, float>(p, w, 0.0f) : B::load_unaligned(p + v * W); };
  auto store = [&](float* p, int v, const B& x) {
    if constexpr (Tail) store_tail<Arch, float>(p, w, x);
    else x.store_unaligned(p + v * W);
  };
  for (std::int64_t i = 1; i < n; i += 2) {
    const bool pair = i + 1 < n;
    float* ui = U + i * ldu + j;
    float* u2 = ui + ldu;
    const float* ai = A + i * lda;
    const float* a2 = ai + lda;
    B a[V], b[V];
    for (int v = 0; v < V; ++v) a[v] = load(ui, v), b[v] = pair ? load(u2, v) : B(0.0f);
    for (std::int64_t s = 0; s < i; ++s) {
      const B c(-ai[s]), c2(pair ? -a2[s] : 0.0f);
      const float* us = U + s * ldu + j;
      for (int v = 0; v < V; ++v) {
        const B x = load(us, v);
        a[v] = xsimd::fma(c, x, a[v]);
        b[v] = xsimd::fma(c2, x, b[v]);
      }
    }
    for (int v = 0; v < V; ++v) store(ui, v, a[v]);
    if (!pair) break;
    const B c(-a2[i]);
    for (int v = 0; v < V; ++v) store(u2, v, xsimd::fma(c, a[v], b[v]));
  }
}

// U[i, :cols] -= sum_{s < i} A[i, s] U[s, :cols], rows in order: 8 vectors of columns at a time,
// row i's 8 sums in registers across the rows before it (8 FMA chains: both FMA pipes busy); then
// 4 vectors and 1 (the tail with masked lanes) with two rows at a time (delta_forward_pairs).
template <class Arch>
void delta_forward_substitute(float* U, std::int64_t ldu, std::int64_t n, std::int64_t cols, const float* A,
                              std::int64_t lda) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  std::int64_t j = 0;
  for (; j + 8 * W <= cols; j += 8 * W)
    for (std::int64_t i = 1; i < n; ++i) {
      float* ui = U + i * ldu + j;
      B a[8];
      for (int v = 0; v < 8; ++v) a[v] = B::load_unaligned(ui + v * W);
      const float* ai = A + i * lda;
      for (std::int64_t s = 0; s < i; ++s) {
        const B c(-ai[s]);
        const float* us = U + s * ldu + j;
        for (int v = 0; v < 8; ++v) a[v] = xsimd::fma(c, B::load_unaligned(us + v * W), a[v]);
      }
      for (int v = 0; v < 8; ++v) a[v].store_unaligned(ui + v * W);
    }
  for (; j + 4 * W <= cols; j += 4 * W) delta_forward_pairs<Arch, 4, false>(U, ldu, n, j, 4 * W, A, lda);
  for (; j < cols; j += W) delta_forward_pairs<Arch, 1, true>(U, ldu, n, j, std::min<std::int64_t>(W, cols - j), A, lda);
}

// The chunk form's weights from its cumulative log decays (DeltaKernels::chunk_weights): row i's
// e^(gamma_i - gamma_s) a vector of s at a time (lanes s > i computed, then dropped), each
// exponent the double difference rounded to f32.
template <class Arch>
void delta_chunk_weights(std::int64_t n, const double* gam, const float* beta, const float* KK, std::int64_t ldk,
                         const float* QK, std::int64_t ldq, float* A, std::int64_t lda, float* QKm, std::int64_t ldm,
                         float* eg, float* last) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  alignas(64) float x[W];
  for (std::int64_t s0 = 0; s0 < n; s0 += W) {
    const std::int64_t w = std::min(W, n - s0);
    for (std::int64_t l = 0; l < w; ++l) x[l] = static_cast<float>(gam[s0 + l]);
    store_tail<Arch, float>(eg + s0, w, exp_batch<Arch, float>(load_tail<Arch, float>(x, w, 0.0f)));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const B bi(beta[i]);
    for (std::int64_t s0 = 0; s0 < n; s0 += W) {
      const std::int64_t w = std::min(W, n - s0);
      float* qm = QKm + i * ldm + s0;
      if (s0 > i) {
        store_tail<Arch, float>(qm, w, B(0.0f));
        continue;
      }
      for (std::int64_t l = 0; l < w; ++l) x[l] = static_cast<float>(gam[i] - gam[s0 + l]);
      const B e = exp_batch<Arch, float>(load_tail<Arch, float>(x, w, 0.0f));
      if (const std::int64_t na = std::min(w, i - s0); na > 0)
        store_tail<Arch, float>(A + i * lda + s0, na, (bi * e) * load_tail<Arch, float>(KK + i * ldk + s0, na, 0.0f));
      store_tail<Arch, float>(qm, w, blend_tail<Arch, float>(load_tail<Arch, float>(QK + i * ldq + s0, w, 0.0f) * e, std::min(w, i - s0 + 1), 0.0f));
      if (i == n - 1) store_tail<Arch, float>(last + s0, w, e);
    }
  }
}

// y[r, :cols] = f[r] x[r, :cols] for r < rows (DeltaKernels::scale_rows).
template <class Arch>
void delta_scale_rows(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, const float* f, float* y,
                      std::int64_t ldy) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    const B a(f[r]);
    std::int64_t j = 0;
    for (; j + W <= cols; j += W) (B::load_unaligned(xr + j) * a).store_unaligned(yr + j);
    if (j < cols) store_tail<Arch, float>(yr + j, cols - j, load_tail<Arch, float>(xr + j, cols - j, 0.0f) * a);
  }
}

// The chunk form's right sides (DeltaKernels::right_sides).
template <class Arch>
void delta_right_sides(std::int64_t n, std::int64_t cols, std::int64_t width, const float* V, std::int64_t ldv,
                       const float* KS, std::int64_t ldks, const float* beta, const float* eg, float* U, std::int64_t ldu) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* v = V + i * ldv;
    const float* ks = KS + i * ldks;
    float* u = U + i * ldu;
    const B b(beta[i]), c(-beta[i] * eg[i]);
    std::int64_t j = 0;
    for (; j + W <= cols; j += W)
      xsimd::fma(c, B::load_unaligned(ks + j), B::load_unaligned(v + j) * b).store_unaligned(u + j);
    if (j < cols) {
      const std::int64_t w = cols - j;
      store_tail<Arch, float>(u + j, w, xsimd::fma(c, load_tail<Arch, float>(ks + j, w, 0.0f), load_tail<Arch, float>(v + j, w, 0.0f) * b));
    }
    for (std::int64_t e = cols; e < width; ++e) u[e] = 0.0f;
  }
}

// Whether no x[i] (16-bit float bits) has every bit of `exponent` set (Inf and NaN): a vector's
// lanes tested at a time, the tail one by one.
template <class Arch>
bool delta_all_finite16(const std::uint16_t* x, std::int64_t n, std::uint16_t exponent) {
  using B = batch<std::uint16_t, Arch>;
  constexpr std::int64_t W = B::size;
  const B m(exponent);
  auto bad = B(0) != B(0);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) bad = bad | ((B::load_unaligned(x + i) & m) == m);
  if (xsimd::any(bad)) return false;
  for (; i < n; ++i)
    if ((x[i] & exponent) == exponent) return false;
  return true;
}

// Whether every x[i] is finite: the exponent bits of each element, all ones for Inf and NaN.
template <class Arch>
bool delta_all_finite(const float* x, std::int64_t n) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  // x - x is 0 for finite x and NaN for Inf and NaN; the sums of four accumulators stay 0 or NaN
  B z0(0.0f), z1(0.0f), z2(0.0f), z3(0.0f);
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const B a = B::load_unaligned(x + i), b = B::load_unaligned(x + i + W), c = B::load_unaligned(x + i + 2 * W),
            d = B::load_unaligned(x + i + 3 * W);
    z0 += a - a, z1 += b - b, z2 += c - c, z3 += d - d;
  }
  for (; i + W <= n; i += W) {
    const B a = B::load_unaligned(x + i);
    z0 += a - a;
  }
  alignas(64) float buf[W];
  ((z0 + z1) + (z2 + z3)).store_aligned(buf);
  float z = 0.0f;
  for (std::int64_t l = 0; l < W; ++l) z += buf[l];
  for (; i < n; ++i) z += x[i] - x[i];
  return z == 0.0f;
}

// y[i] = x[i] * f: f = mult / sqrt(sum x^2 + eps) with norm, else mult (four sums' lanes added
// in a fixed order: the same result for the same row at any call).
template <class Arch>
void delta_scale_row(const float* x, float* y, std::int64_t n, float mult, float eps, bool norm) {
  using B = batch<float, Arch>;
  constexpr std::int64_t W = B::size;
  float f = mult;
  if (norm) {
    B s0(0.0f), s1(0.0f);
    std::int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
      const B a = B::load_unaligned(x + i), b = B::load_unaligned(x + i + W);
      s0 = xsimd::fma(a, a, s0), s1 = xsimd::fma(b, b, s1);
    }
    for (; i + W <= n; i += W) {
      const B a = B::load_unaligned(x + i);
      s0 = xsimd::fma(a, a, s0);
    }
    alignas(64) float buf[W];
    (s0 + s1).store_aligned(buf);
    float ss = 0.0f;
    for (std::int64_t l = 0; l < W; ++l) ss += buf[l];
    for (; i < n; ++i) ss += x[i] * x[i];
    f = mult / std::sqrt(ss + eps);
  }
  const B vf(f);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) (B::load_unaligned(x + i) * vf).store_unaligned(y + i);
  for (; i < n; ++i) y[i] = x[i] * f;
}

}  // namespace simdattn::simd::impl
