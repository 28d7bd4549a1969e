// Arch-templated SIMD kernels, written once and instantiated per ISA by kernels_<isa>.cpp.
//
// Include only from those files: everything here is compiled with the including file's ISA
// flags. Every function is a template on Arch, so no two ISAs' builds share a symbol and the
// linker cannot fold an AVX-512 body into the baseline path.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <limits>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "simdattn/simd/kernels.hpp"

namespace simdattn::simd::impl {

template <class T, class Arch> using batch = xsimd::batch<T, Arch>;

// ---------------------------------------------------------------------------------------------
// exp
//
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

template <class Arch> constexpr bool kHasAvx512 = std::is_base_of_v<xsimd::avx512f, Arch>;
// A fused multiply-add in hardware (SSE2's xsimd::fma rounds the product first).
template <class Arch>
constexpr bool kHasFma = kHasAvx512<Arch> || std::is_base_of_v<xsimd::fma3<xsimd::avx2>, Arch>;

// The first n < W elements of p into a batch, `fill` in the other lanes; and the reverse. On
// AVX-512 these are single masked loads/stores, elsewhere a trip through a stack buffer.
template <class Arch, class T>
inline batch<T, Arch> load_tail(const T* p, std::int64_t n, T fill) {
  using B = batch<T, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    if constexpr (sizeof(T) == 4) return _mm512_mask_loadu_ps(B(fill), static_cast<unsigned short>((1u << n) - 1), p);
    else return _mm512_mask_loadu_pd(B(fill), static_cast<unsigned char>((1u << n) - 1), p);
  } else {
    alignas(64) T buf[B::size];
    for (std::size_t i = 0; i < B::size; ++i) buf[i] = static_cast<std::int64_t>(i) < n ? p[i] : fill;
    return B::load_aligned(buf);
  }
}
// Lanes n and above of v replaced by `value`.
template <class Arch, class T>
inline batch<T, Arch> blend_tail(const batch<T, Arch>& v, std::int64_t n, T value) {
  using B = batch<T, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    if constexpr (sizeof(T) == 4) return _mm512_mask_blend_ps(static_cast<unsigned short>((1u << n) - 1), B(value), v);
    else return _mm512_mask_blend_pd(static_cast<unsigned char>((1u << n) - 1), B(value), v);
  } else {
    alignas(64) T buf[B::size];
    v.store_aligned(buf);
    for (std::size_t i = static_cast<std::size_t>(n); i < B::size; ++i) buf[i] = value;
    return B::load_aligned(buf);
  }
}

template <class Arch, class T>
inline void store_tail(T* p, std::int64_t n, const batch<T, Arch>& v) {
  using B = batch<T, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    if constexpr (sizeof(T) == 4) _mm512_mask_storeu_ps(p, static_cast<unsigned short>((1u << n) - 1), v);
    else _mm512_mask_storeu_pd(p, static_cast<unsigned char>((1u << n) - 1), v);
  } else {
    alignas(64) T buf[B::size];
    v.store_aligned(buf);
    for (std::int64_t i = 0; i < n; ++i) p[i] = buf[i];
  }
}

// kFlush: results below the smallest normal become 0 instead of denormals. Softmax weights that
// small are invisible next to the row maximum's weight of 1, and producing denormals costs a
// microcode assist per instruction on Intel cores (exp of masked scores: 29% of a causal run).
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
  // exact, 12 instead of 15 vector operations per 16 weights (perf, best of 5 alternating runs,
  // t1: batch 53.7 -> 52.7 ms, sdcross 9.09 -> 8.85, vit 1.035 -> 1.021). No clamp: lanes below
  // the smallest normal's log (-inf among them) are zeroed at the end whatever the steps between
  // made of them. r = x - n ln2 in one FMA with ln 2 rounded once to f32 (its error, |n| 1.9e-9,
  // is 2.4e-7 relative at the flush threshold, where a weight is 1e-38; f64's ln 2 is relatively
  // 12x less exact, so f64 keeps the two-step reduction), and a fitted degree-5 polynomial
  // (1.05e-7 relative). A weight is within 3 + |x| / 16 ulp (SSE2 keeps the exact path: its
  // emulated FMA rounds the product).
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

// y[i] = f(x[i]) for a batch function f; y may equal x.
template <class Arch, class T, class F>
inline void map_array(const T* x, T* y, std::int64_t n, F f) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) f(B::load_unaligned(x + i)).store_unaligned(y + i);
  if (i < n)  // the same arithmetic as the main loop, on a partial vector
    store_tail<Arch, T>(y + i, n - i, f(load_tail<Arch, T>(x + i, n - i, T(0))));
}

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

// ---------------------------------------------------------------------------------------------
// Reductions and the fused softmax passes. Four independent accumulators hide the latency of
// max/add (4 cycles) behind two issue ports.

template <class Arch, class T>
inline T hmax(const batch<T, Arch>& v) {
  alignas(64) T buf[batch<T, Arch>::size];
  v.store_aligned(buf);
  T m = buf[0];
  for (std::size_t i = 1; i < batch<T, Arch>::size; ++i) m = buf[i] > m ? buf[i] : m;
  return m;
}

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

template <class Arch, class T>
void scale_array(T* x, std::int64_t n, T a) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const B va(a);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) (B::load_unaligned(x + i) * va).store_unaligned(x + i);
  for (; i < n; ++i) x[i] *= a;
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

#if defined(__AVX512F__)
// r[i] := column i of the 16 x 16 matrix whose rows are r[0..15] (unpack 32- and 64-bit pairs,
// then swap 128-bit lanes twice).
inline void transpose16x16(__m512 r[16]) {
  __m512 t[16], u[16], v[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j) {
      v[8 * h + j] = _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0x88);
      v[8 * h + 4 + j] = _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0xdd);
  }
}
#endif

template <class Arch, class T>
void pack_transpose(const T* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, T* dst,
                    std::int64_t dst_ld, std::int64_t width) {
  // AVX-512, f32: 16 x 16 blocks transposed in registers (16 row loads, 64 shuffles, 16
  // stores), where a masked gather per 16 rows and column cost ~3x as much (pack_transpose was
  // 5.5% of vit). Partial blocks load with a column mask; rows past `rows` are zero vectors and
  // are never read.
#if defined(__AVX512F__)
  if constexpr (kHasAvx512<Arch> && sizeof(T) == 4) {
    for (std::int64_t r0 = 0; r0 < width; r0 += 16) {
      const std::int64_t nrow = std::max<std::int64_t>(0, std::min<std::int64_t>(16, rows - r0));
      for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
        const std::int64_t ncol = std::min<std::int64_t>(16, cols - c0);
        const auto cm = static_cast<__mmask16>(ncol == 16 ? 0xffffu : (1u << ncol) - 1u);
        __m512 v[16];
        for (std::int64_t i = 0; i < 16; ++i)
          v[i] = i < nrow ? _mm512_maskz_loadu_ps(cm, src + (r0 + i) * ld + c0) : _mm512_setzero_ps();
        transpose16x16(v);
        if (r0 + 16 <= width) {
          for (std::int64_t j = 0; j < ncol; ++j) _mm512_storeu_ps(dst + (c0 + j) * dst_ld + r0, v[j]);
        } else {  // a panel narrower than 16 (GEMM's A panels are 12 rows): store its lanes only
          const auto wm = static_cast<__mmask16>((1u << (width - r0)) - 1u);
          for (std::int64_t j = 0; j < ncol; ++j) _mm512_mask_storeu_ps(dst + (c0 + j) * dst_ld + r0, wm, v[j]);
        }
      }
    }
    return;
  }
#endif
  // c outer: one contiguous write stream, `rows` sequential read streams
  for (std::int64_t c = 0; c < cols; ++c) {
    T* d = dst + c * dst_ld;
    for (std::int64_t r = 0; r < rows; ++r) d[r] = src[r * ld + c];
    for (std::int64_t r = rows; r < width; ++r) d[r] = T(0);
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM micro-kernel: an MR x (NV vectors) tile of C held in registers for the whole kc loop.
// Per k step: NV aligned loads of the packed B row, MR broadcasts of A (folded into the FMA as a
// memory-broadcast operand), MR * NV independent FMAs. The k loop is unrolled 4x by hand: without
// it the loop counter and pointer updates cost ~25% of the FMA rate (measured: 131 -> 172 GFLOP/s
// for 14x32 on AVX-512 with L1-resident panels).
//
// MR rows are computed. kPackedA: element (i, k) of the A tile is A[k * AS + i] (packed with
// panel height AS >= MR) or A[i * lda + k] (in place).
// kPackedB: B rows are NV * W apart and 64-byte aligned (packed), else ldb apart (in place).
// (A compile-time B stride matters: with a runtime one GCC interleaves the unrolled steps and
// spills accumulators, 170 -> 130 GFLOP/s.)
// BS: the packed B panel's row stride (its width), >= NV * W.
// kPf: one prefetch (into L2) of the next of pf_lines lines from pf per four k steps.
template <class Arch, class T, int MR, int NV, bool kPackedA, bool kPackedB, int AS = MR, int BS = -1, bool kPf = false>
__attribute__((always_inline)) inline void gemm_tile(std::int64_t kc, const T* __restrict A, std::int64_t lda,
                                                     const T* __restrict Bp, std::int64_t ldb,
                                                     T* __restrict C, std::int64_t ldc, T alpha, T beta,
                                                     const char* pf = nullptr, std::int64_t pf_lines = 0) {
  using B = batch<T, Arch>;
  constexpr int W = static_cast<int>(B::size);
  constexpr int kBS = BS > 0 ? BS : NV * W;
  // With a short k loop the C tile's stores dominate: start fetching its lines (for writing) now
  // so they arrive while the k loop runs (gemm 2048x2048x64: 90 -> 130 GFLOP/s). With a long k
  // loop the early lines only crowd L1 (1024^3: 140 -> 123), so not then.
  if (kc <= 128) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      __builtin_prefetch(C + i * ldc, 1);
      __builtin_prefetch(C + i * ldc + NV * W - 1, 1);
    }
  }
  B acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = B(T(0));

  // One k step at offset u from the current A and B positions.
  auto step = [&](std::int64_t u) __attribute__((always_inline)) {
    // Keep each step's loads inside the step: left free, GCC hoists the next steps' loads and
    // runs out of the 32 registers (spilled accumulators: 170 -> 120 GFLOP/s).
    asm volatile("" ::: "memory");
    if constexpr (!kPackedB) {
      // B's rows in place are too far apart for the hardware prefetchers (3 KiB for a 768-wide
      // B): fetch each 8 steps ahead (gemm 128x768x768, same-process harness: t1 0.91 -> 0.86
      // ms, t2 0.48 -> 0.46, and 0.43-0.44 with one pass over all 768 rows of B).
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j)
        if ((j * W * sizeof(T)) % 64 == 0) __builtin_prefetch(Bp + (u + 8) * ldb + j * W, 0, 3);
    }
    B b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      b[j] = kPackedB ? B::load_aligned(Bp + u * kBS + j * W) : B::load_unaligned(Bp + u * ldb + j * W);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const B a(kPackedA ? A[u * AS + i] : A[i * lda + u]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = xsimd::fma(a, b[j], acc[i][j]);
    }
  };
  std::int64_t k = 0;
  for (; k + 4 <= kc; k += 4) {
    if constexpr (kPf) {
      if (pf_lines > 0) {
        __builtin_prefetch(pf, 0, 2);
        pf += 64;
        --pf_lines;
      }
    }
    step(0);
    step(1);
    step(2);
    step(3);
    A += kPackedA ? 4 * AS : 4;
    Bp += kPackedB ? 4 * kBS : 4 * ldb;
  }
  for (; k < kc; ++k) {
    step(0);
    A += kPackedA ? AS : 1;
    Bp += kPackedB ? kBS : ldb;
  }

  const B va(alpha);
  if (beta == T(0)) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) (acc[i][j] * va).store_unaligned(C + i * ldc + j * W);
  } else {
    const B vb(beta);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        T* c = C + i * ldc + j * W;
        xsimd::fma(acc[i][j], va, B::load_unaligned(c) * vb).store_unaligned(c);
      }
  }
}

// M rows of a packed panel of height MR (M == MR: the full tile; M < MR: the last rows of C).
// Each variant is its own function: inlining two tile bodies into one function costs the
// register allocator dearly (measured 170 -> 77 GFLOP/s).
template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C, std::int64_t ldc,
                  T alpha, T beta) {
  gemm_tile<Arch, T, M, NV, true, true, MR>(kc, Ap, MR, Bp, ldb, C, ldc, alpha, beta);
}

template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel_pf(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C, std::int64_t ldc, T alpha,
                     T beta, const void* pf, std::int64_t pf_lines) {
  gemm_tile<Arch, T, M, NV, true, true, MR, -1, true>(kc, Ap, MR, Bp, ldb, C, ldc, alpha, beta,
                                                      static_cast<const char*>(pf), pf_lines);
}

template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel_b_in_place(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C,
                             std::int64_t ldc, T alpha, T beta) {
  gemm_tile<Arch, T, M, NV, true, false, MR>(kc, Ap, MR, Bp, ldb, C, ldc, alpha, beta);
}

// M rows by NV vectors of a packed B panel NVP vectors wide.
template <class Arch, class T, int M, int NV, int NVP>
void gemm_ukernel_direct_a(std::int64_t kc, const T* A, std::int64_t lda, const T* Bp, std::int64_t ldb,
                           T* C, std::int64_t ldc, T alpha, T beta) {
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  gemm_tile<Arch, T, M, NV, false, true, M, NVP * W>(kc, A, lda, Bp, ldb, C, ldc, alpha, beta);
}

template <class Arch, class T, int M, int NV, int NVP>
void gemm_ukernel_direct_a_pf(std::int64_t kc, const T* A, std::int64_t lda, const T* Bp, std::int64_t ldb,
                              T* C, std::int64_t ldc, T alpha, T beta, const void* pf, std::int64_t pf_lines) {
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  gemm_tile<Arch, T, M, NV, false, true, M, NVP * W, true>(kc, A, lda, Bp, ldb, C, ldc, alpha, beta,
                                                           static_cast<const char*>(pf), pf_lines);
}

// Tables indexed by the number of rows m = 1..MR (entry 0 unused).
template <class Arch, class T, int NV, int MR, int... Ms>
constexpr std::array<GemmUkernelPf<T>, kMaxMr + 1> packed_pf_kernels(std::integer_sequence<int, Ms...>) {
  std::array<GemmUkernelPf<T>, kMaxMr + 1> t{};
  ((t[Ms + 1] = &gemm_ukernel_pf<Arch, T, Ms + 1, NV, MR>), ...);
  return t;
}

template <class Arch, class T, int NV, int MR, bool kPackedB, int... Ms>
constexpr std::array<GemmUkernel<T>, kMaxMr + 1> packed_row_kernels(std::integer_sequence<int, Ms...>) {
  std::array<GemmUkernel<T>, kMaxMr + 1> t{};
  if constexpr (kPackedB) ((t[Ms + 1] = &gemm_ukernel<Arch, T, Ms + 1, NV, MR>), ...);
  else ((t[Ms + 1] = &gemm_ukernel_b_in_place<Arch, T, Ms + 1, NV, MR>), ...);
  return t;
}
template <class Arch, class T, int NV, int NVP, bool kPf, int... Ms>
constexpr auto direct_row_kernels(std::integer_sequence<int, Ms...>) {
  using K = std::conditional_t<kPf, GemmUkernelDirectAPf<T>, GemmUkernelDirectA<T>>;
  std::array<K, kMaxMr + 1> t{};
  if constexpr (kPf) ((t[Ms + 1] = &gemm_ukernel_direct_a_pf<Arch, T, Ms + 1, NV, NVP>), ...);
  else ((t[Ms + 1] = &gemm_ukernel_direct_a<Arch, T, Ms + 1, NV, NVP>), ...);
  return t;
}
template <class Arch, class T, int MR, int NVP, bool kPf, int... Vs>
constexpr auto direct_kernels(std::integer_sequence<int, Vs...>) {
  using K = std::conditional_t<kPf, GemmUkernelDirectAPf<T>, GemmUkernelDirectA<T>>;
  std::array<std::array<K, kMaxMr + 1>, kMaxNv + 1> t{};
  ((t[Vs + 1] = direct_row_kernels<Arch, T, Vs + 1, NVP, kPf>(std::make_integer_sequence<int, MR>{})), ...);
  // One-vector tiles go up to 2 MR rows: MR of them leave the FMA pipes waiting on too few
  // accumulator chains (sdcross's 13-key tail panel: 9.7% of its time on 17% of its scores).
  static_assert(2 * MR <= kMaxMr);
  t[1] = direct_row_kernels<Arch, T, 1, NVP, kPf>(std::make_integer_sequence<int, 2 * MR>{});
  return t;
}

// ---------------------------------------------------------------------------------------------
// Matrix-vector products (M = 1: decode). Both stream B exactly once.

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
      const B xv(x[p]);
      a0 = xsimd::fma(xv, B::load_unaligned(row), a0);
      a1 = xsimd::fma(xv, B::load_unaligned(row + W), a1);
      a2 = xsimd::fma(xv, B::load_unaligned(row + 2 * W), a2);
      a3 = xsimd::fma(xv, B::load_unaligned(row + 3 * W), a3);
    }
    const B va(alpha);
    B* acc[4] = {&a0, &a1, &a2, &a3};
    for (int q = 0; q < 4; ++q) {
      T* yq = y + j + q * W;
      const B r = *acc[q] * va;
      (beta == T(0) ? r : xsimd::fma(B::load_unaligned(yq), B(beta), r)).store_unaligned(yq);
    }
  }
  // Narrower rests (and the panels of a pre-packed B, two vectors wide on AVX-512 f32): the k
  // loop split into even and odd rows, so that four FMA chains are in flight, not one or two
  // (a chain's 4-cycle latency had halved a packed decode step's speed).
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
    (beta == T(0) ? r0 : xsimd::fma(B::load_unaligned(y + j), B(beta), r0)).store_unaligned(y + j);
    (beta == T(0) ? r1 : xsimd::fma(B::load_unaligned(y + j + W), B(beta), r1)).store_unaligned(y + j + W);
  }
  for (; j + W <= n; j += W) {
    B a[4] = {B(T(0)), B(T(0)), B(T(0)), B(T(0))};
    const T* row = Bm + j;
    std::int64_t p = 0;
    for (; p + 4 <= k; p += 4, row += 4 * ldb)
      for (int q = 0; q < 4; ++q) a[q] = xsimd::fma(B(x[p + q]), B::load_unaligned(row + q * ldb), a[q]);
    for (; p < k; ++p, row += ldb) a[0] = xsimd::fma(B(x[p]), B::load_unaligned(row), a[0]);
    const B r = ((a[0] + a[1]) + (a[2] + a[3])) * B(alpha);
    (beta == T(0) ? r : xsimd::fma(B::load_unaligned(y + j), B(beta), r)).store_unaligned(y + j);
  }
  for (; j < n; ++j) {
    T s = T(0);
    for (std::int64_t p = 0; p < k; ++p) s += x[p] * Bm[p * ldb + j];
    y[j] = beta == T(0) ? alpha * s : alpha * s + beta * y[j];
  }
}

template <class Arch, class T>
void gemv_t(std::int64_t n, std::int64_t k, T alpha, const T* x, const T* Bm, std::int64_t ldb, T beta,
            T* y) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  auto finish = [&](std::int64_t j, T s) { y[j] = beta == T(0) ? alpha * s : alpha * s + beta * y[j]; };
  std::int64_t j = 0;
  for (; j + 4 <= n; j += 4) {  // four rows of B at once: four independent dot products
    const T* r0 = Bm + j * ldb;
    const T* r1 = r0 + ldb;
    const T* r2 = r1 + ldb;
    const T* r3 = r2 + ldb;
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

// ---------------------------------------------------------------------------------------------
// FMA throughput probe: 16 independent chains (2 FMA pipes x 4-cycle latency need 8; 16 leave
// no doubt), each a = a * m + c, which stays finite for |m| < 1.
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

template <class Arch>
ProbeKernels make_probe_kernels() {
  return {&fma_chains<Arch>, 2 * kFmaChains * static_cast<int>(batch<float, Arch>::size)};
}

// ---------------------------------------------------------------------------------------------
// The online-softmax step over a block of rows (see VectorKernels::softmax_rows). Rows go in
// fours (then a pair, then one), their max and exp passes interleaved: four independent
// dependency chains per loop, and four rows' horizontal max and sum in flight at once (fours
// against pairs, same-process harness, best of 20: bert t1 0.420 -> 0.413 ms, t2 0.214 ->
// 0.210 ms, vit t1 0.984 -> 0.972 ms).

// How far (in the exponent) a block's max may exceed the row's reference max before the
// reference moves: below it the weights are exp(s - m) <= e^8 and the row's accumulated output
// needs no rescale (most later blocks of a long row).
inline constexpr double kSoftmaxSlack = 8.0;

template <class Arch, class T, int R>
inline void softmax_row_group(T* x, std::int64_t ld, std::int64_t n, T scale, T* m, T* l, T* alpha) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const B s(scale);
  const std::int64_t nf = n / W * W, tail = n - nf;
  // The block max of x * scale. For scale > 0 it is (max x) * scale exactly (rounding is
  // monotonic), one operation per vector fewer.
  const bool positive = scale > T(0);
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
    const T bm = positive ? hmax<Arch, T>(mx[q]) * scale : hmax<Arch, T>(mx[q]), mo = m[q];
    // a NaN max does not raise it; within the slack of a finite reference, the reference stays
    const T mn = bm > mo && !(mo != neg_inf && bm <= mo + T(kSoftmaxSlack)) ? bm : mo;
    T a = T(1);
    if (mn != mo && mo != neg_inf) {
      a = std::exp(mo - mn);
      l[q] *= a;
    } else if (mo == neg_inf && mn != neg_inf) {
      a = T(-1);
    }
    alpha[q] = a;
    m[q] = mn;
    ref[q] = B(mn == neg_inf ? T(0) : mn);  // a row with no visible key: exp(-inf - 0) = 0
    sum[q] = B(T(0));
  }
  for (std::int64_t i = 0; i < nf; i += W)
    for (int q = 0; q < R; ++q) {
      const B p = exp_batch<Arch, T, true, true>(B::load_unaligned(x + q * ld + i) * s - ref[q]);
      p.store_unaligned(x + q * ld + i);
      sum[q] += p;
    }
  if (tail > 0)
    for (int q = 0; q < R; ++q) {
      // -inf in the missing lanes: exp gives 0 there, nothing reaches the sum
      const B v = blend_tail<Arch, T>(load_tail<Arch, T>(x + q * ld + nf, tail, T(0)) * s - ref[q], tail,
                                      neg_inf);
      const B p = exp_batch<Arch, T, true, true>(v);
      store_tail<Arch, T>(x + q * ld + nf, tail, p);
      sum[q] += p;
    }
  for (int q = 0; q < R; ++q) l[q] += xsimd::hadd(sum[q]);
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

// Softmax down CV vectors of columns of a block (see VectorKernels::softmax_cols). The max pass
// keeps two accumulators per column vector (even and odd rows): 2 CV independent chains.
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

template <class Arch, class T>
void softmax_cols(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, T* l) {
  constexpr std::int64_t W = batch<T, Arch>::size;
  std::int64_t c = 0;
  for (; c + 4 * W <= n; c += 4 * W) softmax_col_group<Arch, T, 4>(x + c, ld, rows, scale, l + c);
  if (n - c == 3 * W) softmax_col_group<Arch, T, 3>(x + c, ld, rows, scale, l + c);
  else if (n - c == 2 * W) softmax_col_group<Arch, T, 2>(x + c, ld, rows, scale, l + c);
  else if (n - c == W) softmax_col_group<Arch, T, 1>(x + c, ld, rows, scale, l + c);
}

template <class Arch, class T>
void softmax_rows(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, const std::int64_t* lo,
                  const std::int64_t* hi, T* m, T* l, T* alpha) {
  if (lo != nullptr) {  // one visible interval per row: the step on it, zeros around it
    for (std::int64_t r = 0; r < rows; ++r) {
      T* row = x + r * ld;
      const std::int64_t a = std::min(lo[r], n), z = std::max(a, std::min(hi[r], n));
      softmax_row_group<Arch, T, 1>(row + a, ld, z - a, scale, m + r, l + r, alpha + r);
      for (std::int64_t j = 0; j < a; ++j) row[j] = T(0);
      for (std::int64_t j = z; j < n; ++j) row[j] = T(0);
    }
    return;
  }
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4) softmax_row_group<Arch, T, 4>(x + r * ld, ld, n, scale, m + r, l + r, alpha + r);
  if (r + 2 <= rows) {
    softmax_row_group<Arch, T, 2>(x + r * ld, ld, n, scale, m + r, l + r, alpha + r);
    r += 2;
  }
  if (r < rows) softmax_row_group<Arch, T, 1>(x + r * ld, ld, n, scale, m + r, l + r, alpha + r);
}

// ---------------------------------------------------------------------------------------------

template <class Arch, class T>
VectorKernels<T> make_vector_kernels() {
  return {&exp_array<Arch, T>, &max_array<Arch, T>, &sum_array<Arch, T>, &scale_add_max<Arch, T>,
          &exp_sub_max_sum<Arch, T>, &scale_array<Arch, T>, &scale_to_array<Arch, T>,
          &pack_transpose<Arch, T>, &elu1_array<Arch, T>, &relu_array<Arch, T>, &softmax_rows<Arch, T>,
          &normalize_rows<Arch, T>, &softmax_cols<Arch, T>, &normalize_cols<Arch, T>};
}

// Packed tile MR x NV vectors; in-place-A tile DMR x DNV vectors.
template <class Arch, class T, int MR, int NV, int DMR, int DNV>
GemmKernels<T> make_gemm_kernels(int mc, int kc, int nc, int direct_kc, int kc_b_in_place) {
  static_assert(MR <= kMaxMr && DMR <= kMaxMr && DNV <= kMaxNv);
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  return {GemmBlocking{MR, NV * W, W, mc, kc, nc, kc_b_in_place},
          packed_row_kernels<Arch, T, NV, MR, true>(std::make_integer_sequence<int, MR>{}),
          packed_row_kernels<Arch, T, NV, MR, false>(std::make_integer_sequence<int, MR>{}),
          packed_pf_kernels<Arch, T, NV, MR>(std::make_integer_sequence<int, MR>{}),
          GemmBlocking{DMR, DNV * W, W, DMR, direct_kc, nc, direct_kc},
          direct_kernels<Arch, T, DMR, DNV, false>(std::make_integer_sequence<int, DNV>{}),
          direct_kernels<Arch, T, DMR, DNV, true>(std::make_integer_sequence<int, DNV>{}),
          &gemv_n<Arch, T>, &gemv_t<Arch, T>};
}

}  // namespace simdattn::simd::impl
