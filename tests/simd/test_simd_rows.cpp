// The few-rows products (RowsKernels: dot and weighted, a decode step's grouped heads as one
// matrix) on every ISA this CPU supports, for B of every element type the decode paths read (f32,
// f64, bf16, f16 and the three 8-bit codes): against a scalar twin in double, for every row count
// 1..kMaxProductRows, key and column counts around every block (16 keys, 4 vectors of columns,
// the L1 block of rows), depths around the vector width, padded strides, with and without
// per-row scales, beta 0 (never reading Y) and 1. On small integers (codes' values times a power
// of two) every sum is exact, in any order: the kernels must then agree bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <random>
#include <vector>

#include "core/element.hpp"
#include "simdattn/half.hpp"
#include "simdattn/simd/code8.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

namespace simdattn {
namespace {

// B of one element type: its bytes, the element of a small integer, and its value as the kernels
// read it (before the table's fold).
struct Elements {
  const char* name;
  std::size_t bytes;
};

// The value element e of B holds (codes: decode8's), from its bits.
double value_of(const std::vector<std::uint8_t>& b, std::size_t e, const Elements& el, DType code) {
  if (el.bytes == 1) return detail::code8_value(code, b[e]);
  if (el.bytes == 2) {
    std::uint16_t h;
    std::memcpy(&h, b.data() + e * 2, 2);
    return std::string(el.name) == "bf16" ? double(to_float(bfloat16{h})) : double(to_float(float16{h}));
  }
  if (el.bytes == 4) {
    float f;
    std::memcpy(&f, b.data() + e * 4, 4);
    return f;
  }
  double d;
  std::memcpy(&d, b.data() + e * 8, 8);
  return d;
}

// Fills B (rows x cols, ld elements apart) with small integers of the element type.
void fill(std::vector<std::uint8_t>& b, std::int64_t n, const Elements& el, DType code, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(-4, 4);
  b.assign(static_cast<std::size_t>(n) * el.bytes, 0);
  for (std::int64_t e = 0; e < n; ++e) {
    const double v = pick(rng);
    std::uint8_t* at = b.data() + e * static_cast<std::int64_t>(el.bytes);
    if (el.bytes == 1) {
      // a code whose value is a small integer (int8: itself; fp8: exact up to 4 in both formats)
      const auto y = static_cast<float>(v);
      at[0] = code == DType::int8       ? simd::encode8<simd::Code8::int8>(y)
              : code == DType::fp8_e4m3 ? simd::encode8<simd::Code8::e4m3>(y)
                                        : simd::encode8<simd::Code8::e5m2>(y);
    } else if (el.bytes == 2) {
      const std::uint16_t h = std::string(el.name) == "bf16" ? to_bfloat16(v).bits : to_float16(v).bits;
      std::memcpy(at, &h, 2);
    } else if (el.bytes == 4) {
      const float f = static_cast<float>(v);
      std::memcpy(at, &f, 4);
    } else {
      std::memcpy(at, &v, 8);
    }
  }
}

// Runs one element type's kernels (T: f32 or f64 rows) on every shape, against double.
template <class T>
void check_rows(const simd::RowsKernels<T>& rk, const Elements& el, DType code, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(-3, 3);
  for (int m = 1; m <= simd::kMaxProductRows; ++m)
    for (std::int64_t n : {1, 2, 15, 16, 17, 33, 70}) {
      for (std::int64_t k : {1, 7, 16, 31, 64, 129}) {
        CAPTURE(m); CAPTURE(n); CAPTURE(k);
        const std::int64_t ldx = std::max(n, k) + 2, ldb = std::max(n, k) + 5, lds = n + 3, ldy = n + 1;
        std::vector<T> X(static_cast<std::size_t>(m * ldx));
        for (auto& x : X) x = static_cast<T>(pick(rng));
        std::vector<std::uint8_t> B;
        fill(B, std::max(n, k) * ldb, el, code, rng);
        std::vector<float> scale(static_cast<std::size_t>(2 * std::max(n, k)));
        for (auto& s : scale) s = static_cast<float>(std::ldexp(1.0, pick(rng)));  // powers of two: exact
        for (bool scaled : {false, true}) {
          const float* sc = scaled ? scale.data() : nullptr;
          // dot: S[r, j] = 0.5 * sc[2j] * X[r, :k] . B[j, :k]
          std::vector<T> S(static_cast<std::size_t>(m * lds), T(-7));
          // next: a B that follows (only fetched ahead; a paged cache's next block): the same results
          rk.dot(m, n, k, T(0.5), X.data(), ldx, B.data(), ldb, sc, 2, S.data(), lds, scaled ? B.data() : nullptr);
          for (int r = 0; r < m; ++r)
            for (std::int64_t j = 0; j < n; ++j) {
              double want = 0;
              for (std::int64_t p = 0; p < k; ++p) want += double(X[r * ldx + p]) * value_of(B, j * ldb + p, el, code);
              want *= 0.5 * (scaled ? scale[2 * j] : 1.0);
              CHECK(double(S[r * lds + j]) == want);
            }
          for (int r = 0; r < m; ++r)  // nothing past n
            CHECK(S[r * lds + n] == T(-7));
          // weighted: Y[r, c] = 0.5 * sum_p X[r, p] sc[2p] B[p, c] + beta Y[r, c], beta 0 never reading Y
          for (T beta : {T(0), T(1)}) {
            std::vector<T> Y(static_cast<std::size_t>(m * ldy), beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : T(3));
            rk.weighted(m, n, k, T(0.5), X.data(), ldx, B.data(), ldb, sc, 2, beta, Y.data(), ldy, scaled ? B.data() : nullptr);
            for (int r = 0; r < m; ++r)
              for (std::int64_t c = 0; c < n; ++c) {
                double want = 0;
                for (std::int64_t p = 0; p < k; ++p)
                  want += double(X[r * ldx + p]) * (scaled ? scale[2 * p] : 1.0) * value_of(B, p * ldb + c, el, code);
                want = 0.5 * want + (beta == T(0) ? 0.0 : 3.0);
                CHECK(double(Y[r * ldy + c]) == want);
              }
          }
        }
      }
    }
}

TEST_CASE("few-rows products (dot, weighted) on every ISA, every element type, row count and edge: exact on small integers" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 61);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    CAPTURE(simd::isa_name(kt->isa));
    check_rows(kt->gemm_f32.rows, {"f32", 4}, DType::f32, rng);
    check_rows(kt->gemm_f64.rows, {"f64", 8}, DType::f64, rng);
    check_rows(kt->rows_bf16, {"bf16", 2}, DType::bf16, rng);
    check_rows(kt->rows_f16, {"f16", 2}, DType::f16, rng);
    for (DType code : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2}) {
      CAPTURE(dtype_name(code));
      check_rows(kt->code8(detail::code8_of(code)).rows, {"code", 1}, code, rng);
    }
  }
}

TEST_CASE("few-rows products: a row's scores do not depend on how many keys the call has (its block of keys)" *
          doctest::test_suite(test::every_isa)) {
  // the decode paths compute a causal row over its visible keys, a masked one over all: the
  // scores of the keys both see must be the same bits (torch's is_causal equals its tril mask)
  std::mt19937_64 rng(test::base_seed() + 62);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    CAPTURE(simd::isa_name(kt->isa));
    for (int m = 1; m <= simd::kMaxProductRows; ++m)
      for (std::int64_t k : {16, 33, 128}) {
        std::vector<float> X(static_cast<std::size_t>(m * k)), B(static_cast<std::size_t>(40 * k));
        for (auto& x : X) x = nd(rng);
        for (auto& b : B) b = nd(rng);
        std::vector<float> all(static_cast<std::size_t>(m * 40)), part(all.size());
        kt->gemm_f32.rows.dot(m, 40, k, 1.0f, X.data(), k, B.data(), k, nullptr, 0, all.data(), 40, nullptr);
        for (std::int64_t n : {1, 3, 17, 39}) {
          kt->gemm_f32.rows.dot(m, n, k, 1.0f, X.data(), k, B.data(), k, nullptr, 0, part.data(), 40, nullptr);
          for (int r = 0; r < m; ++r)
            for (std::int64_t j = 0; j < n; ++j) CHECK(part[r * 40 + j] == all[r * 40 + j]);
        }
      }
  }
}

}  // namespace
}  // namespace simdattn
