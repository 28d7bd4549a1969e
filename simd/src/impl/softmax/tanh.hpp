// tanh on a batch, for the soft cap of scores (VectorKernels::softcap_add_max and the capped
// online-softmax step, VectorKernels::softmax_rows).
#pragma once

#include <limits>

#include "impl/batch.hpp"
#include "impl/softmax/exp.hpp"

namespace simdattn::simd::impl {

// tanh on one batch: below kSmall an odd polynomial (f32: degree 11 fitted at Chebyshev nodes on
// [0, 0.55], 3.8e-9 relative; f64: Taylor's to y^17, 2e-20 at 0.125), above it sign(y) (1 - 2 /
// (exp(2|y|) + 1)), whose exp error and cancellation cost a few ulp near kSmall (f32 moves to
// the exp form only at 0.55, where they stay within 4 ulp; f64's 0.125 within ~30 ulp, 7e-15
// relative); a batch with every lane below kSmall skips the exp. +-inf gives +-1, NaN stays NaN.
template <class Arch, class T>
inline batch<T, Arch> tanh_batch(const batch<T, Arch>& y) {
  using B = batch<T, Arch>;
  constexpr bool kF32 = sizeof(T) == 4;
  constexpr T kSmall = kF32 ? T(0.55) : T(0.125);
  // tanh(y) / y - 1 as a polynomial in y^2 (coefficients of y^2, y^4, ...)
  constexpr int kTerms = kF32 ? 5 : 8;
  constexpr long double c[8] = {
      kF32 ? -0.33333332L : -1.0L / 3.0L,          kF32 ? 0.133331137L : 2.0L / 15.0L,
      kF32 ? -0.0539094288L : -17.0L / 315.0L,     kF32 ? 0.0213093887L : 62.0L / 2835.0L,
      kF32 ? -0.00661022784L : -1382.0L / 155925.0L, 21844.0L / 6081075.0L,
      -929569.0L / 638512875.0L,                   6404582.0L / 10854718875.0L};
  const B sign_bit(-T(0));
  const B a = xsimd::abs(y);
  const B y2 = y * y;
  B p(static_cast<T>(c[kTerms - 1]));
  for (int k = kTerms - 2; k >= 0; --k) p = xsimd::fma(p, y2, B(static_cast<T>(c[k])));
  const B small = xsimd::fma(y * y2, p, y);
  const auto near = a < B(kSmall);
  if (xsimd::all(near)) return small;  // (scores well inside the cap: the exp form is not needed)
  const B e = exp_batch<Arch, T>(a + a);
  const B big = B(T(1)) - B(T(2)) / (e + B(T(1)));
  return xsimd::select(near, small, xsimd::bitwise_or(big, xsimd::bitwise_and(y, sign_bit)));
}

}  // namespace simdattn::simd::impl
