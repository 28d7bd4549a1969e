// The element-wise array kernels of VectorKernels: exp, linear attention's feature maps (elu1,
// relu), the horizontal max and sum, and scaling.
#pragma once

#include <cstdint>
#include <limits>

#include "impl/batch.hpp"
#include "impl/softmax/exp.hpp"
#include "impl/softmax/tanh.hpp"

namespace simdattn::simd::impl {

template <class Arch, class T>
void exp_array(const T* x, T* y, std::int64_t n) {
  map_array<Arch, T>(x, y, n, [](const batch<T, Arch>& v) { return exp_batch<Arch, T>(v); });
}

// Linear attention's feature maps. Selects on x > 0 / x < 0 (false for NaN) keep NaN, where
// xsimd::max / min would drop it.
template <class Arch, class T>
inline batch<T, Arch> elu1_batch(const batch<T, Arch>& x) {
  using B = batch<T, Arch>;
  const B zero(T(0));
  return xsimd::select(x > zero, x, zero) + exp_batch<Arch, T>(xsimd::select(x > zero, zero, x));
}

template <class Arch, class T>
void elu1_array(const T* x, T* y, std::int64_t n) {
  map_array<Arch, T>(x, y, n, [](const batch<T, Arch>& v) { return elu1_batch<Arch, T>(v); });
}

template <class Arch, class T>
void relu_array(const T* x, T* y, std::int64_t n) {
  map_array<Arch, T>(x, y, n, [](const batch<T, Arch>& v) {
    const batch<T, Arch> zero(T(0));
    return xsimd::select(v < zero, zero, v);
  });
}

// Reductions: four independent accumulators hide the latency of max/add (4 cycles) behind two
// issue ports.

template <class Arch, class T>
T max_array(const T* x, std::int64_t n) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  B m0(neg_inf), m1(neg_inf), m2(neg_inf), m3(neg_inf);
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    m0 = xsimd::max(m0, B::load_unaligned(x + i));
    m1 = xsimd::max(m1, B::load_unaligned(x + i + W));
    m2 = xsimd::max(m2, B::load_unaligned(x + i + 2 * W));
    m3 = xsimd::max(m3, B::load_unaligned(x + i + 3 * W));
  }
  for (; i + W <= n; i += W) m0 = xsimd::max(m0, B::load_unaligned(x + i));
  T m = hmax<Arch, T>(xsimd::max(xsimd::max(m0, m1), xsimd::max(m2, m3)));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

template <class Arch, class T>
T sum_array(const T* x, std::int64_t n) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  B s0(T(0)), s1(T(0)), s2(T(0)), s3(T(0));
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    s0 += B::load_unaligned(x + i);
    s1 += B::load_unaligned(x + i + W);
    s2 += B::load_unaligned(x + i + 2 * W);
    s3 += B::load_unaligned(x + i + 3 * W);
  }
  for (; i + W <= n; i += W) s0 += B::load_unaligned(x + i);
  T s = xsimd::hadd((s0 + s1) + (s2 + s3));
  for (; i < n; ++i) s += x[i];
  return s;
}

template <class Arch, class T>
void scale_array(T* x, std::int64_t n, T a) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const B va(a);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) (B::load_unaligned(x + i) * va).store_unaligned(x + i);
  for (; i < n; ++i) x[i] *= a;
}

// x[i] = cap * tanh(x[i] * scale / cap) + (add ? add[i] : 0): the scaled scores, soft-capped,
// plus a bias; returns the max.
template <class Arch, class T>
T softcap_add_max(T* x, std::int64_t n, T scale, T cap, const T* add) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const B s(scale / cap), c(cap);
  B m(neg_inf);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) {
    B r = c * tanh_batch<Arch, T>(B::load_unaligned(x + i) * s);
    if (add != nullptr) r += B::load_unaligned(add + i);
    r.store_unaligned(x + i);
    m = xsimd::max(m, r);
  }
  T mx = hmax<Arch, T>(m);
  if (i < n) {
    alignas(64) T tail[W] = {};
    for (std::int64_t t = 0; t < n - i; ++t) tail[t] = x[i + t];
    const B r = c * tanh_batch<Arch, T>(B::load_aligned(tail) * s);
    r.store_aligned(tail);
    for (std::int64_t t = 0; t < n - i; ++t) {
      x[i + t] = tail[t] + (add != nullptr ? add[i + t] : T(0));
      mx = x[i + t] > mx ? x[i + t] : mx;
    }
  }
  return mx;
}

template <class Arch, class T>
void scale_to_array(const T* x, T* y, std::int64_t n, T a) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const B va(a);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) (B::load_unaligned(x + i) * va).store_unaligned(y + i);
  if (i < n) store_tail<Arch, T>(y + i, n - i, load_tail<Arch, T>(x + i, n - i, T(0)) * va);
}

}  // namespace simdattn::simd::impl
