// The 8-bit K/V formats (simdattn/simd/code8.hpp) and their kernels on every ISA this CPU
// supports: the scalar encode8 against an oracle written from the formats' definitions (the
// nearest of all 256 codes' values, ties to the even code, saturating), decode8 against the OCP
// tables' landmarks, and each ISA's quantize, dequantize and few-rows product kernels bit for bit (quantize,
// dequantize) or against sums in double (the products).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <xmmintrin.h>

#include "simdattn/half.hpp"
#include "simdattn/simd/code8.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

namespace {

using simdattn::simd::Code8;

constexpr Code8 kFormats[] = {Code8::int8, Code8::e4m3, Code8::e5m2};

float decode(Code8 f, std::uint8_t c) {
  switch (f) {
    case Code8::int8: return simdattn::simd::decode8<Code8::int8>(c);
    case Code8::e4m3: return simdattn::simd::decode8<Code8::e4m3>(c);
    default: return simdattn::simd::decode8<Code8::e5m2>(c);
  }
}
std::uint8_t encode(Code8 f, float y) {
  switch (f) {
    case Code8::int8: return simdattn::simd::encode8<Code8::int8>(y);
    case Code8::e4m3: return simdattn::simd::encode8<Code8::e4m3>(y);
    default: return simdattn::simd::encode8<Code8::e5m2>(y);
  }
}

// The oracle: among the finite codes (int8: -127..127), the one nearest y in exact arithmetic
// (double holds every value and every midpoint here); a tie goes to the code whose lowest bit is
// 0 (the even mantissa; int8: the even integer); beyond the largest, the largest. fp8 codes take
// y's sign (at zero too); int8's zero is 0.
std::uint8_t oracle(Code8 f, float y) {
  const double a = std::fabs(double(y));
  if (a >= simdattn::simd::code8_max(f)) {  // beyond the largest (where the distances lose their digits)
    const int c = f == Code8::int8 ? 127 : f == Code8::e4m3 ? 0x7e : 0x7b;
    if (f == Code8::int8) return static_cast<std::uint8_t>(static_cast<std::int8_t>(y < 0 ? -c : c));
    return static_cast<std::uint8_t>(c | (std::signbit(y) ? 0x80 : 0));
  }
  if (f == Code8::int8) {
    int best = 0;
    for (int c = -127; c <= 127; ++c) {
      const double d = std::fabs(double(y) - c), bd = std::fabs(double(y) - best);
      if (d < bd || (d == bd && c % 2 == 0)) best = c;
    }
    return static_cast<std::uint8_t>(static_cast<std::int8_t>(best));
  }
  int best = 0;
  for (int c = 0; c < 0x80; ++c) {
    const float v = decode(f, static_cast<std::uint8_t>(c));
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(a - v), bd = std::fabs(a - decode(f, static_cast<std::uint8_t>(best)));
    if (d < bd || (d == bd && (c & 1) == 0)) best = c;
  }
  return static_cast<std::uint8_t>(best | (std::signbit(y) ? 0x80 : 0));
}

}  // namespace

TEST_CASE("8-bit formats: decode8 at the OCP landmarks, encode8 equals the nearest-code oracle") {
  using simdattn::simd::decode8;
  CHECK(decode8<Code8::e4m3>(0x7e) == 448.0f);
  CHECK(decode8<Code8::e4m3>(0x08) == 0x1p-6f);
  CHECK(decode8<Code8::e4m3>(0x01) == 0x1p-9f);
  CHECK(decode8<Code8::e4m3>(0x38) == 1.0f);
  CHECK(decode8<Code8::e4m3>(0xb8) == -1.0f);
  CHECK(std::isnan(decode8<Code8::e4m3>(0x7f)));
  CHECK(std::isnan(decode8<Code8::e4m3>(0xff)));
  CHECK(decode8<Code8::e4m3>(0x78) == 256.0f);  // exponent 15 is finite in E4M3FN
  CHECK(decode8<Code8::e5m2>(0x7b) == 57344.0f);
  CHECK(decode8<Code8::e5m2>(0x3c) == 1.0f);
  CHECK(decode8<Code8::e5m2>(0x04) == 0x1p-14f);
  CHECK(decode8<Code8::e5m2>(0x01) == 0x1p-16f);
  CHECK(decode8<Code8::e5m2>(0x7c) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(decode8<Code8::e5m2>(0x7d)));
  CHECK(decode8<Code8::int8>(0x81) == -127.0f);
  // every E5M2 code is the top byte of the IEEE f16 of the same value
  for (int c = 0; c < 256; ++c) {
    const float v = decode8<Code8::e5m2>(static_cast<std::uint8_t>(c));
    const float h = simdattn::to_float(simdattn::float16{static_cast<std::uint16_t>(c << 8)});
    CHECK((std::isnan(v) ? std::isnan(h) : v == h));
  }
  std::mt19937_64 rng(simdattn::test::base_seed() + 81);
  for (Code8 f : kFormats) {
    CAPTURE(static_cast<int>(f));
    std::vector<float> ys;
    // every value and every midpoint between neighbouring codes (the ties), and next to them
    for (int c = 0; c < 256; ++c) {
      const float v = decode(f, static_cast<std::uint8_t>(c));
      if (!std::isfinite(v)) continue;
      ys.push_back(v);
      const float w = decode(f, static_cast<std::uint8_t>(f == Code8::int8 ? c + 1 : (c & 0x80) | ((c & 0x7f) + 1)));
      if (std::isfinite(w) && (c & 0x7f) != 0x7f) {
        const float mid = static_cast<float>((double(v) + double(w)) / 2);
        ys.push_back(mid), ys.push_back(std::nextafter(mid, 0.0f)), ys.push_back(std::nextafter(mid, 1e30f));
        ys.push_back(-mid);
      }
    }
    using simdattn::simd::code8_max;
    for (float big : {code8_max(f), std::nextafter(code8_max(f), 1e30f), code8_max(f) * 1.03f, 1e30f, 0.0f, -0.0f})
      ys.push_back(big), ys.push_back(-big);
    std::uniform_real_distribution<float> u(-1.2f, 1.2f);
    for (int i = 0; i < 4000; ++i) ys.push_back(u(rng) * code8_max(f) * std::ldexp(1.0f, -(i % 20)));
    int wrong = 0;
    for (float y : ys) wrong += encode(f, y) != oracle(f, y);
    CHECK(wrong == 0);
  }
}

TEST_CASE("8-bit kernels on every ISA: quantize and dequantize bit for bit, the few-rows products against double" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 82);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    CAPTURE(simd::isa_name(kt->isa));
    for (Code8 f : kFormats) {
      CAPTURE(static_cast<int>(f));
      const simd::Quant8Kernels& q = kt->code8(f);
      for (std::int64_t n : {1, 3, 7, 8, 15, 16, 17, 33, 64, 100, 128}) {
        // rows: normal, a zero row, a row with a subnormal-scale maximum, outliers, exact ties
        const std::int64_t rows = 6, ldx = n + 2, ldc = n + 5;
        std::vector<float> x(static_cast<std::size_t>(rows * ldx));
        for (auto& v : x) v = nd(rng);
        for (std::int64_t i = 0; i < n; ++i) {
          x[ldx + i] = i % 2 ? -0.0f : 0.0f;
          x[2 * ldx + i] *= 1e-40f;
          x[3 * ldx + i] *= i == n / 2 ? 300.0f : 1.0f;
          x[4 * ldx + i] = static_cast<float>(i % 7) - 3.0f;  // max 3: quotients on many ties
        }
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * ldc), 0xaa);
        std::vector<float> scale(static_cast<std::size_t>(rows * 2), -1.0f);
        // the vector kernels under a caller's FTZ/DAZ still compute on IEEE arithmetic
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040u);
        const std::int64_t bad = q.quantize(x.data(), rows, n, ldx, codes.data(), ldc, scale.data(), 2);
        _mm_setcsr(csr);
        CHECK(bad == -1);
        for (std::int64_t r = 0; r < rows; ++r) {
          float mx = 0;
          for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(x[r * ldx + i]));
          const float s = mx / simd::code8_max(f);
          CHECK(scale[r * 2] == s);
          CHECK(scale[r * 2 + 1] == -1.0f);  // only every scale_stride-th written
          int wrong = 0;
          for (std::int64_t i = 0; i < n; ++i)
            wrong += codes[r * ldc + i] != (s == 0.0f ? 0 : oracle(f, x[r * ldx + i] / s));
          CHECK(wrong == 0);
          CHECK(codes[r * ldc + n] == 0xaa);
          std::vector<float> back(static_cast<std::size_t>(n));
          q.dequantize(codes.data() + r * ldc, n, s, back.data());
          for (std::int64_t i = 0; i < n; ++i) {
            const float want = decode(f, codes[r * ldc + i]) * s;
            if (std::memcmp(&want, &back[i], 4) != 0) ++wrong;
          }
          CHECK(wrong == 0);
        }
        // a NaN or an infinity stops the rows there, unwritten
        for (float poison : {NAN, INFINITY, -INFINITY}) {
          std::vector<float> y = x;
          y[2 * ldx + n - 1] = poison;
          std::vector<std::uint8_t> c2(codes.size(), 0xaa);
          std::vector<float> s2(scale.size(), -1.0f);
          CHECK(q.quantize(y.data(), rows, n, ldx, c2.data(), ldc, s2.data(), 2) == 2);
          CHECK(s2[4] == -1.0f);
          CHECK(c2[2 * ldc] == 0xaa);
          CHECK(s2[2] == scale[2]);
        }
      }
      // the few-rows products over random codes (the NaN codes of E4M3/E5M2 left out), scales of
      // stride 3, one row and three
      for (int m : {1, 3})
        for (std::int64_t n : {1, 4, 5, 16, 17, 64, 70}) {
          for (std::int64_t k : {1, 7, 8, 16, 31, 128, 129}) {
            const std::int64_t ldb = std::max(n, k) + 3, rows = std::max(n, k), ldx = rows + 1;
            std::vector<std::uint8_t> Bm(static_cast<std::size_t>(ldb * rows));
            for (auto& b : Bm) {
              do b = static_cast<std::uint8_t>(rng());
              while (!std::isfinite(decode(f, b)) || (f == Code8::int8 && b == 0x80));
            }
            std::vector<float> x(static_cast<std::size_t>(m * ldx)), sc(static_cast<std::size_t>(3 * rows));
            for (auto& v : x) v = nd(rng);
            for (auto& v : sc) v = std::fabs(nd(rng)) / simd::code8_max(f);
            std::vector<float> y1(static_cast<std::size_t>(m * n)), y2(y1.size(), NAN), y3(y1.size(), 0.25f);
            q.rows.dot(m, n, k, 1.5f, x.data(), ldx, Bm.data(), ldb, sc.data(), 3, y1.data(), n, nullptr);
            q.rows.weighted(m, n, k, 1.5f, x.data(), ldx, Bm.data(), ldb, sc.data(), 3, 0.0f, y2.data(), n, nullptr);  // beta 0: y not read
            q.rows.weighted(m, n, k, 1.5f, x.data(), ldx, Bm.data(), ldb, sc.data(), 3, 0.5f, y3.data(), n, nullptr);
            for (int r = 0; r < m; ++r)
              for (std::int64_t j = 0; j < n; ++j) {
                double d = 0, s = 0, md = 0, ms = 0;
                for (std::int64_t p = 0; p < k; ++p) {
                  const double a = double(x[r * ldx + p]) * decode(f, Bm[j * ldb + p]) * sc[j * 3];
                  const double b = double(x[r * ldx + p]) * decode(f, Bm[p * ldb + j]) * sc[p * 3];
                  d += a, s += b, md += std::fabs(a), ms += std::fabs(b);
                }
                CHECK(std::fabs(y1[r * n + j] - 1.5 * d) <= 1e-5 * (1e-30 + 1.5 * md));
                CHECK(std::fabs(y2[r * n + j] - 1.5 * s) <= 1e-5 * (1e-30 + 1.5 * ms));
                CHECK(std::fabs(y3[r * n + j] - (1.5 * s + 0.125)) <= 1e-5 * (1.0 + 1.5 * ms));
              }
          }
        }
    }
  }
}
