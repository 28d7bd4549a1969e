// The SIMD layer's element-wise vector kernels on every ISA this CPU supports (so AVX2 and SSE2
// builds are tested on an AVX-512 machine too), against scalar twins in long double: exp, the
// panel packing, scaling and linear attention's feature maps. The softmax kernels are in
// test_simd_softmax.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn::simd;
using simdattn::test::kernel_tables;
using simdattn::test::ulp_error;

namespace {

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
  for (const KernelTable* kt : kernel_tables()) check_exp_sweep<float>(*kt, xs);
}

TEST_CASE("exp f64: <= 3 ulp over the whole finite range, on every ISA") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 30);
  std::vector<double> xs;
  std::uniform_real_distribution<double> wide(-746.0, 710.0), narrow(-1.0, 1.0), sub(-745.2, -707.0);
  for (int i = 0; i < 200000; ++i) xs.push_back(wide(rng));
  for (int i = 0; i < 50000; ++i) xs.push_back(narrow(rng));
  for (int i = 0; i < 50000; ++i) xs.push_back(sub(rng));
  for (const KernelTable* kt : kernel_tables()) check_exp_sweep<double>(*kt, xs);
}

TEST_CASE("exp special values: -inf, +inf, NaN, overflow, underflow, every tail length") {
  for (const KernelTable* kt : kernel_tables()) {
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
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    check_pack_transpose(kt->vec_f32);
    check_pack_transpose(kt->vec_f64);
  }
}

TEST_CASE("scale and scale_to on every ISA, all lengths") {
  for (const KernelTable* kt : kernel_tables()) {
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
  for (const KernelTable* kt : kernel_tables()) {
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

// The soft cap of scaled scores (VectorKernels::softcap): cap * tanh(x * scale / cap) within
// 8 ulp for f32 and 32 for f64 (7e-15 relative) across the polynomial and exp branches and their
// boundary, tails of every length; +-inf to +-cap, NaN kept.
template <class T>
void check_softcap(const VectorKernels<T>& vk) {
  const T inf = std::numeric_limits<T>::infinity();
  const double bound = sizeof(T) == 4 ? 8.0 : 32.0;
  for (T cap : {T(1), T(30), T(50)})
    for (T scale : {T(1), T(0.125)}) {
      std::vector<T> x;
      for (int i = -4000; i <= 4000; ++i) x.push_back(static_cast<T>(i) * T(0.0021) * cap / scale);  // y in [-8.4, 8.4]
      for (T y : {T(0.125), T(0.03), T(1e-6), T(-1e-30), T(0), T(-0.0), T(20), T(-300)}) x.push_back(y * cap / scale);
      for (std::size_t n = 0; n <= 17; ++n) {  // every tail length
        std::vector<T> got(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
        std::vector<T> add(n, T(0.5));
        const bool with_add = n % 2 == 1;  // odd lengths also add a bias after the cap
        const T mx = vk.softcap_add_max(got.data(), static_cast<std::int64_t>(n), scale, cap, with_add ? add.data() : nullptr);
        T want_max = -inf;
        for (std::size_t i = 0; i < n; ++i) {
          want_max = std::max(want_max, got[i]);
          const long double y = static_cast<long double>(x[i] * (scale / cap));
          const long double capped = static_cast<long double>(cap) * std::tanh(y);
          if (with_add)
            CHECK(std::fabs(static_cast<long double>(got[i]) - (capped + 0.5L)) <=
                  bound * std::numeric_limits<T>::epsilon() * (std::fabs(capped) + 0.5L));
          else
            CHECK(ulp_error<T>(got[i], capped) <= bound);
        }
        if (n > 0) CHECK(mx == want_max);
      }
      std::vector<T> all = x;
      vk.softcap_add_max(all.data(), static_cast<std::int64_t>(all.size()), scale, cap, nullptr);
      double worst = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const long double y = static_cast<long double>(x[i] * (scale / cap));
        worst = std::max(worst, ulp_error<T>(all[i], static_cast<long double>(cap) * std::tanh(y)));
      }
      CAPTURE(cap);
      CAPTURE(scale);
      CHECK(worst <= bound);
      std::vector<T> special{inf, -inf, std::numeric_limits<T>::quiet_NaN(), T(0)};
      vk.softcap_add_max(special.data(), 4, scale, cap, nullptr);
      CHECK(special[0] == cap);
      CHECK(special[1] == -cap);
      CHECK(std::isnan(special[2]));
      CHECK(special[3] == T(0));
    }
}

TEST_CASE("softcap on every ISA: cap * tanh(x * scale / cap) within 8 ulp (f32) and 32 (f64), tails, infinities, NaN") {
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    check_softcap<float>(kt->vec_f32);
    check_softcap<double>(kt->vec_f64);
  }
}
