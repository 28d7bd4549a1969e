// The attention states' merge kernel (StateKernels::merge_rows) on every ISA this CPU supports,
// bit for bit against its scalar definition: fma(wb, b, 0 + wa a) in double, rounded once to f32
// (nearest even), or to odd so that a later rounding to bf16 / f16 is the double's own. Random
// values, weights, widths with and without a tail, infinities, NaN, signed zeros, in place.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "simdattn/half.hpp"
#include "support/simd_test_util.hpp"

using namespace simdattn::simd;
using simdattn::detail::float_bits;
using simdattn::test::kernel_tables;

TEST_CASE("states kernel on every ISA: merge_rows to nearest and to odd, tails, specials, in place, a bf16 / f16 rounding after it is the double's") {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<double> w(0.0, 1.0);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, inf, -inf, nan, 1e-40f, -3e38f, 3e38f, 1.0f};
  for (const KernelTable* kt : kernel_tables()) {
    CAPTURE(isa_name(kt->isa));
    for (std::int64_t len : {1, 3, 4, 7, 8, 9, 16, 17, 64, 128, 131}) {
      CAPTURE(len);
      for (bool odd : {false, true}) {
        CAPTURE(odd);
        std::vector<float> a(static_cast<std::size_t>(len)), b(a.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
          a[i] = i % 5 == 3 ? specials[rng() % 9] : n(rng) * 1e3f;
          b[i] = i % 7 == 2 ? specials[rng() % 9] : n(rng);
        }
        if (len == 4) std::fill(b.begin(), b.end(), -0.0f), std::fill(a.begin(), a.end(), -0.0f);
        const double wa = w(rng), wb = 1.0 - wa;
        std::vector<float> y(a.size() + 1, -5.0f), in_place = b;
        kt->states.merge_rows(a.data(), b.data(), y.data(), len, wa, wb, odd);
        kt->states.merge_rows(a.data(), in_place.data(), in_place.data(), len, wa, wb, odd);
        CHECK(y[static_cast<std::size_t>(len)] == -5.0f);  // nothing past n
        for (std::int64_t i = 0; i < len; ++i) {
          const double x = std::fma(wb, double(b[i]), 0.0 + wa * double(a[i]));
          const float want = odd ? simdattn::detail::round_to_odd(x) : static_cast<float>(x);
          CAPTURE(i);
          CAPTURE(x);
          if (std::isnan(want)) {
            CHECK(std::isnan(y[i]));
            continue;
          }
          CHECK(float_bits(y[i]) == float_bits(want));
          CHECK(float_bits(in_place[i]) == float_bits(want));
          if (odd) {  // the 16-bit roundings of the odd f32 are the double's own
            CHECK(simdattn::to_bfloat16(y[i]).bits == simdattn::to_bfloat16(x).bits);
            CHECK(simdattn::to_float16(y[i]).bits == simdattn::to_float16(x).bits);
          }
        }
      }
    }
  }
}
