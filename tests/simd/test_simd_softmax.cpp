// The SIMD layer's softmax kernels on every ISA this CPU supports, against scalar twins in long
// double: max and sum, the fused passes, the online-softmax step over a block of rows (with and
// without visible intervals), the weights' error bound, the column form and the normalisation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn::simd;
using simdattn::test::kernel_tables;
using simdattn::test::expected_l;
using simdattn::test::expected_max_alpha;
using simdattn::test::ulp_error;

namespace {

// f32 softmax weights come from a cheaper exp than VectorKernels::exp (one-FMA range reduction,
// degree-5 polynomial; f64 keeps the exact one): within 3 + |arg| / 16 ulp of exp(arg) (measured: 2.2 ulp near 0,
// 4.8 at -87). Where the kernel rounds the argument itself (x * scale - max, one rounding) and
// the test does not, that rounding adds up to 3 ulp more (the exact exp's tests allow 3 in all).
double weight_ulp_bound(long double arg) { return 3.0 + static_cast<double>(std::fabs(arg)) / 16.0; }
double rounded_weight_ulp_bound(long double arg) { return weight_ulp_bound(arg) + 3.0; }

}  // namespace

TEST_CASE("max, sum and the fused softmax passes against scalar twins, all lengths") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 31);
  std::normal_distribution<double> nd(0.0, 3.0);
  for (const KernelTable* kt : kernel_tables()) {
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
      vk.softmax_rows(x.data(), ld, rows, n, scale, T(0), nullptr, nullptr, m.data(), l.data(), alpha.data());
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
    vk.softmax_rows(x.data(), ld, rows, n, scale, T(0), lo.data(), hi.data(), m.data(), l.data(), alpha.data());
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

// The step with a soft cap (cap > 0): the scores cap * tanh(x * scale / cap) in long double; the
// kernel's reference max within a few ulp of their max (its own tanh), each weight within its
// bound of exp(s - m) for the kernel's m plus what tanh's rounding moves s by (8 ulp of cap),
// l and alpha to match; with and without visible intervals, -inf scores capped to -cap (a
// visible key, weight exp(-cap - m)), an empty interval leaving the row untouched (a first
// block's too: its max stays -inf).
template <class T>
void check_softmax_rows_capped(const VectorKernels<T>& vk, std::mt19937_64& rng) {
  const T inf = std::numeric_limits<T>::infinity(), eps = std::numeric_limits<T>::epsilon();
  std::normal_distribution<double> nd(0.0, 6.0);
  for (std::int64_t n : {1, 7, 16, 17, 77, 128}) {
    for (T cap : {T(0.5), T(5), T(50)}) {
      for (T scale : {T(0.125), T(-0.5), T(1)}) {
        for (bool intervals : {false, true}) {
          CAPTURE(n);
          CAPTURE(cap);
          CAPTURE(scale);
          CAPTURE(intervals);
          // rows: prior -inf; within the slack below; above; far below; raw -inf scores; with
          // intervals, row 5's is empty
          const std::int64_t rows = 6, ld = n + 2;
          std::vector<T> x(static_cast<std::size_t>(rows * ld), T(99));
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < n; ++j) x[r * ld + j] = static_cast<T>(nd(rng));
          for (std::int64_t j = 0; j < n; ++j) x[4 * ld + j] = -inf / scale;
          std::vector<std::int64_t> lo(rows, 0), hi(rows, n);
          if (intervals) lo[1] = n / 3, hi[2] = n / 2 + 1, lo[5] = hi[5] = n / 2;
          const std::vector<T> x0 = x;
          auto capped = [&](std::int64_t r, std::int64_t j) {
            return static_cast<long double>(cap) * std::tanh(static_cast<long double>(x0[r * ld + j]) * scale / cap);
          };
          std::vector<long double> bmax(rows, -INFINITY);
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = lo[r]; j < hi[r]; ++j) bmax[r] = std::max(bmax[r], capped(r, j));
          std::vector<T> m{-inf, static_cast<T>(bmax[1]) - T(3), static_cast<T>(bmax[2]) + T(2),
                           static_cast<T>(bmax[3]) - T(20), -inf, intervals ? -inf : T(1)};
          std::vector<T> l{T(0), T(2), T(4), T(5), T(0), intervals ? T(0) : T(3)}, alpha(rows, T(7));
          const std::vector<T> m0 = m, l0 = l;
          vk.softmax_rows(x.data(), ld, rows, n, scale, cap, intervals ? lo.data() : nullptr,
                          intervals ? hi.data() : nullptr, m.data(), l.data(), alpha.data());
          const long double ds = 8.0L * eps * cap;  // how far tanh's rounding may move a score
          for (std::int64_t r = 0; r < rows; ++r) {
            CAPTURE(r);
            for (std::int64_t j = n; j < ld; ++j) CHECK(x[r * ld + j] == T(99));
            if (lo[r] >= hi[r]) {  // no key: the state unchanged, zeros
              CHECK(m[r] == m0[r]);
              CHECK(l[r] == l0[r]);
              CHECK(alpha[r] == T(1));
              for (std::int64_t j = 0; j < n; ++j) CHECK(x[r * ld + j] == T(0));
              continue;
            }
            const bool moves = m0[r] == -inf || bmax[r] > m0[r] + 8 + ds;
            if (moves) CHECK(std::fabs(m[r] - bmax[r]) <= ds + 4.0L * eps * std::fabs(bmax[r]));
            else CHECK(m[r] == m0[r]);
            const T want_alpha = m0[r] == -inf ? T(-1) : moves ? std::exp(m0[r] - m[r]) : T(1);
            CHECK(alpha[r] == doctest::Approx(want_alpha).epsilon(8 * eps));
            long double sum = 0;
            for (std::int64_t j = 0; j < n; ++j) {
              if (j < lo[r] || j >= hi[r]) {
                CHECK(x[r * ld + j] == T(0));
                continue;
              }
              const long double arg = capped(r, j) - m[r];
              const long double want = std::exp(arg);
              const long double tol = want * (ds + rounded_weight_ulp_bound(arg) * eps);
              if (want >= static_cast<long double>(std::numeric_limits<T>::min()))
                CHECK(std::fabs(x[r * ld + j] - want) <= tol);
              sum += x[r * ld + j];
            }
            const long double l_want = expected_l(l0[r], alpha[r], sum);
            CHECK(std::fabs(static_cast<long double>(l[r]) - l_want) <= 1e-6L * (1 + l_want));
          }
        }
      }
    }
  }
}

TEST_CASE("the online-softmax step over a block of rows on every ISA: max, weights, l, alpha") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 47);
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    check_softmax_rows<float>(kt->vec_f32, rng);
    check_softmax_rows<double>(kt->vec_f64, rng);
    check_softmax_rows_intervals<float>(kt->vec_f32, rng);
    check_softmax_rows_intervals<double>(kt->vec_f64, rng);
    check_softmax_rows_capped<float>(kt->vec_f32, rng);
    check_softmax_rows_capped<double>(kt->vec_f64, rng);
  }
}

TEST_CASE("normalize_rows on every ISA: x / l per row, zero rows where l == 0, nothing past n, rows packed in place") {
  for (const KernelTable* kt : kernel_tables()) {
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
      // in place, rows packed n apart (y = x, ldy = n < ldx)
      std::vector<float> xi = x;
      kt->vec_f32.normalize_rows(xi.data(), ldx, rows, n, l.data(), xi.data(), n);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < n; ++i)
          CHECK(xi[r * n + i] == (l[r] == 0.f ? 0.f : x[r * ldx + i] * (1.f / l[r])));
    }
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
  for (const KernelTable* kt : kernel_tables()) {
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
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    check_softmax_cols(kt->vec_f32);
    check_softmax_cols(kt->vec_f64);
  }
}
