// The gated delta rule's kernels (DeltaKernels) on every ISA this CPU supports, against scalar
// twins: on small integers (every product and sum exact in f32) the results are bit for bit;
// widths with and without a tail of lanes, states read through a row stride, the update in place,
// the finiteness test at every position.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "support/simd_test_util.hpp"

using namespace simdattn::simd;
using simdattn::test::kernel_tables;

TEST_CASE("delta kernels on every ISA: state_dots, state_update (in place too), forward_substitute, all_finite (f32, bf16, f16), tails and strides") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-4, 4);
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    const DeltaKernels& d = kt->delta;
    for (std::int64_t rows : {1, 3, 16}) {
      for (std::int64_t cols : {1, 7, 16, 17, 64, 65, 128, 130}) {
        CAPTURE(rows);
        CAPTURE(cols);
        const std::int64_t ld = cols + 3;
        std::vector<float> S(static_cast<std::size_t>(rows * ld)), k(static_cast<std::size_t>(rows)), q(k.size());
        std::vector<float> u(static_cast<std::size_t>(cols));
        for (float& x : S) x = float(small(rng));
        for (float& x : k) x = float(small(rng));
        for (float& x : q) x = float(small(rng));
        for (float& x : u) x = float(small(rng));
        std::vector<float> sk(static_cast<std::size_t>(cols) + 1, -7.f), sq(sk.size(), -7.f);
        d.state_dots(S.data(), rows, cols, ld, k.data(), q.data(), sk.data(), sq.data());
        for (std::int64_t j = 0; j < cols; ++j) {
          double a = 0, c = 0;
          for (std::int64_t r = 0; r < rows; ++r) a += double(S[r * ld + j]) * k[r], c += double(S[r * ld + j]) * q[r];
          CHECK(sk[j] == float(a));
          CHECK(sq[j] == float(c));
        }
        CHECK(sk[cols] == -7.f);  // nothing past cols
        std::vector<float> dst(S.size(), -9.f), in_place = S;
        d.state_update(S.data(), ld, dst.data(), ld, rows, cols, 0.5f, k.data(), u.data());
        d.state_update(in_place.data(), ld, in_place.data(), ld, rows, cols, 0.5f, k.data(), u.data());
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t j = 0; j < cols; ++j) {
            const float want = float(0.5 * S[r * ld + j] + double(k[r]) * u[j]);
            CHECK(dst[r * ld + j] == want);
            CHECK(in_place[r * ld + j] == want);
          }
          CHECK(dst[r * ld + cols] == -9.f);  // the row stride's gap untouched
        }
        // the forward substitution: rows of S as U, A strictly lower with entries 0, +-1 (small
        // integers stay exact), against the same recurrence in double
        const std::int64_t lda = rows + 2;
        std::vector<float> A(static_cast<std::size_t>(rows * lda), 99.f), U = S;
        std::uniform_int_distribution<int> coef(-1, 1);
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t s = 0; s < i; ++s) A[i * lda + s] = float(coef(rng));
        std::vector<double> want(S.begin(), S.end());
        for (std::int64_t i = 1; i < rows; ++i)
          for (std::int64_t s = 0; s < i; ++s)
            for (std::int64_t j = 0; j < cols; ++j) want[i * ld + j] -= A[i * lda + s] * want[s * ld + j];
        d.forward_substitute(U.data(), ld, rows, cols, A.data(), lda);
        for (std::int64_t i = 0; i < rows; ++i) {
          for (std::int64_t j = 0; j < cols; ++j) CHECK(U[i * ld + j] == float(want[i * ld + j]));
          CHECK(U[i * ld + cols] == S[i * ld + cols]);  // nothing past cols
        }
      }
    }
    for (std::int64_t n : {0, 1, 15, 16, 17, 63, 64, 65, 200}) {
      std::vector<float> x(static_cast<std::size_t>(n), 1e30f);
      CHECK(d.all_finite(x.data(), n));
      for (std::int64_t i = 0; i < n; ++i)
        for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
          x[static_cast<std::size_t>(i)] = bad;
          CHECK_FALSE(d.all_finite(x.data(), n));
          x[static_cast<std::size_t>(i)] = -3.f;
        }
      // bf16 and f16 bits: the largest finite values pass, each Inf and NaN pattern fails
      for (auto [exponent, largest] : {std::pair<std::uint16_t, std::uint16_t>{0x7f80, 0x7f7f}, {0x7c00, 0x7bff}}) {
        std::vector<std::uint16_t> h(static_cast<std::size_t>(n), largest);
        for (std::size_t i = 1; i < h.size(); i += 2) h[i] = static_cast<std::uint16_t>(largest | 0x8000);
        CHECK(d.all_finite16(h.data(), n, exponent));
        for (std::int64_t i = 0; i < n; ++i)
          for (std::uint16_t bad : {exponent, static_cast<std::uint16_t>(exponent | 0x8000), static_cast<std::uint16_t>(exponent | 1),
                                    static_cast<std::uint16_t>(exponent | 0x8040)}) {
            const std::uint16_t keep = h[static_cast<std::size_t>(i)];
            h[static_cast<std::size_t>(i)] = bad;
            CHECK_FALSE(d.all_finite16(h.data(), n, exponent));
            h[static_cast<std::size_t>(i)] = keep;
          }
      }
    }
  }
}

TEST_CASE("delta kernels on every ISA: chunk_weights against VectorKernels::exp, scale_rows, right_sides, tails, strides, nothing past the rows") {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> small(-4, 4);
  std::uniform_real_distribution<float> decay(-0.7f, 0.0f);
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    const DeltaKernels& d = kt->delta;
    for (std::int64_t n : {1, 2, 5, 16, 17, 32, 40}) {
      CAPTURE(n);
      const std::int64_t ld = n + 3;
      std::vector<double> gam(static_cast<std::size_t>(n));
      std::vector<float> beta(gam.size()), gam32(gam.size());
      double acc = n == 17 ? -1e4 : 0.0;  // (17: far from 0, where the differences need the double)
      for (std::int64_t i = 0; i < n; ++i)
        acc += decay(rng), gam[i] = acc, gam32[i] = float(acc), beta[i] = float(small(rng)) / 4.0f;
      std::vector<float> KK(static_cast<std::size_t>(n * ld)), QK(KK.size());
      for (float& x : KK) x = float(small(rng));
      for (float& x : QK) x = float(small(rng));
      const float sentinel = -99.0f;
      std::vector<float> A(KK.size(), sentinel), QKm(KK.size(), sentinel), eg(gam.size() + 1, sentinel), last(eg);
      d.chunk_weights(n, gam.data(), beta.data(), KK.data(), ld, QK.data(), ld, A.data(), ld, QKm.data(), ld, eg.data(), last.data());
      std::vector<float> want_eg(gam.size()), diff(gam.size()), e(gam.size());
      kt->vec_f32.exp(gam32.data(), want_eg.data(), n);
      bool same = true;
      for (std::int64_t i = 0; i < n; ++i) {
        same &= eg[i] == want_eg[i];
        for (std::int64_t s = 0; s < n; ++s) diff[s] = float(gam[i] - gam[s]);
        kt->vec_f32.exp(diff.data(), e.data(), i + 1);
        for (std::int64_t s = 0; s < n; ++s) {
          const std::size_t at = static_cast<std::size_t>(i * ld + s);
          same &= A[at] == (s < i ? (beta[i] * e[s]) * KK[at] : sentinel);
          same &= QKm[at] == (s <= i ? QK[at] * e[s] : 0.0f);
          if (i == n - 1) same &= last[s] == e[s];
        }
        for (std::int64_t s = n; s < ld; ++s) same &= A[i * ld + s] == sentinel && QKm[i * ld + s] == sentinel;
      }
      CHECK(same);
      CHECK(eg[n] == sentinel);
      CHECK(last[n] == sentinel);
      std::vector<float> inplace = QK;  // QKm may be QK
      d.chunk_weights(n, gam.data(), beta.data(), KK.data(), ld, inplace.data(), ld, A.data(), ld, inplace.data(), ld, eg.data(), last.data());
      bool same_inplace = true;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < ld; ++s) {
          const std::size_t at = static_cast<std::size_t>(i * ld + s);
          same_inplace &= inplace[at] == (s < n ? QKm[at] : QK[at]);
        }
      CHECK(same_inplace);
    }
    for (std::int64_t cols : {1, 7, 16, 17, 64, 65}) {
      CAPTURE(cols);
      const std::int64_t rows = 5, ld = cols + 5, width = cols + 2;
      std::vector<float> x(static_cast<std::size_t>(rows * ld)), y(x.size(), -7.f), f(static_cast<std::size_t>(rows)), b(f.size()),
          g(f.size()), ks(x.size());
      for (float& t : x) t = float(small(rng));
      for (float& t : ks) t = float(small(rng));
      for (std::size_t r = 0; r < f.size(); ++r) f[r] = float(small(rng)) / 2, b[r] = float(small(rng)) / 4, g[r] = float(small(rng)) / 2;
      d.scale_rows(x.data(), ld, rows, cols, f.data(), y.data(), ld);
      bool same = true;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < cols; ++j) same &= y[r * ld + j] == x[r * ld + j] * f[r];
        for (std::int64_t j = cols; j < ld; ++j) same &= y[r * ld + j] == -7.f;
      }
      std::vector<float> z = x;
      d.scale_rows(z.data(), ld, rows, cols, f.data(), z.data(), ld);  // in place
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < cols; ++j) same &= z[r * ld + j] == y[r * ld + j];
      std::fill(y.begin(), y.end(), -7.f);
      d.right_sides(rows, cols, width, x.data(), ld, ks.data(), ld, b.data(), g.data(), y.data(), ld);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < cols; ++j)
          same &= y[r * ld + j] == std::fma(-(b[r] * g[r]), ks[r * ld + j], b[r] * x[r * ld + j]);
        for (std::int64_t j = cols; j < width; ++j) same &= y[r * ld + j] == 0.f;
        for (std::int64_t j = width; j < ld; ++j) same &= y[r * ld + j] == -7.f;
      }
      CHECK(same);
    }
  }
}
