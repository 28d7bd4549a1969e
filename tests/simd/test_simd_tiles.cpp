// The fused attention path's tile-layout products (TileAttentionKernels::block: AMX tiles, or
// vdpbf16ps over the same layouts: every table's tile_attention and tile_attention_pairs) against a float64 product: A packed as tiles by the table's
// pack_a or read in place, B as panels of 32 columns of bf16 pairs, every row count around the
// 8-row groups and 16-row halves, column counts around the 16-column vectors and 32-column
// panels, depths around the 32-k steps, overwritten and accumulated. The values are small
// integers, so every sum is exact in f32 whatever its order: the results equal the float64 ones
// bit for bit, and nothing outside C[0:m, 0:n] is written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "simdattn/half.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

TEST_CASE("tile-layout products (TileAttentionKernels::block): packed and in-place A, every edge of rows, columns and "
          "depth, overwritten and accumulated, equal the float64 product") {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 61);
  std::uniform_int_distribution<int> small(-8, 8);
  auto bf = [](int v) { return to_bfloat16(static_cast<float>(v)).bits; };
  int tables = 0;
  for (const simd::KernelTable* kt : test::kernel_tables())
    for (const simd::TileAttentionKernels* tkp : {&kt->tile_attention, &kt->tile_attention_pairs}) {
      const simd::TileAttentionKernels& tk = *tkp;
      if (tk.block == nullptr) continue;
      ++tables;
      CAPTURE(simd::isa_name(kt->isa));
      CAPTURE(tkp == &kt->tile_attention_pairs);
      for (int m : {1, 5, 8, 9, 16, 17, 24, 31, 32})
        for (int n : {1, 15, 16, 17, 32, 33, 40, 64, 70})
          for (std::int64_t kb : {1, 31, 32, 40, 64, 77, 100, 128})
            for (int mode = 0; mode < 4; ++mode) {  // bit 0: accumulate; bit 1: A read in place
              const bool accumulate = (mode & 1) != 0, in_place = (mode & 2) != 0;
              if (in_place && kb % 32 != 0) continue;  // the contract: in place, whole steps only
              CAPTURE(m);
              CAPTURE(n);
              CAPTURE(kb);
              CAPTURE(mode);
              const std::int64_t kr = (kb + 31) / 32 * 32, lda = kb + 32, panels = (n + 31) / 32;
              std::vector<int> a(static_cast<std::size_t>(m * kb)), b(static_cast<std::size_t>(kb * n));
              for (int& x : a) x = small(rng);
              for (int& x : b) x = small(rng);
              std::vector<std::uint16_t> arow(static_cast<std::size_t>(m * lda) + 64, bf(99));  // 99: never read
              for (int r = 0; r < m; ++r)
                for (std::int64_t k = 0; k < kb; ++k) arow[r * lda + k] = bf(a[r * kb + k]);
              // packed A: 32 rows x 32 k a step, 64-byte aligned
              std::vector<std::uint16_t> abuf(static_cast<std::size_t>(kr * 32 + 32), bf(99));
              std::uint16_t* ap = abuf.data();
              while (reinterpret_cast<std::uintptr_t>(ap) % 64 != 0) ++ap;
              tk.pack_a(arow.data(), lda, m, kb, ap);
              // B: panel j's pair-row p holds (B[2p, c], B[2p + 1, c]) of its 32 columns, zeros past kb and n
              const std::int64_t b_stride = kr * 32;
              std::vector<std::uint16_t> bbuf(static_cast<std::size_t>(panels * b_stride + 32), 0);
              std::uint16_t* bp = bbuf.data();
              while (reinterpret_cast<std::uintptr_t>(bp) % 64 != 0) ++bp;
              for (std::int64_t k = 0; k < kb; ++k)
                for (int c = 0; c < n; ++c) bp[(c / 32) * b_stride + (k / 2) * 64 + 2 * (c % 32) + k % 2] = bf(b[k * n + c]);
              const std::int64_t ldc = n + 7;
              std::vector<float> c(static_cast<std::size_t>((m + 1) * ldc), -7.0f);
              std::vector<double> want(c.size());
              for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(small(rng)), want[i] = c[i];
              for (int r = 0; r < m; ++r)
                for (int j = 0; j < n; ++j) {
                  double s = accumulate ? want[r * ldc + j] : 0.0;
                  for (std::int64_t k = 0; k < kb; ++k) s += double(a[r * kb + k]) * double(b[k * n + j]);
                  want[r * ldc + j] = s;
                }
              // (prefetching the next block's lines, here a's own, changes nothing)
              const auto pf_lines = static_cast<std::int64_t>(arow.size() * 2 / 64);
              if (in_place)
                tk.block(kb, arow.data(), 32, 16 * lda, 2 * lda, m, bp, b_stride, n, c.data(), ldc, accumulate, arow.data(), pf_lines);
              else tk.block(kb, ap, 1024, 512, 64, m, bp, b_stride, n, c.data(), ldc, accumulate, arow.data(), pf_lines);
              std::size_t wrong = 0;
              for (std::size_t i = 0; i < c.size(); ++i) wrong += double(c[i]) != want[i];
              CHECK(wrong == 0);
            }
      if (tk.done != nullptr) tk.done();
    }
  if (tables == 0) MESSAGE("no table with tile attention kernels on this CPU: the products were not run");
}

TEST_CASE("pairing two 16-bit rows into 32-bit words (TileAttentionKernels::pair_rows): every length to 70, a null "
          "second row, nothing written past n") {
  using namespace simdattn;
  int tables = 0;
  for (const simd::KernelTable* kt : test::kernel_tables())
    for (const simd::TileAttentionKernels* tkp : {&kt->tile_attention, &kt->tile_attention_pairs}) {
      if (tkp->pair_rows == nullptr) continue;
      ++tables;
      CAPTURE(simd::isa_name(kt->isa));
      for (std::int64_t n = 0; n <= 70; ++n)
        for (bool second : {true, false}) {
          CAPTURE(n);
          CAPTURE(second);
          std::vector<std::uint16_t> r0(static_cast<std::size_t>(n) + 1), r1(r0.size());
          for (std::int64_t c = 0; c < n; ++c)
            r0[c] = static_cast<std::uint16_t>(0x1000 + c * 7), r1[c] = static_cast<std::uint16_t>(0xF000 - c * 3);
          std::vector<std::uint32_t> dst(static_cast<std::size_t>(n) + 20, 0xDEADBEEFu);
          tkp->pair_rows(r0.data(), second ? r1.data() : nullptr, n, dst.data());
          std::size_t wrong = 0;
          for (std::int64_t c = 0; c < n; ++c)
            wrong += dst[c] != (std::uint32_t{r0[c]} | (second ? std::uint32_t{r1[c]} << 16 : 0u));
          for (std::size_t c = static_cast<std::size_t>(n); c < dst.size(); ++c) wrong += dst[c] != 0xDEADBEEFu;
          CHECK(wrong == 0);
        }
    }
  if (tables == 0) MESSAGE("no table with tile attention kernels on this CPU: pair_rows was not run");
}
