// The SIMD layer's 16-bit row conversions on every ISA this CPU supports, bf16 and f16 (widen,
// narrow, the widening transpose, narrowing into bf16 pairs, every length to 40) bit for bit against the scalar ones of
// simdattn/half.hpp. (The products over 16-bit rows: test_simd_rows.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "simdattn/half.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

using simdattn::bfloat16;
using simdattn::float16;

TEST_CASE("16-bit row conversions on every ISA equal the scalar ones bit for bit (but a NaN's quiet bit): every pattern widened, "
          "ties, overflow, subnormals, NaN and random f32 narrowed, every length to 40" * doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 44);
  std::vector<std::uint16_t> all(65536 + 5);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> f;
  for (std::uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa00000u,
                          0x477fe000u, 0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                          0x3f808000u, 0x3f818000u, 0x3f800fffu, 0x3f801000u, 0x3f803000u, 0x7f7fffffu, 0x00000001u})
    f.push_back(detail::bits_float(u));
  std::uniform_int_distribution<std::uint32_t> bits;
  while (f.size() < 200003) f.push_back(detail::bits_float(bits(rng)));
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    CAPTURE(simd::isa_name(kt->isa));
    for (bool bf16 : {true, false}) {
      CAPTURE(bf16);
      const simd::Convert16Kernels& c = bf16 ? kt->convert_bf16 : kt->convert_f16;
      std::vector<float> w(all.size());
      c.widen(all.data(), w.data(), static_cast<std::int64_t>(all.size()));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < all.size(); ++i) {
        const float want = bf16 ? to_float(bfloat16{all[i]}) : to_float(float16{all[i]});
        // F16C's vcvtph2ps quiets a signalling NaN: NaN stays NaN, its quiet bit may differ.
        if (std::isnan(want)) wrong += !std::isnan(w[i]);
        else wrong += detail::float_bits(w[i]) != detail::float_bits(want);
      }
      CHECK(wrong == 0);
      std::vector<std::uint16_t> h(f.size());
      c.narrow(f.data(), h.data(), static_cast<std::int64_t>(f.size()));
      wrong = 0;
      for (std::size_t i = 0; i < f.size(); ++i) wrong += h[i] != (bf16 ? to_bfloat16(f[i]).bits : to_float16(f[i]).bits);
      CHECK(wrong == 0);
      // The widening transpose equals widening, then the f32 transpose: panels of every size
      // around the 16 x 16 block, rows past `rows` zero, nothing past `width` or `cols` written.
      for (auto [rows, cols, width] : {std::tuple{1, 1, 1}, {16, 16, 16}, {13, 40, 16}, {33, 17, 48}, {0, 5, 12}, {64, 64, 64}}) {
        const std::int64_t ld = cols + 3, dst_ld = width + 5;
        std::vector<std::uint16_t> src(static_cast<std::size_t>(std::max(1, rows) * ld));
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = all[(i * 7919 + 12345) % 65536];
        std::vector<float> wide(src.size());
        c.widen(src.data(), wide.data(), static_cast<std::int64_t>(src.size()));
        std::vector<float> got(static_cast<std::size_t>(cols * dst_ld + 8), -3.0f), want = got;
        c.pack_transpose(src.data(), ld, rows, cols, got.data(), dst_ld, width);
        kt->vec<float>().pack_transpose(wide.data(), ld, rows, cols, want.data(), dst_ld, width);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          bad += !(detail::float_bits(got[i]) == detail::float_bits(want[i]) || (std::isnan(got[i]) && std::isnan(want[i])));
        CAPTURE_VALUE(rows);
        CAPTURE_VALUE(cols);
        CHECK(bad == 0);
      }
      // Narrowed into the pair layout: word c of pair row s is rows 2s and 2s + 1's values at c
      // (low, high), each as narrow's; an odd last row pairs with zero; nothing past cols or the
      // last pair row written.
      for (auto [rows, cols] : {std::tuple{1, 1}, {2, 16}, {5, 37}, {8, 64}, {7, 3}, {3, 0}, {0, 5}}) {
        const std::int64_t ld = cols + 3, dst_ld = cols + 2, pair_rows = (rows + 1) / 2;
        const float* src = f.data() + 11;
        std::vector<std::uint32_t> got(static_cast<std::size_t>((pair_rows + 1) * dst_ld), 0xdeadbeefu);
        c.narrow_pairs(src, ld, rows, cols, got.data(), dst_ld);
        auto one = [&](float x) -> std::uint32_t { return bf16 ? to_bfloat16(x).bits : to_float16(x).bits; };
        std::size_t bad = 0;
        for (std::int64_t s = 0; s <= pair_rows; ++s)
          for (std::int64_t j = 0; j < dst_ld; ++j) {
            std::uint32_t want = 0xdeadbeefu;
            if (s < pair_rows && j < cols)
              want = one(src[2 * s * ld + j]) | (2 * s + 1 < rows ? one(src[(2 * s + 1) * ld + j]) << 16 : 0u);
            bad += got[static_cast<std::size_t>(s * dst_ld + j)] != want;
          }
        CAPTURE_VALUE(rows);
        CAPTURE_VALUE(cols);
        CHECK(bad == 0);
      }
      // Every length up to 40 from an odd offset: the tail converted, nothing past n written.
      for (std::int64_t n = 0; n <= 40; ++n) {
        std::vector<float> wf(64, -7.0f);
        std::vector<std::uint16_t> nh(64, 0xabcd);
        c.widen(all.data() + 0x3c01, wf.data() + 1, n);
        c.narrow(f.data() + 3, nh.data() + 1, n);
        std::size_t bad = 0;
        for (std::int64_t i = 0; i < 64; ++i) {
          const bool in = i >= 1 && i <= n;
          const auto src = static_cast<std::uint16_t>(0x3c01 + i - 1);
          const float want_w = in ? (bf16 ? to_float(bfloat16{src}) : to_float(float16{src})) : -7.0f;
          const std::uint16_t want_h = in ? (bf16 ? to_bfloat16(f[std::size_t(i + 2)]).bits : to_float16(f[std::size_t(i + 2)]).bits) : 0xabcd;
          bad += detail::float_bits(wf[std::size_t(i)]) != detail::float_bits(want_w) || nh[std::size_t(i)] != want_h;
        }
        CAPTURE(n);
        CHECK(bad == 0);
      }
    }
  }
}
