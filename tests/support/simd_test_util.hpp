// Helpers for the tests of the SIMD layer and the GEMM: the kernel table of every ISA this CPU
// supports, an error measure in units in the last place, and what an online-softmax step should
// leave (the reference max, alpha, l).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "simdattn/simd/kernels.hpp"

namespace simdattn::test {

// The kernel table of every ISA this CPU supports (so the AVX2 and SSE2 kernels are tested on an
// AVX-512 machine too).
inline std::vector<const simd::KernelTable*> kernel_tables() {
  std::vector<const simd::KernelTable*> out;
  for (simd::Isa isa : simd::available_isas()) out.push_back(simd::kernels_for(isa));
  return out;
}

// Distance in units in the last place of `want` (denormal spacing below the normal range).
template <class T>
double ulp_error(T got, long double want) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) == std::isnan(static_cast<double>(want)) ? 0 : 1e300;
  if (std::isinf(static_cast<T>(want)) || std::isinf(got)) return static_cast<T>(want) == got ? 0 : 1e300;
  const long double a = std::fabs(want);
  int e = 0;
  std::frexp(static_cast<double>(a == 0 ? std::numeric_limits<T>::min() : a), &e);
  const int digits = std::numeric_limits<T>::digits;
  const int min_exp = std::numeric_limits<T>::min_exponent;  // e of the smallest normal
  const long double ulp = std::ldexp(1.0L, std::max(e, min_exp) - digits);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

// What one online-softmax step should leave, from the block's max bm and the prior reference m0:
// the reference max (it moves when bm passes m0 by more than 8, or m0 is -inf) and alpha.
template <class T>
inline std::pair<T, T> expected_max_alpha(T bm, T m0) {
  const T inf = std::numeric_limits<T>::infinity();
  const T mn = bm > m0 && (m0 == -inf || bm > m0 + T(8)) ? bm : m0;
  const T alpha = (mn != m0 && m0 != -inf) ? std::exp(m0 - mn) : (m0 == -inf && mn != -inf) ? T(-1) : T(1);
  return {mn, alpha};
}

// l after the step: the prior l rescaled when the max moved from a finite value, plus the weights.
template <class T>
inline long double expected_l(T l0, T alpha, long double sum) {
  return static_cast<long double>(alpha >= T(0) && alpha != T(1) ? l0 * alpha : l0) + sum;  // (-1: l0 is 0)
}

}  // namespace simdattn::test
