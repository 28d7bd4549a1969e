// The fused attention path's softmax step into bf16 P tiles (TileAttentionKernels::softmax_rows
// and softmax_rows_lse, on AMX's table or the vdpbf16ps tables'): the step against a scalar twin,
// and its exponential against long double on every input class.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "simdattn/half.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn::simd;
using simdattn::test::expected_l;
using simdattn::test::expected_max_alpha;
using simdattn::test::kernel_tables;

namespace {

// The table's tile softmax steps: AMX's, or the vdpbf16ps tables' (the same step, run where the
// table has either); nullptr where it has neither.
const TileAttentionKernels* tile_softmax_of(const KernelTable& kt) {
  if (kt.tile_attention.softmax_rows != nullptr) return &kt.tile_attention;
  if (kt.tile_attention_pairs.softmax_rows != nullptr) return &kt.tile_attention_pairs;
  return nullptr;
}

}  // namespace

// The tile attention tables' softmax step into bf16 P tiles (TileAttentionKernels::softmax_rows
// and softmax_rows_lse), against a scalar twin: m and alpha exactly as softmax_rows', each weight
// within bf16's rounding (2^-8 relative: a half ulp) plus the kernel's error (1e-4; _lse 4e-6)
// of exp(s - m_new), exact zeros outside the visible keys and around them in the tile, rows past
// `rows` untouched, l within that error of the prior l plus the weights; scores at -1e30 and a
// large row max (the exact form of the argument); a NaN among a row's visible scores (its weight
// and l NaN, the max the other scores'); references held (one sweep), moved after the attempt (a
// second sweep) and absent (-inf: the max first), mixed within groups of four rows and alone.
TEST_CASE("the tile softmax step into bf16 tiles: max, alpha, weights, zeros, l (AMX and vdpbf16ps tables)") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 48);
  std::normal_distribution<double> nd(0.0, 4.0);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  int tables = 0;
  for (const KernelTable* kt : kernel_tables()) {
    const TileAttentionKernels* tiles = tile_softmax_of(*kt);
    if (tiles == nullptr) continue;
    const TileAttentionKernels& tk = *tiles;
    ++tables;
    CAPTURE(isa_name(kt->isa));
    for (const bool exact : {false, true}) {
      for (std::int64_t rows : {1, 4, 5, 32})
        for (std::int64_t n : {1, 16, 17, 40, 77, 128, 256})
          for (std::int64_t lead : {0, 16})
            for (int kind = 0; kind < 4; ++kind) {  // 0 plain, 1 intervals, 2 scale -0.5, 3 large scores
              if (lead + n > 256) continue;
              CAPTURE(rows);
              CAPTURE(n);
              CAPTURE(lead);
              CAPTURE(kind);
              CAPTURE(exact);
              const auto softmax_rows = exact ? tk.softmax_rows_lse : tk.softmax_rows;
              const long double err = exact ? 4e-6L : 1e-4L;
              const float scale = kind == 2 ? -0.5f : 0.125f;
              const std::int64_t ld = n + 5, cols = (lead + n + 31) / 32 * 32;
              std::vector<float> x(static_cast<std::size_t>(rows * ld), nan);  // past n: never read
              for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t j = 0; j < n; ++j)
                  x[r * ld + j] = static_cast<float>(nd(rng)) + (kind == 3 && r % 2 == 0 ? 4e6f : 0.f);
              if (rows > 2)
                for (std::int64_t j = 0; j < n; ++j) x[2 * ld + j] = j % 3 == 0 ? -1e30f : x[2 * ld + j];
              if (rows > 3)
                for (std::int64_t j = 0; j < n; ++j) x[3 * ld + j] = -inf / scale;  // every s is -inf
              std::vector<std::int64_t> lo(static_cast<std::size_t>(rows)), hi(lo.size());
              for (std::int64_t r = 0; r < rows; ++r) {
                lo[r] = kind == 1 ? (r * 7) % (n + 1) : 0;
                hi[r] = kind == 1 ? std::min<std::int64_t>(n, lo[r] + (r * 13) % (n + 1)) : n;
                if (kind == 1)
                  for (std::int64_t j = 0; j < n; ++j)
                    if (j < lo[r] || j >= hi[r]) x[r * ld + j] = nan;  // hidden: not read
              }
              if (rows > 6 && hi[6] > lo[6]) x[6 * ld + (lo[6] + hi[6]) / 2] = nan;  // a NaN among visible scores
              std::vector<float> m(static_cast<std::size_t>(rows)), l(m.size()), alpha(m.size(), 7.f);
              for (std::int64_t r = 0; r < rows; ++r)
                m[r] = r % 8 == 1 || r == 4 ? -inf : (kind == 3 ? 4e5f : 0.5f), l[r] = float(r % 3);
              const std::vector<float> m0 = m, l0 = l;
              std::vector<std::uint16_t> buf(static_cast<std::size_t>(cols / 32 * 1024 + 32), 0xABCD);
              std::uint16_t* p = buf.data();
              while (reinterpret_cast<std::uintptr_t>(p) % 64 != 0) ++p;
              softmax_rows(x.data(), ld, rows, n, scale, kind == 1 ? lo.data() : nullptr,
                           kind == 1 ? hi.data() : nullptr, m.data(), l.data(), alpha.data(), p, lead);
              for (std::int64_t r = 0; r < 32; ++r) {
                CAPTURE(r);
                auto at = [&](std::int64_t c) { return p[(c / 32) * 1024 + r * 32 + c % 32]; };
                if (r >= rows) {
                  for (std::int64_t c = 0; c < cols; ++c) CHECK(at(c) == 0xABCD);
                  continue;
                }
                float bm = -inf;  // (std::max keeps bm where the score is NaN: NaN does not enter the max)
                for (std::int64_t j = lo[r]; j < hi[r]; ++j) bm = std::max(bm, x[r * ld + j] * scale);
                const auto [mn, want_alpha] = expected_max_alpha(bm, m0[r]);
                CHECK(m[r] == mn);
                CHECK(alpha[r] == doctest::Approx(want_alpha).epsilon(1e-6));
                long double sum = 0;
                bool nan_seen = false;
                for (std::int64_t c = 0; c < cols; ++c) {
                  const std::int64_t j = c - lead;
                  const std::uint32_t bits = std::uint32_t{at(c)} << 16;
                  float got;
                  std::memcpy(&got, &bits, 4);
                  if (j < lo[r] || j >= hi[r] || j >= n) {
                    CHECK(at(c) == 0);
                    continue;
                  }
                  if (std::isnan(x[r * ld + j])) {  // its weight NaN, and so l
                    CHECK(std::isnan(got));
                    nan_seen = true;
                    continue;
                  }
                  const long double want =
                      mn == -inf
                          ? 0.0L
                          : std::exp(static_cast<long double>(x[r * ld + j] * scale) - static_cast<long double>(mn));
                  if (want < 0x1p-125L)
                    CHECK(got <= 0x1p-125f);
                  else
                    CHECK(std::fabs(got - want) <= (0x1p-8L + err) * want);
                  sum += want;
                }
                const long double l_want = expected_l(l0[r], want_alpha, sum);
                if (nan_seen)
                  CHECK(std::isnan(l[r]));
                else
                  CHECK(std::fabs(static_cast<long double>(l[r]) - l_want) <= (err + 1e-6L) * (1 + l_want));
              }
            }
    }
  }
  if (tables == 0) MESSAGE("no table with the tile softmax step on this CPU: it was not run");
}

// The step's exponential against long double on every input class, each weight seen alone: rows
// of one key (the masked lanes) and of 32 equal keys (whole vectors), the rows' references held
// (m = m0 finite, the block below m0 + 8: no reference moves), l from 0, so that l is the weight
// the kernel summed (times 32) and P its bf16 rounding. Classes: exactly the reference (1),
// just below and above it, the slack above it (up to e^8), every binade down to 2^-126 on a
// fine grid, just past it (0), -1e30 and -inf (0), NaN (NaN); references 0, -3.5, 200 (the
// one-FMA argument) and 1000 (the argument rounded as the max is); scales 1 and 0.125. The
// bound: the polynomial's (8.6e-5; _lse 2.9e-6) plus the f32 argument's rounding, 1.2e-7 times
// (|s - m| + |m|) for the one-FMA form, |s| for the other. P is exactly l's weight rounded to
// nearest even bf16: the weights that reach the PV product are the ones l sums, rounded once.
TEST_CASE("the tile softmax exponential against long double: every input class, P is the weight l sums, rounded") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<double> offsets{0.0,  -1e-30, -1e-7, 1e-7,  -0.5,  0.5,   1.0,    7.99,
                              -1.0, -2.0,   -87.0, -87.3, -87.6, -88.0, -100.0, -1e30};
  for (double t = -87.4; t < 8.0; t += 0.0173) offsets.push_back(t);
  int tables = 0;
  for (const KernelTable* kt : kernel_tables()) {
    const TileAttentionKernels* tiles = tile_softmax_of(*kt);
    if (tiles == nullptr) continue;
    const TileAttentionKernels& tk = *tiles;
    ++tables;
    CAPTURE(isa_name(kt->isa));
    alignas(64) static std::uint16_t p[32 * 32];
    for (const bool exact : {false, true})
      for (const float m0 : {0.0f, -3.5f, 200.0f, 1000.0f})
        for (const float scale : {1.0f, 0.125f})
          for (const std::int64_t n : {1, 32}) {
            CAPTURE(exact);
            CAPTURE(m0);
            CAPTURE(scale);
            CAPTURE(n);
            const long double poly = exact ? 2.9e-6L : 8.6e-5L;
            for (std::size_t first = 0; first < offsets.size(); first += 32) {
              const std::int64_t rows = std::min<std::int64_t>(32, static_cast<std::int64_t>(offsets.size() - first));
              std::vector<float> x(static_cast<std::size_t>(32 * n));
              for (std::int64_t r = 0; r < rows; ++r)  // x * scale is m0 + the offset (rounded to f32)
                std::fill_n(x.begin() + r * n, n, static_cast<float>((m0 + offsets[first + r]) / scale));
              if (first == 0) {  // -inf and NaN in the first two rows instead
                std::fill_n(x.begin(), n, -inf);
                std::fill_n(x.begin() + n, n, nan);
              }
              std::vector<float> m(32, m0), l(32, 0.f), alpha(32, 7.f);
              (exact ? tk.softmax_rows_lse : tk.softmax_rows)(x.data(), n, rows, n, scale, nullptr, nullptr, m.data(),
                                                              l.data(), alpha.data(), p, 0);
              for (std::int64_t r = 0; r < rows; ++r) {
                const float s = x[static_cast<std::size_t>(r * n)] * scale;
                CAPTURE(s);
                const float w = l[r] / float(n);
                CHECK(m[r] == m0);
                if (!std::isnan(s)) CHECK(alpha[r] == 1.0f);
                if (std::isnan(s)) {
                  CHECK(std::isnan(w));
                  continue;
                }
                const long double want = std::exp(static_cast<long double>(s) - m0);
                if (want < 0x1p-126L * (1 + 1e-4L)) {
                  CHECK(w <= 0x1p-125f);  // (at the flush threshold either side)
                  if (want < 0x1p-127L) CHECK(w == 0.0f);
                } else {
                  const long double arg = std::fabs(m0) <= 256.0f
                                              ? std::fabs(static_cast<long double>(s) - m0) + std::fabs(m0)
                                              : std::fabs(s);
                  CHECK(std::fabs(w - want) <= (poly + 1.2e-7L * arg + 1e-7L) * want);
                }
                // P: the weight l summed, rounded to nearest even (every column of a whole row)
                const std::uint16_t rounded = simdattn::to_bfloat16(w).bits;
                for (std::int64_t c = 0; c < n; ++c) CHECK(p[(c / 32) * 1024 + r * 32 + c % 32] == rounded);
              }
            }
          }
  }
  if (tables == 0) MESSAGE("no table with the tile softmax step on this CPU: it was not run");
}
