// The SIMD layer's vector kernels on every ISA this CPU supports (so AVX2 and SSE2 builds are
// tested on an AVX-512 machine too), against scalar twins in long double.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "simdattn/simd/kernels.hpp"
#include "test_util.hpp"

using namespace simdattn::simd;

namespace {

std::vector<const KernelTable*> tables() {
  std::vector<const KernelTable*> out;
  for (Isa isa : available_isas()) out.push_back(kernels_for(isa));
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

// f32 softmax weights come from a cheaper exp than VectorKernels::exp (one-FMA range reduction,
// degree-5 polynomial; f64 keeps the exact one): within 3 + |arg| / 16 ulp of exp(arg) (measured: 2.2 ulp near 0,
// 4.8 at -87). Where the kernel rounds the argument itself (x * scale - max, one rounding) and
// the test does not, that rounding adds up to 3 ulp more (the exact exp's tests allow 3 in all).
double weight_ulp_bound(long double arg) { return 3.0 + static_cast<double>(std::fabs(arg)) / 16.0; }
double rounded_weight_ulp_bound(long double arg) { return weight_ulp_bound(arg) + 3.0; }

template <class T>
void check_exp_sweep(const KernelTable& kt, std::vector<T> xs) {
  std::vector<T> y(xs.size());
  kt.vec<T>().exp(xs.data(), y.data(), static_cast<std::int64_t>(xs.size()));
  double worst = 0;
  T worst_x = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double e = ulp_error<T>(y[i], std::exp(static_cast<long double>(xs[i])));
    if (e > worst) worst = e, worst_x = xs[i];
  }
  CAPTURE(isa_name(kt.isa));
  CAPTURE(worst_x);
  CHECK(worst <= 3.0);
}

}  // namespace

TEST_CASE("exp f32: <= 3 ulp over the whole finite range, on every ISA") {
  // Every 61st float bit pattern from -104 (results deep in the denormal range) to 89
  // (overflow), plus dense sweeps around 0 and around the underflow/overflow edges.
  std::vector<float> xs;
  for (std::uint32_t b = 0; b < 0x42B20000u; b += 61) {  // +0 .. 89.0
    float x;
    std::memcpy(&x, &b, 4);
    xs.push_back(x);
  }
  for (std::uint32_t b = 0x80000000u; b < 0xC2D00000u; b += 61) {  // -0 .. -104.0
    float x;
    std::memcpy(&x, &b, 4);
    xs.push_back(x);
  }
  for (float x = -103.99f; x < -86.f; x += 0.0013f) xs.push_back(x);
  for (float x = 87.f; x < 88.8f; x += 0.0001f) xs.push_back(x);
  for (const KernelTable* kt : tables()) check_exp_sweep<float>(*kt, xs);
}

TEST_CASE("exp f64: <= 3 ulp over the whole finite range, on every ISA") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 30);
  std::vector<double> xs;
  std::uniform_real_distribution<double> wide(-746.0, 710.0), narrow(-1.0, 1.0), sub(-745.2, -707.0);
  for (int i = 0; i < 200000; ++i) xs.push_back(wide(rng));
  for (int i = 0; i < 50000; ++i) xs.push_back(narrow(rng));
  for (int i = 0; i < 50000; ++i) xs.push_back(sub(rng));
  for (const KernelTable* kt : tables()) check_exp_sweep<double>(*kt, xs);
}

TEST_CASE("exp special values: -inf, +inf, NaN, overflow, underflow, every tail length") {
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (int n = 1; n <= 40; ++n) {  // every tail length around the vector widths
      std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
      for (int i = 0; i < n; ++i) x[i] = (i % 5 == 0) ? -inf : (i % 5 == 1) ? inf : (i % 5 == 2) ? nan : (i % 5 == 3) ? 200.f : -200.f;
      kt->vec_f32.exp(x.data(), y.data(), n);
      for (int i = 0; i < n; ++i) {
        if (i % 5 == 0) CHECK(y[i] == 0.f);
        if (i % 5 == 1) CHECK(y[i] == inf);
        if (i % 5 == 2) CHECK(std::isnan(y[i]));
        if (i % 5 == 3) CHECK(y[i] == inf);
        if (i % 5 == 4) CHECK(y[i] == 0.f);
      }
    }
    const double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> d{-dinf, dinf, std::nan(""), 800.0, -800.0, 0.0, 1.0}, dy(d.size());
    kt->vec_f64.exp(d.data(), dy.data(), 7);
    CHECK(dy[0] == 0.0);
    CHECK(dy[1] == dinf);
    CHECK(std::isnan(dy[2]));
    CHECK(dy[3] == dinf);
    CHECK(dy[4] == 0.0);
    CHECK(dy[5] == 1.0);
    CHECK(dy[6] == doctest::Approx(std::exp(1.0)).epsilon(1e-15));
  }
}

TEST_CASE("max, sum and the fused softmax passes against scalar twins, all lengths") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 31);
  std::normal_distribution<double> nd(0.0, 3.0);
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    for (int n : {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1000}) {
      CAPTURE(n);
      std::vector<float> x(static_cast<std::size_t>(n)), add(x.size());
      for (auto& v : x) v = static_cast<float>(nd(rng));
      for (auto& v : add) v = static_cast<float>(nd(rng));
      long double mx = -INFINITY, sm = 0;
      for (float v : x) mx = std::max<long double>(mx, v), sm += v;
      CHECK(kt->vec_f32.max(x.data(), n) == static_cast<float>(mx));
      CHECK(std::fabs(kt->vec_f32.sum(x.data(), n) - sm) <= 1e-5 * (1 + n));

      // pass 1: x = x * scale + add, returns the max
      std::vector<float> p = x;
      const float m = kt->vec_f32.scale_add_max(p.data(), n, 0.37f, add.data());
      float m_ref = -INFINITY;
      for (int i = 0; i < n; ++i) {
        const float want = x[i] * 0.37f + add[i];
        CHECK(p[i] == doctest::Approx(want).epsilon(1e-6));
        m_ref = std::max(m_ref, p[i]);
      }
      CHECK(m == m_ref);
      // pass 2: p = exp(p - m), returns the sum
      std::vector<float> e = p;
      const float s = kt->vec_f32.exp_sub_max_sum(e.data(), n, m);
      long double s_ref = 0;
      for (int i = 0; i < n; ++i) {
        const long double want = std::exp(static_cast<long double>(p[i] - m));  // the float difference
        CHECK(ulp_error<float>(e[i], want) <= rounded_weight_ulp_bound(p[i] - m));
        s_ref += e[i];
      }
      CHECK(std::fabs(s - s_ref) <= 1e-6 * (1 + s_ref));
    }
    // a fully masked row: max -inf, every entry -inf -> zeros and sum 0, no NaN
    std::vector<double> row(19, -INFINITY);
    CHECK(kt->vec_f64.max(row.data(), 19) == -INFINITY);
    CHECK(kt->vec_f64.exp_sub_max_sum(row.data(), 19, -INFINITY) == 0.0);
    for (double v : row) CHECK(v == 0.0);
  }
}

// What one online-softmax step should leave, from the block's max bm and the prior reference m0:
// the reference max (it moves when bm passes m0 by more than 8, or m0 is -inf) and alpha.
template <class T>
std::pair<T, T> expected_max_alpha(T bm, T m0) {
  const T inf = std::numeric_limits<T>::infinity();
  const T mn = bm > m0 && (m0 == -inf || bm > m0 + T(8)) ? bm : m0;
  const T alpha = (mn != m0 && m0 != -inf) ? std::exp(m0 - mn) : (m0 == -inf && mn != -inf) ? T(-1) : T(1);
  return {mn, alpha};
}

// l after the step: the prior l rescaled when the max moved from a finite value, plus the weights.
template <class T>
long double expected_l(T l0, T alpha, long double sum) {
  return static_cast<long double>(alpha > T(0) && alpha != T(1) ? l0 * alpha : l0) + sum;
}

// One online-softmax step (VectorKernels::softmax_rows) against a scalar twin: the row max of
// the scaled scores (exactly), the weights within 3 ulp of exp(s - m_new) (s rounded as the
// kernel computes it), l and alpha for every kind of prior state.
template <class T>
void check_softmax_rows(const VectorKernels<T>& vk, std::mt19937_64& rng) {
  const T inf = std::numeric_limits<T>::infinity();
  std::normal_distribution<double> nd(0.0, 4.0);
  for (std::int64_t n : {1, 2, 7, 8, 15, 16, 17, 40, 77, 128}) {
    for (T scale : {T(0.125), T(-0.5), T(1)}) {
      CAPTURE(n);
      CAPTURE(scale);
      // rows: prior max -inf (first block), below, equal to and above this block's max;
      // a fully masked row; a row with a NaN score
      const std::int64_t rows = 7, ld = n + 3;
      std::vector<T> x(static_cast<std::size_t>(rows * ld), T(99));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < n; ++j) x[r * ld + j] = static_cast<T>(nd(rng));
      for (std::int64_t j = 0; j < n; ++j) x[5 * ld + j] = -inf / scale;  // every s is -inf
      x[6 * ld + n / 2] = std::numeric_limits<T>::quiet_NaN();
      std::vector<T> bmax(rows, -inf);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < n; ++j) {
          const T sv = x[r * ld + j] * scale;
          if (sv > bmax[r]) bmax[r] = sv;
        }
      // prior max: -inf (first block), within the slack below this block's max, equal, above, far
      // below (beyond the slack), a fully masked row, a NaN row
      std::vector<T> m{-inf, bmax[1] - T(3), bmax[2], bmax[3] + T(2), bmax[4] - T(20), -inf, T(-1)};
      std::vector<T> l{T(0), T(2), T(3), T(4), T(5), T(0), T(1)}, alpha(rows, T(7));
      const std::vector<T> x0 = x, m0 = m, l0 = l;
      vk.softmax_rows(x.data(), ld, rows, n, scale, nullptr, nullptr, m.data(), l.data(), alpha.data());
      for (std::int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        for (std::int64_t j = n; j < ld; ++j) CHECK(x[r * ld + j] == T(99));  // nothing past n written
        if (r == 6) {  // a NaN score: its weight and l are NaN (the max it leaves is unspecified)
          CHECK(std::isnan(x[r * ld + n / 2]));
          CHECK(std::isnan(l[r]));
          continue;
        }
        const auto [mn, want_alpha] = expected_max_alpha(bmax[r], m0[r]);
        CHECK(m[r] == mn);
        CHECK(alpha[r] == want_alpha);
        long double sum = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          const T sv = x0[r * ld + j] * scale;
          const long double want = mn == -inf ? 0.0L : std::exp(static_cast<long double>(sv - mn));
          if (want < static_cast<long double>(std::numeric_limits<T>::min())) CHECK(x[r * ld + j] == T(0));
          else CHECK(ulp_error<T>(x[r * ld + j], want) <= rounded_weight_ulp_bound(sv - mn));
          sum += x[r * ld + j];
        }
        const long double l_want = expected_l(l0[r], want_alpha, sum);
        CHECK(std::fabs(static_cast<long double>(l[r]) - l_want) <= 1e-6L * (1 + l_want));
      }
    }
  }
}

// The same step with one visible interval per row: the keys outside weigh exactly 0, are not
// read (NaN there changes nothing) and take no part in the max.
template <class T>
void check_softmax_rows_intervals(const VectorKernels<T>& vk, std::mt19937_64& rng) {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  std::normal_distribution<double> nd(0.0, 4.0);
  for (std::int64_t n : {1, 16, 17, 40, 128}) {
    CAPTURE(n);
    const std::int64_t rows = 5, ld = n + 1;
    const std::vector<std::int64_t> lo{0, 0, n / 3, n / 2, n}, hi{n, n / 2 + 1, n, n / 2, n};  // row 3, 4: none
    std::vector<T> x(static_cast<std::size_t>(rows * ld));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; ++j)
        x[r * ld + j] = j >= lo[r] && j < hi[r] ? static_cast<T>(nd(rng)) : (j % 2 ? nan : T(1e30));
    std::vector<T> m{-inf, T(1), -inf, T(2), -inf}, l{T(0), T(3), T(0), T(4), T(0)}, alpha(rows, T(7));
    const std::vector<T> x0 = x, m0 = m, l0 = l;
    const T scale = T(0.5);
    vk.softmax_rows(x.data(), ld, rows, n, scale, lo.data(), hi.data(), m.data(), l.data(), alpha.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      T bm = -inf;
      for (std::int64_t j = lo[r]; j < hi[r]; ++j) bm = std::max(bm, x0[r * ld + j] * scale);
      const auto [mn, want_alpha] = expected_max_alpha(bm, m0[r]);
      CHECK(m[r] == mn);
      CHECK(alpha[r] == want_alpha);
      long double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        if (j < lo[r] || j >= hi[r]) {
          CHECK(x[r * ld + j] == T(0));
          continue;
        }
        const long double want = std::exp(static_cast<long double>(x0[r * ld + j] * scale - mn));
        CHECK(ulp_error<T>(x[r * ld + j], want) <= rounded_weight_ulp_bound(x0[r * ld + j] * scale - mn));
        sum += x[r * ld + j];
      }
      const long double l_want = expected_l(l0[r], want_alpha, sum);
      CHECK(std::fabs(static_cast<long double>(l[r]) - l_want) <= 1e-6L * (1 + l_want));
    }
  }
}

TEST_CASE("the online-softmax step over a block of rows on every ISA: max, weights, l, alpha") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 47);
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    check_softmax_rows<float>(kt->vec_f32, rng);
    check_softmax_rows<double>(kt->vec_f64, rng);
    check_softmax_rows_intervals<float>(kt->vec_f32, rng);
    check_softmax_rows_intervals<double>(kt->vec_f64, rng);
  }
}

TEST_CASE("normalize_rows on every ISA: x / l per row, zero rows where l == 0, nothing past n") {
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    for (std::int64_t n : {1, 7, 16, 17, 40, 64, 65}) {
      CAPTURE(n);
      const std::int64_t rows = 5, ldx = n + 2, ldy = n + 3;
      std::vector<float> x(static_cast<std::size_t>(rows * ldx)), y(static_cast<std::size_t>(rows * ldy), -7.f);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * float(i % 37) - 2.f;
      x[static_cast<std::size_t>(2 * ldx)] = std::numeric_limits<float>::quiet_NaN();  // row 2 has l == 0
      const std::vector<float> l{2.f, 0.5f, 0.f, 3.f, 1e-3f};
      kt->vec_f32.normalize_rows(x.data(), ldx, rows, n, l.data(), y.data(), ldy);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t i = 0; i < n; ++i) {
          const float want = l[r] == 0.f ? 0.f : x[r * ldx + i] * (1.f / l[r]);
          CHECK(y[r * ldy + i] == want);
        }
        for (std::int64_t i = n; i < ldy; ++i) CHECK(y[r * ldy + i] == -7.f);
      }
      std::vector<double> xd(x.begin(), x.end()), yd(y.size(), -7.0), ld(l.begin(), l.end());
      kt->vec_f64.normalize_rows(xd.data(), ldx, rows, n, ld.data(), yd.data(), ldy);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < n; ++i)
          CHECK(yd[r * ldy + i] == (ld[r] == 0.0 ? 0.0 : xd[r * ldx + i] * (1.0 / ld[r])));
    }
  }
}

template <class T>
void check_pack_transpose(const VectorKernels<T>& vk) {
  // Panel widths of every GEMM and attention caller: the 12-row A panels, vector multiples, and
  // a width past 16 that is not one.
  for (std::int64_t width : {4, 12, 16, 20, 32, 64})
    for (std::int64_t rows : {std::int64_t{1}, width - 1, width})
      for (std::int64_t cols : {1, 7, 16, 17, 40}) {
        CAPTURE(width);
        CAPTURE(rows);
        CAPTURE(cols);
        if (rows < 1) continue;
        const std::int64_t ld = cols + 3, dst_ld = width + 5;
        std::vector<T> src(static_cast<std::size_t>(rows * ld)), dst(static_cast<std::size_t>(cols * dst_ld), T(-7));
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = T(0.5) * T(i % 41) + T(1);
        vk.pack_transpose(src.data(), ld, rows, cols, dst.data(), dst_ld, width);
        for (std::int64_t c = 0; c < cols; ++c) {
          for (std::int64_t r = 0; r < width; ++r) CHECK(dst[c * dst_ld + r] == (r < rows ? src[r * ld + c] : T(0)));
          for (std::int64_t r = width; r < dst_ld; ++r) CHECK(dst[c * dst_ld + r] == T(-7));  // nothing past width
        }
      }
}

TEST_CASE("pack_transpose on every ISA: any panel width, zeros past the rows, nothing past the width") {
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    check_pack_transpose(kt->vec_f32);
    check_pack_transpose(kt->vec_f64);
  }
}

// How far exp_sub_max_sum's weights of x in [lo, hi] (step apart, max 0) exceed their bound,
// in ulp (<= 0: within it); weights below the smallest normal must be exactly 0.
template <class T>
double weight_bound_excess(const VectorKernels<T>& vk, T lo, T hi, T step) {
  std::vector<T> x;
  for (T v = lo; v <= hi; v += step) x.push_back(v);
  std::vector<T> w = x;
  vk.exp_sub_max_sum(w.data(), static_cast<std::int64_t>(w.size()), T(0));
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double want = std::exp(static_cast<long double>(x[i]));
    if (want < static_cast<long double>(std::numeric_limits<T>::min())) {
      CHECK(w[i] == T(0));
      continue;
    }
    worst = std::max(worst, ulp_error<T>(w[i], want) - weight_ulp_bound(x[i]));
  }
  return worst;
}

TEST_CASE("softmax weights: within 3 + |x| / 16 ulp from the flush threshold to +8, on every ISA") {
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    // The weights' whole range: below the smallest normal's log they are flushed to 0; the
    // online softmax's reference max lags a row's max by at most 8, so arguments reach +8.
    CHECK(weight_bound_excess<float>(kt->vec_f32, -90.f, 8.f, 0.000977f) <= 0.0);
    CHECK(weight_bound_excess<double>(kt->vec_f64, -720.0, 8.0, 0.0071) <= 0.0);
  }
}

template <class T>
void check_softmax_cols(const VectorKernels<T>& vk) {
  const T inf = std::numeric_limits<T>::infinity();
  for (std::int64_t rows : {1, 2, 5, 77})
    for (T scale : {T(0.25), T(-0.5)})
      for (std::int64_t n : {16, 32, 48, 64}) {  // one to four vectors of columns on AVX-512 f32
        CAPTURE(rows);
        CAPTURE(scale);
        CAPTURE(n);
        const std::int64_t ld = 80;  // n and ld: multiples of every ISA's vector width
        std::vector<T> store(static_cast<std::size_t>(rows * ld) + 64 / sizeof(T));
        T* x = store.data();  // 64-byte aligned
        while (reinterpret_cast<std::uintptr_t>(x) % 64 != 0) ++x;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < ld; ++c) x[r * ld + c] = T(0.37) * T((r * 7 + c * 3) % 23) - T(4);
        for (std::int64_t r = 0; r < rows; ++r) x[r * ld + 0] = -inf / scale;  // column 0: every s is -inf
        x[(rows - 1) * ld + 1] = std::numeric_limits<T>::quiet_NaN();      // column 1: a NaN score
        const std::vector<T> x0(x, x + rows * ld);
        std::vector<T> l(static_cast<std::size_t>(n), T(-7));
        vk.softmax_cols(x, ld, rows, n, scale, l.data());
        CHECK(l[0] == T(0));
        for (std::int64_t r = 0; r < rows; ++r) CHECK(x[r * ld + 0] == T(0));
        CHECK(std::isnan(l[1]));
        for (std::int64_t c = 2; c < n; ++c) {
          long double mx = -INFINITY, sum = 0;
          for (std::int64_t r = 0; r < rows; ++r) mx = std::max<long double>(mx, x0[r * ld + c] * scale);
          for (std::int64_t r = 0; r < rows; ++r) sum += std::exp(static_cast<long double>(x0[r * ld + c] * scale) - mx);
          CHECK(std::fabs(l[c] - sum) <= (sizeof(T) == 4 ? 2e-6L : 1e-12L) * sum);
          for (std::int64_t r = 0; r < rows; ++r) {
            const long double want = std::exp(static_cast<long double>(x0[r * ld + c] * scale) - mx);
            if (want < static_cast<long double>(std::numeric_limits<T>::min())) CHECK(x[r * ld + c] == T(0));
            else CHECK(std::fabs(x[r * ld + c] - want) <= (sizeof(T) == 4 ? 2e-6L : 1e-12L) * want);
          }
        }
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = n; c < ld; ++c) CHECK(x[r * ld + c] == x0[r * ld + c]);  // nothing past n
        // normalize_cols: x[r, c] / l[c], zeros where l[c] == 0 (column 0), nothing past n
        const std::vector<T> w(x, x + rows * ld);
        vk.normalize_cols(x, ld, rows, n, l.data());
        for (std::int64_t r = 0; r < rows; ++r) {
          CHECK(x[r * ld + 0] == T(0));
          CHECK(std::isnan(x[r * ld + 1]));
          for (std::int64_t c = 2; c < n; ++c) CHECK(x[r * ld + c] == w[r * ld + c] * (T(1) / l[c]));
          for (std::int64_t c = n; c < ld; ++c) CHECK(x[r * ld + c] == x0[r * ld + c]);
        }
      }
}

TEST_CASE("softmax_cols and normalize_cols on every ISA: weights down each column, l, empty and NaN columns") {
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    check_softmax_cols(kt->vec_f32);
    check_softmax_cols(kt->vec_f64);
  }
}

TEST_CASE("scale and scale_to on every ISA, all lengths") {
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    for (int n : {0, 1, 7, 15, 16, 17, 40, 64, 65}) {
      std::vector<float> x(static_cast<std::size_t>(n) + 1, 0.f), y(x.size(), -1.f);
      for (int i = 0; i < n; ++i) x[i] = 0.5f * float(i) - 3.f;
      kt->vec_f32.scale_to(x.data(), y.data(), n, 3.f);
      for (int i = 0; i < n; ++i) CHECK(y[i] == x[i] * 3.f);
      CHECK(y[n] == -1.f);  // nothing past n is written
      std::vector<double> d(x.begin(), x.end());
      kt->vec_f64.scale(d.data(), n, -2.0);
      for (int i = 0; i < n; ++i) CHECK(d[i] == double(x[i]) * -2.0);
      CHECK(d[n] == 0.0);
    }
  }
}

TEST_CASE("linear attention's feature maps (elu1, relu) on every ISA: values, NaN, infinities, tails" *
          doctest::test_suite(simdattn::test::every_isa)) {
  std::mt19937_64 rng(simdattn::test::base_seed() + 61);
  std::uniform_real_distribution<double> u(-20.0, 20.0);
  for (const KernelTable* kt : tables()) {
    CAPTURE(isa_name(kt->isa));
    for (std::int64_t n : {1, 3, 7, 8, 15, 16, 17, 31, 33, 100}) {
      std::vector<float> x(static_cast<std::size_t>(n)), y(x.size()), z(x.size());
      for (auto& v : x) v = static_cast<float>(u(rng));
      x[0] = std::numeric_limits<float>::quiet_NaN();
      if (n > 1) x[1] = -std::numeric_limits<float>::infinity();
      if (n > 2) x[2] = std::numeric_limits<float>::infinity();
      if (n > 3) x[3] = 0.f;
      kt->vec_f32.elu1(x.data(), y.data(), n);
      kt->vec_f32.relu(x.data(), z.data(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        const float xi = x[static_cast<std::size_t>(i)], e = y[static_cast<std::size_t>(i)], r = z[static_cast<std::size_t>(i)];
        if (std::isnan(xi)) {
          CHECK(std::isnan(e));
          CHECK(std::isnan(r));
          continue;
        }
        const long double want = xi > 0 ? static_cast<long double>(xi) + 1 : std::exp(static_cast<long double>(xi));
        CHECK(ulp_error<float>(e, want) <= 3.0);
        CHECK(r == (xi > 0 ? xi : 0.f));
      }
    }
    std::vector<double> xd{-1.5, 0.0, 2.25, -700.0}, yd(4);
    kt->vec_f64.elu1(xd.data(), yd.data(), 4);
    CHECK(yd[0] == doctest::Approx(std::exp(-1.5)).epsilon(1e-15));
    CHECK(yd[1] == 1.0);
    CHECK(yd[2] == 3.25);
    CHECK(yd[3] == doctest::Approx(std::exp(-700.0)).epsilon(1e-15));
  }
}
