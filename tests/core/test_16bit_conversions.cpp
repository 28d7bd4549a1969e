// bfloat16 and float16 (simdattn/half.hpp): exact conversion to f32, round to nearest even from
// f32 and f64 (ties, directly from f64 without double rounding), overflow to Inf, quiet NaN,
// subnormals; checked exhaustively over the 16-bit patterns and against a nearest-value search.
// (The SIMD layer's row conversions against these: simd/test_simd_16bit.cpp.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "simdattn/half.hpp"
#include "support/test_util.hpp"

using simdattn::bfloat16;
using simdattn::float16;

namespace {

template <class H>
H from_bits(std::uint32_t b) {
  return H{static_cast<std::uint16_t>(b)};
}

// The nearest value of format H to d among all finite patterns of d's sign (ties to the even
// pattern), or +-Inf past the largest finite value by at least half its last step: an oracle by
// search, independent of the conversion's bit tricks.
template <class H>
std::uint16_t nearest_by_search(double d, std::uint16_t max_finite) {
  const std::uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  const double a = std::fabs(d);
  // Binary search the last pattern whose value is <= a (values grow with the pattern).
  std::uint32_t lo = 0, hi = max_finite;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (static_cast<double>(simdattn::to_float(from_bits<H>(mid))) <= a) lo = mid;
    else hi = mid - 1;
  }
  const double below = simdattn::to_float(from_bits<H>(lo));
  if (lo == max_finite) {  // beyond: Inf from half a step past the largest finite value
    const double step = below - simdattn::to_float(from_bits<H>(max_finite - 1));
    return static_cast<std::uint16_t>(sign | (a >= below + step / 2 ? max_finite + 1 : max_finite));
  }
  const double above = simdattn::to_float(from_bits<H>(lo + 1));
  std::uint32_t pick = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1))) pick = lo + 1;
  return static_cast<std::uint16_t>(sign | pick);
}

}  // namespace

TEST_CASE("bfloat16 and float16: every pattern converts to f32 and back unchanged, NaN stays NaN") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float fb = simdattn::to_float(from_bits<bfloat16>(b));
    const float fh = simdattn::to_float(from_bits<float16>(b));
    if (std::isnan(fb)) CHECK(std::isnan(simdattn::to_float(simdattn::to_bfloat16(fb))));
    else CHECK(simdattn::to_bfloat16(fb).bits == b);
    if (std::isnan(fh)) CHECK(std::isnan(simdattn::to_float(simdattn::to_float16(fh))));
    else CHECK(simdattn::to_float16(fh).bits == b);
    if (!std::isnan(fh)) CHECK(simdattn::to_float16(static_cast<double>(fh)).bits == b);
  }
  CHECK(simdattn::to_float(float16{0x3c00}) == 1.0f);
  CHECK(simdattn::to_float(float16{0x7bff}) == 65504.0f);
  CHECK(simdattn::to_float(float16{0x0001}) == 0x1p-24f);
  CHECK(simdattn::to_float(bfloat16{0x3f80}) == 1.0f);
  CHECK(simdattn::to_float(float16{0xfc00}) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("bfloat16 and float16 round to nearest even: ties, overflow, subnormals, NaN") {
  // Ties go to the even pattern.
  CHECK(simdattn::to_bfloat16(1.0f + 0x1p-8f).bits == 0x3f80);          // halfway 0x3f80-0x3f81
  CHECK(simdattn::to_bfloat16(1.0f + 3 * 0x1p-8f).bits == 0x3f82);      // halfway 0x3f81-0x3f82
  CHECK(simdattn::to_float16(1.0f + 0x1p-11f).bits == 0x3c00);
  CHECK(simdattn::to_float16(1.0f + 3 * 0x1p-11f).bits == 0x3c02);
  CHECK(simdattn::to_float16(0x1p-25f).bits == 0x0000);                  // half the smallest subnormal
  CHECK(simdattn::to_float16(3 * 0x1p-25f).bits == 0x0002);
  CHECK(simdattn::to_float16(-0x1p-24f).bits == 0x8001);
  // Just above a tie, in f64: rounding through f32 first would land on the tie and go even.
  CHECK(simdattn::to_float16(1.0 + 0x1p-11 + 0x1p-40).bits == 0x3c01);
  CHECK(simdattn::to_bfloat16(1.0 + 0x1p-8 + 0x1p-40).bits == 0x3f81);
  // Beyond the range: Inf.
  CHECK(simdattn::to_float16(65519.0f).bits == 0x7bff);
  CHECK(simdattn::to_float16(65520.0f).bits == 0x7c00);
  CHECK(simdattn::to_float16(-1e6f).bits == 0xfc00);
  CHECK(simdattn::to_float16(1e300).bits == 0x7c00);
  CHECK(simdattn::to_bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(simdattn::to_bfloat16(-1e300).bits == 0xff80);
  CHECK(simdattn::to_bfloat16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
  // NaN: quiet, sign kept.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(simdattn::to_float(simdattn::to_bfloat16(nan))));
  CHECK(std::isnan(simdattn::to_float(simdattn::to_float16(-nan))));
  CHECK((simdattn::to_float16(-nan).bits & 0x8000) != 0);
  CHECK(std::isnan(simdattn::to_float(simdattn::to_bfloat16(std::numeric_limits<double>::signaling_NaN()))));
}

TEST_CASE("bfloat16 and float16 from random f32 and f64 equal the nearest value found by search") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 40);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> exp_h(-27, 17), exp_b(-135, 129);
  for (int i = 0; i < 20000; ++i) {
    const double dh = std::ldexp(mant(rng), exp_h(rng)), db = std::ldexp(mant(rng), exp_b(rng));
    CHECK(simdattn::to_float16(dh).bits == nearest_by_search<float16>(dh, 0x7bff));
    CHECK(simdattn::to_bfloat16(db).bits == nearest_by_search<bfloat16>(db, 0x7f7f));
    const auto fh = static_cast<float>(dh), fb = static_cast<float>(db);
    CHECK(simdattn::to_float16(fh).bits == nearest_by_search<float16>(fh, 0x7bff));
    CHECK(simdattn::to_bfloat16(fb).bits == nearest_by_search<bfloat16>(fb, 0x7f7f));
  }
}
