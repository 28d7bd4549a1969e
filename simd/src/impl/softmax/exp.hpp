// exp on one batch (exp_batch): the accurate form behind VectorKernels::exp and elu1, and the
// cheaper, flushing form of the softmax weights; with its constants.
#pragma once

#include <cstdint>
#include <type_traits>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

// 1/k! for the Taylor coefficients, computed in long double and rounded once.
template <class T, int N>
struct InvFactorials {
  T v[N + 1];
  constexpr InvFactorials() : v{} {
    long double f = 1.0L;
    for (int k = 0; k <= N; ++k) {
      if (k > 0) f *= k;
      v[k] = static_cast<T>(1.0L / f);
    }
  }
  constexpr T operator[](int k) const { return v[k]; }
};
//
// exp(x) = 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 (Cody-Waite: ln 2 split in a
// high part with trailing zero bits, so n * ln2_hi is exact), |r| <= ln2/2. e^r is a polynomial
// in Horner form: for f32 of degree 6, 1 + r + r^2 (c2 + ... + c6 r^4) with c2..c6 fitted for
// least relative error on [-ln2/2, ln2/2] (3.1e-9 in exact arithmetic, 0.72 ulp with f32 FMA
// rounding, where the degree-7 Taylor polynomial it replaced gave 0.76 ulp with one FMA more);
// for f64 the degree-13 Taylor polynomial (truncation error < 0.05 ulp). 2^n is
// applied as two exponent-field multiplies 2^n1 * 2^n2 (n1 = floor(n/2)), each a normal power of
// two, so results in the denormal range come out correctly rounded-ish (one extra rounding)
// without a slow path, overflow saturates to +inf, and -inf clamps to an exact 0.
template <class T> struct ExpConst;
template <> struct ExpConst<float> {
  static constexpr float lo = -150.f, hi = 100.f;  // e^lo underflows to 0, e^hi overflows
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f, ln2 = 0.693147180559945309f;
  static constexpr float round_magic = 12582912.f;      // 1.5 * 2^23: adds round to integer
  static constexpr float exp_magic = 8388608.f + 127.f;  // 2^23 + bias: integer into low bits
  static constexpr int mant_bits = 23;
  static constexpr int degree = 6;
  static constexpr float coef[degree + 1] = {1.f, 1.f, 0.4999999403953552f, 0.1666652113199234f,
                                             0.04166838899254799f, 0.008368710055947304f,
                                             0.0013814611593261361f};
  static constexpr int w_degree = 5;
  static constexpr float w_coef[w_degree + 1] = {1.f, 1.f, 0.4999923f, 0.16667114f, 0.041890096f, 0.008312506f};
};
template <> struct ExpConst<double> {
  static constexpr double lo = -1100.0, hi = 720.0;
  static constexpr double log2e = 1.44269504088896338700e+00;
  static constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  static constexpr double ln2 = 0.693147180559945309417;
  static constexpr double round_magic = 6755399441055744.0;           // 1.5 * 2^52
  static constexpr double exp_magic = 4503599627370496.0 + 1023.0;    // 2^52 + bias
  static constexpr int mant_bits = 52;
  static constexpr int degree = 13;
  static constexpr InvFactorials<double, 13> coef{};
};

template <class T> using int_of = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;

// 2^n for integral n in the normal exponent range, as the exponent field of a float.
template <class Arch, class T>
inline batch<T, Arch> pow2i(const batch<T, Arch>& n) {
  using C = ExpConst<T>;
  using I = int_of<T>;
  // n + bias + 2^mant_bits has n + bias in its low mantissa bits; shifting them into the
  // exponent field pushes the 2^mant_bits marker out of the word.
  const batch<I, Arch> bits = xsimd::bitwise_cast<batch<I, Arch>>(n + batch<T, Arch>(C::exp_magic));
  return xsimd::bitwise_cast<batch<T, Arch>>(bits << C::mant_bits);
}

// kFlush: results below the smallest normal become 0 instead of denormals. Softmax weights that
// small are invisible next to the row maximum's weight of 1, and producing denormals costs a
// microcode assist per instruction on Intel cores, and the masked scores of causal rows give
// many (guarded by attention/native/gpt).
// kNonPositive: the caller guarantees x <= 0 or NaN (scores minus their row max), so the clamp
// against overflow is skipped.
template <class Arch, class T, bool kFlush = false, bool kNonPositive = false>
inline batch<T, Arch> exp_batch(const batch<T, Arch>& x) {
  using B = batch<T, Arch>;
  using C = ExpConst<T>;
  // ln of the smallest normal number
  constexpr T kMinNormalLog = sizeof(T) == 4 ? T(-87.33654) : T(-708.3964185322641);
  // Clamp, round x / ln 2 to an integer. The clamp keeps NaN: x86 min/max return their second
  // operand when either is NaN (xsimd maps max(a, b) to maxps(a, b)), and NaN then flows through
  // every later step, so no separate NaN test is needed.
  // f32 softmax weights (kFlush and kNonPositive, with a hardware FMA): cheaper and a little less
  // exact, 12 instead of 15 vector operations per 16 weights (guarded by attention/native/batch,
  // sdcross and vit). No clamp: lanes below the smallest normal's log (-inf among them) are
  // zeroed at the end whatever the steps between made of them. r = x - n ln2 in one FMA with
  // ln 2 rounded once to f32 (its error, |n| 1.9e-9, is 2.4e-7 relative at the flush threshold,
  // where a weight is 1e-38; f64's ln 2 is relatively 12x less exact, so f64 keeps the two-step
  // reduction), and a fitted degree-5 polynomial (1.05e-7 relative). A weight is within
  // 3 + |x| / 16 ulp (SSE2 keeps the exact path: its emulated FMA rounds the product).
  constexpr bool kWeights = kFlush && kNonPositive && kHasFma<Arch> && sizeof(T) == 4;
  B xc = x;
  if constexpr (!kWeights) xc = xsimd::max(B(kFlush ? kMinNormalLog : C::lo), x);
  if constexpr (!kNonPositive) xc = xsimd::min(B(C::hi), xc);
  const B n = xsimd::fma(xc, B(C::log2e), B(C::round_magic)) - B(C::round_magic);
  // r = x - n ln2_hi - n ln2_lo as FMAs with the constants negated (exactly): written as fnma,
  // GCC negates n into a register first, one instruction more per vector.
  B r, p;
  auto horner = [&r](const auto& coef, int degree) {
    B q(coef[degree]);
    for (int k = degree - 1; k >= 0; --k) q = xsimd::fma(q, r, B(coef[k]));
    return q;
  };
  if constexpr (kWeights) {
    r = xsimd::fma(n, B(-C::ln2), xc);
    p = horner(C::w_coef, C::w_degree);
  } else {
    r = xsimd::fma(n, B(-C::ln2_hi), xc);
    r = xsimd::fma(n, B(-C::ln2_lo), r);
    p = horner(C::coef, C::degree);
  }
  B y;
  if constexpr (kHasAvx512<Arch>) {
    // vscalefps/pd: p * 2^n in one instruction, correctly rounded into the denormal range,
    // +inf on overflow, 0 on underflow. Flushing, lanes below the smallest normal are zeroed by
    // the same instruction (its zero-masking form): one blend fewer per vector. The mask keeps
    // NaN lanes (an unordered compare is true for "not less than").
#if defined(__AVX512F__)  // (the intrinsics' constants exist only in the AVX-512 translation unit)
    if constexpr (kFlush) {
      if constexpr (sizeof(T) == 4)
        return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, B(kMinNormalLog), _CMP_NLT_UQ), p, n);
      else
        return _mm512_maskz_scalef_pd(_mm512_cmp_pd_mask(x, B(kMinNormalLog), _CMP_NLT_UQ), p, n);
    }
#endif
    if constexpr (sizeof(T) == 4) y = _mm512_scalef_ps(p, n);
    else y = _mm512_scalef_pd(p, n);
  } else {
    // 2^n = 2^n1 * 2^n2 with both halves in the normal range.
    const B n1 = xsimd::floor(n * B(T(0.5)));
    y = (p * pow2i<Arch, T>(n1)) * pow2i<Arch, T>(n - n1);
  }
  if constexpr (kFlush) y = xsimd::select(x < B(kMinNormalLog), B(T(0)), y);  // NaN < a is false
  return y;
}

}  // namespace simdattn::simd::impl
