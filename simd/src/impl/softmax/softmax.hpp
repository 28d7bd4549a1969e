// The softmax kernels of VectorKernels: the two fused passes of a plain row softmax
// (scale_add_max, exp_sub_max_sum), the online-softmax step over a block of rows
// (softmax_rows) and its last step (normalize_rows), and the softmax down the columns of a
// block (softmax_cols, normalize_cols). Their weights come from exp_batch's flushing form.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "impl/batch.hpp"
#include "impl/softmax/exp.hpp"
#include "impl/softmax/tanh.hpp"

namespace simdattn::simd::impl {

template <class Arch, class T>
T scale_add_max(T* x, std::int64_t n, T scale, const T* add) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const B s(scale);
  B m0(-std::numeric_limits<T>::infinity()), m1 = m0;
  std::int64_t i = 0;
  if (add != nullptr) {
    for (; i + 2 * W <= n; i += 2 * W) {
      const B a = xsimd::fma(B::load_unaligned(x + i), s, B::load_unaligned(add + i));
      const B b = xsimd::fma(B::load_unaligned(x + i + W), s, B::load_unaligned(add + i + W));
      a.store_unaligned(x + i);
      b.store_unaligned(x + i + W);
      m0 = xsimd::max(m0, a);
      m1 = xsimd::max(m1, b);
    }
  } else {
    for (; i + 2 * W <= n; i += 2 * W) {
      const B a = B::load_unaligned(x + i) * s;
      const B b = B::load_unaligned(x + i + W) * s;
      a.store_unaligned(x + i);
      b.store_unaligned(x + i + W);
      m0 = xsimd::max(m0, a);
      m1 = xsimd::max(m1, b);
    }
  }
  for (; i + W <= n; i += W) {
    B a = B::load_unaligned(x + i) * s;
    if (add != nullptr) a += B::load_unaligned(add + i);
    a.store_unaligned(x + i);
    m0 = xsimd::max(m0, a);
  }
  if (i < n) {
    B a = load_tail<Arch, T>(x + i, n - i, T(0)) * s;
    if (add != nullptr) a += load_tail<Arch, T>(add + i, n - i, T(0));
    store_tail<Arch, T>(x + i, n - i, a);
    m1 = xsimd::max(m1, blend_tail<Arch, T>(a, n - i, -std::numeric_limits<T>::infinity()));
  }
  return hmax<Arch, T>(xsimd::max(m0, m1));
}

template <class Arch, class T>
T exp_sub_max_sum(T* x, std::int64_t n, T max) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  // A fully masked row has max = -inf and only -inf entries: exp(-inf - 0) = 0, never NaN.
  const B m(max == -std::numeric_limits<T>::infinity() ? T(0) : max);
  B s0(T(0)), s1(T(0));
  std::int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const B a = exp_batch<Arch, T, true, true>(B::load_unaligned(x + i) - m);
    const B b = exp_batch<Arch, T, true, true>(B::load_unaligned(x + i + W) - m);
    a.store_unaligned(x + i);
    b.store_unaligned(x + i + W);
    s0 += a;
    s1 += b;
  }
  for (; i + W <= n; i += W) {
    const B a = exp_batch<Arch, T, true, true>(B::load_unaligned(x + i) - m);
    a.store_unaligned(x + i);
    s0 += a;
  }
  if (i < n) {  // -inf in the missing lanes: exp gives 0 there, nothing reaches the sum
    const B a = exp_batch<Arch, T, true, true>(load_tail<Arch, T>(x + i, n - i, -std::numeric_limits<T>::infinity()) - m);
    store_tail<Arch, T>(x + i, n - i, a);
    s1 += a;
  }
  return xsimd::hadd(s0 + s1);
}

// ---------------------------------------------------------------------------------------------
// The online-softmax step over a block of rows (see VectorKernels::softmax_rows). Rows go in
// fours (then a pair, then one), their max and exp passes interleaved: four independent
// dependency chains per loop, and four rows' horizontal max and sum in flight at once (fours
// rather than pairs: guarded by attention/native/bert and attention/native/vit).

// How far (in the exponent) a block's max may exceed the row's reference max before the
// reference moves: below it the weights are exp(s - m) <= e^8 and the row's accumulated output
// needs no rescale (most later blocks of a long row).
inline constexpr double kSoftmaxSlack = 8.0;

// One row's reference-max update of the online-softmax step (VectorKernels::softmax_rows) from
// its block max bm of the scaled scores: m, l and alpha as that contract says. Returns the value
// the block's weights are taken against: m_new, or 0 for a row with no visible key yet
// (exp(-inf - 0) = 0).
template <class T>
inline T online_max_step(T bm, T& m, T& l, T& alpha) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T mo = m;
  // a NaN max does not raise it; within the slack of a finite reference, the reference stays
  const T mn = bm > mo && !(mo != neg_inf && bm <= mo + T(kSoftmaxSlack)) ? bm : mo;
  T a = T(1);
  if (mn != mo && mo != neg_inf) {
    a = std::exp(mo - mn);
    l *= a;
  } else if (mo == neg_inf && mn != neg_inf) {
    a = T(-1);
  }
  alpha = a;
  m = mn;
  return mn == neg_inf ? T(0) : mn;
}

// Capped: s = cap * tanh(x * scale / cap) (VectorKernels::softmax_rows with cap > 0). tanh
// rises monotonically, so the block max is the capped max of x * scale / cap, and the cap is
// taken in the exp pass only: no pass of its own, nothing stored between (gpt-softcap 1.12-1.20x
// of gpt as a separate pass before the step).
template <class Arch, class T, int R, bool Capped>
inline void softmax_row_group(T* x, std::int64_t ld, std::int64_t n, T scale, T cap, T* m, T* l, T* alpha) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T k = Capped ? scale / cap : scale;  // the factor on x: the score, or tanh's argument
  const B s(k), c(cap);
  auto score = [&](const B& v) {  // from the factored x to the score
    if constexpr (Capped) return c * tanh_batch<Arch, T>(v);
    else return v;
  };
  const std::int64_t nf = n / W * W, tail = n - nf;
  // The block max of x * k. For k > 0 it is (max x) * k exactly (rounding is monotonic), one
  // operation per vector fewer.
  const bool positive = k > T(0);
  B mx[R];
  for (int q = 0; q < R; ++q) mx[q] = B(neg_inf);
  auto max_pass = [&](auto scaled) {  // scaled: std::true_type multiplies each vector by s
    auto sc = [&](const B& v) {
      if constexpr (decltype(scaled)::value) return v * s;
      else return v;
    };
    for (std::int64_t i = 0; i < nf; i += W)
      for (int q = 0; q < R; ++q) mx[q] = xsimd::max(mx[q], sc(B::load_unaligned(x + q * ld + i)));
    if (tail > 0)
      for (int q = 0; q < R; ++q)
        mx[q] = xsimd::max(mx[q], blend_tail<Arch, T>(sc(load_tail<Arch, T>(x + q * ld + nf, tail, T(0))), tail, neg_inf));
  };
  if (positive) max_pass(std::false_type{});
  else max_pass(std::true_type{});
  B ref[R], sum[R];
  for (int q = 0; q < R; ++q) {
    T bm = positive ? hmax<Arch, T>(mx[q]) * k : hmax<Arch, T>(mx[q]);
    // capped: through the exp pass's own tanh (so no weight exceeds exp(0) by its rounding);
    // -inf here is a row with no key in the block (n = 0), or with scores -inf (capped: -cap)
    // or NaN only
    if constexpr (Capped) bm = n > 0 ? score(B(bm)).get(0) : neg_inf;
    ref[q] = B(online_max_step(bm, m[q], l[q], alpha[q]));
    sum[q] = B(T(0));
  }
  for (std::int64_t i = 0; i < nf; i += W)
    for (int q = 0; q < R; ++q) {
      const B p = exp_batch<Arch, T, true, true>(score(B::load_unaligned(x + q * ld + i) * s) - ref[q]);
      p.store_unaligned(x + q * ld + i);
      sum[q] += p;
    }
  if (tail > 0)
    for (int q = 0; q < R; ++q) {
      // -inf in the missing lanes: exp gives 0 there, nothing reaches the sum
      const B v = blend_tail<Arch, T>(score(load_tail<Arch, T>(x + q * ld + nf, tail, T(0)) * s) - ref[q], tail,
                                      neg_inf);
      const B p = exp_batch<Arch, T, true, true>(v);
      store_tail<Arch, T>(x + q * ld + nf, tail, p);
      sum[q] += p;
    }
  for (int q = 0; q < R; ++q) l[q] += xsimd::hadd(sum[q]);
}

template <class Arch, class T, bool Capped>
void softmax_rows_as(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, T cap, const std::int64_t* lo,
                     const std::int64_t* hi, T* m, T* l, T* alpha) {
  if (lo != nullptr) {  // one visible interval per row: the step on it, zeros around it
    for (std::int64_t r = 0; r < rows; ++r) {
      T* row = x + r * ld;
      const std::int64_t a = std::min(lo[r], n), z = std::max(a, std::min(hi[r], n));
      softmax_row_group<Arch, T, 1, Capped>(row + a, ld, z - a, scale, cap, m + r, l + r, alpha + r);
      for (std::int64_t j = 0; j < a; ++j) row[j] = T(0);
      for (std::int64_t j = z; j < n; ++j) row[j] = T(0);
    }
    return;
  }
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    softmax_row_group<Arch, T, 4, Capped>(x + r * ld, ld, n, scale, cap, m + r, l + r, alpha + r);
  if (r + 2 <= rows) {
    softmax_row_group<Arch, T, 2, Capped>(x + r * ld, ld, n, scale, cap, m + r, l + r, alpha + r);
    r += 2;
  }
  if (r < rows) softmax_row_group<Arch, T, 1, Capped>(x + r * ld, ld, n, scale, cap, m + r, l + r, alpha + r);
}

template <class Arch, class T>
void softmax_rows(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, T cap, const std::int64_t* lo,
                  const std::int64_t* hi, T* m, T* l, T* alpha) {
  if (cap > T(0)) softmax_rows_as<Arch, T, true>(x, ld, rows, n, scale, cap, lo, hi, m, l, alpha);
  else softmax_rows_as<Arch, T, false>(x, ld, rows, n, scale, cap, lo, hi, m, l, alpha);
}

template <class Arch, class T>
void normalize_rows(const T* x, std::int64_t ldx, std::int64_t rows, std::int64_t n, const T* l, T* y,
                    std::int64_t ldy) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const std::int64_t nf = n / W * W;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * ldx;
    T* yr = y + r * ldy;
    if (l[r] == T(0)) {
      for (std::int64_t i = 0; i < n; ++i) yr[i] = T(0);
      continue;
    }
    const B inv(T(1) / l[r]);
    for (std::int64_t i = 0; i < nf; i += W) (B::load_unaligned(xr + i) * inv).store_unaligned(yr + i);
    if (nf < n) store_tail<Arch, T>(yr + nf, n - nf, load_tail<Arch, T>(xr + nf, n - nf, T(0)) * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax down CV vectors of columns of a block (see VectorKernels::softmax_cols). The max pass
// keeps two accumulators per column vector (even and odd rows): 2 CV independent chains. Its
// scaled-or-not dispatch repeats softmax_row_group's on purpose: a helper shared by the two
// changed GCC's inlining and register allocation of both.
template <class Arch, class T, int CV>
inline void softmax_col_group(T* x, std::int64_t ld, std::int64_t rows, T scale, T* l) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const B s(scale);
  B mx[2][CV];
  for (int v = 0; v < CV; ++v) mx[0][v] = mx[1][v] = B(neg_inf);
  // The column max of x * scale; for scale > 0, (max x) * scale exactly (rounding is monotonic).
  const bool positive = scale > T(0);
  auto max_pass = [&](auto scaled) {
    auto sc = [&](const B& v) {
      if constexpr (decltype(scaled)::value) return v * s;
      else return v;
    };
    std::int64_t r = 0;
    for (; r + 2 <= rows; r += 2)
      for (int v = 0; v < CV; ++v) {
        mx[0][v] = xsimd::max(mx[0][v], sc(B::load_aligned(x + r * ld + v * W)));
        mx[1][v] = xsimd::max(mx[1][v], sc(B::load_aligned(x + (r + 1) * ld + v * W)));
      }
    if (r < rows)
      for (int v = 0; v < CV; ++v) mx[0][v] = xsimd::max(mx[0][v], sc(B::load_aligned(x + r * ld + v * W)));
  };
  if (positive) max_pass(std::false_type{});
  else max_pass(std::true_type{});
  B ref[CV], sum[CV];
  for (int v = 0; v < CV; ++v) {
    B m = xsimd::max(mx[0][v], mx[1][v]);
    if (positive) m = m * s;
    ref[v] = xsimd::select(m == B(neg_inf), B(T(0)), m);  // no finite score: every weight 0
    sum[v] = B(T(0));
  }
  for (std::int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < CV; ++v) {
      T* p = x + r * ld + v * W;
      const B w = exp_batch<Arch, T, true, true>(xsimd::fma(B::load_aligned(p), s, -ref[v]));
      w.store_aligned(p);
      sum[v] += w;
    }
  for (int v = 0; v < CV; ++v) sum[v].store_unaligned(l + v * W);
}

template <class Arch, class T>
void softmax_cols(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, T* l) {
  constexpr std::int64_t W = batch<T, Arch>::size;
  std::int64_t c = 0;
  for (; c + 4 * W <= n; c += 4 * W) softmax_col_group<Arch, T, 4>(x + c, ld, rows, scale, l + c);
  if (n - c == 3 * W) softmax_col_group<Arch, T, 3>(x + c, ld, rows, scale, l + c);
  else if (n - c == 2 * W) softmax_col_group<Arch, T, 2>(x + c, ld, rows, scale, l + c);
  else if (n - c == W) softmax_col_group<Arch, T, 1>(x + c, ld, rows, scale, l + c);
}

// x[r, c] *= 1 / l[c] (0 where l[c] == 0), columns in vectors.
template <class Arch, class T>
void normalize_cols(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, const T* l) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  for (std::int64_t c = 0; c < n; c += W) {
    const B lv = B::load_unaligned(l + c);
    const B inv = xsimd::select(lv == B(T(0)), B(T(0)), B(T(1)) / lv);
    for (std::int64_t r = 0; r < rows; ++r) (B::load_aligned(x + r * ld + c) * inv).store_aligned(x + r * ld + c);
  }
}

}  // namespace simdattn::simd::impl
