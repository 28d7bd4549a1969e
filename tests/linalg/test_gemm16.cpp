// The 16-bit GEMM (linalg/gemm16.hpp) on every ISA this CPU supports: bf16 and f16 through the
// conversion kernels and bf16 in pairs (AVX512-BF16's vdpbf16ps; AMX's bf16 too), B packed into
// panels that hold it exactly, against sums in double; shapes around the tiles, odd and
// multi-block depths, column offsets, beta, 1 and 2 threads, A packed once (pack16_a).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "simdattn/half.hpp"
#include "linalg/gemm16.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

using simdattn::bfloat16;
using simdattn::float16;

TEST_CASE("16-bit GEMM on every ISA (AVX512-BF16 pairs and conversions): shapes around the tile, odd and "
          "multi-block depths, column offsets, beta, threads" * doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 43);
  std::normal_distribution<double> nd(0.0, 1.0);
  struct Shape {
    std::int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1},    {1, 70, 33},  {2, 31, 7},    {5, 64, 256}, {12, 32, 257},
                          {13, 96, 3},  {40, 33, 513}, {100, 200, 64}, {1, 300, 600}, {97, 65, 300},
                          // one below, at and above AMX's 16-row, 16-column, 32-deep tiles and 32 x 32 blocks
                          {15, 16, 17}, {16, 17, 31}, {17, 31, 32}, {31, 32, 33}, {32, 33, 15}, {33, 15, 16}, {3, 40, 64},
                          {4, 17, 33}, {64, 64, 64}};
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    CAPTURE(simd::isa_name(kt->isa));
    for (int variant = 0; variant < 3; ++variant) {  // bf16, f16, bf16 on vdpbf16ps (pairs)
      const bool bf16 = variant != 1, pairs = variant == 2;
      if (pairs && kt->gemm_bf16_pairs.mr == 0) continue;
      CAPTURE(variant);
      auto round = [&](double x) { return bf16 ? to_bfloat16(x).bits : to_float16(x).bits; };
      auto widen = [&](std::uint16_t h) { return bf16 ? double(to_float(bfloat16{h})) : double(to_float(float16{h})); };
      for (const Shape& s : shapes) {
        CAPTURE(s.M);
        CAPTURE(s.N);
        CAPTURE(s.K);
        // B is the first N columns of a wider matrix packed whole; the call takes a later
        // column group (b_col) when there is room for one.
        const std::int64_t nr = detail::gemm16_kernels(*kt, bf16, pairs).nr;
        const std::int64_t b_col = s.N % 2 == 0 ? nr : 0, NB = b_col + s.N + 5, lda = s.K + 3, ldc = s.N + 2;
        std::vector<std::uint16_t> A(static_cast<std::size_t>(s.M * lda)), B(static_cast<std::size_t>(s.K * NB));
        for (auto& a : A) a = round(nd(rng));
        for (auto& b : B) b = round(nd(rng));
        // A's columns past K are NaN: a kernel that reads them (times B's zero padding) makes C NaN
        for (std::int64_t i = 0; i < s.M; ++i)
          for (std::int64_t k = s.K; k < lda; ++k) A[static_cast<std::size_t>(i * lda + k)] = bf16 ? 0x7fc0 : 0x7e00;
        const detail::Packed16 pb = detail::pack16_b(B.data(), NB, s.K, NB, bf16, kt, pairs);
        CHECK(pb.pairs == detail::gemm16_kernels(*kt, bf16, pairs).pairs);  // AMX's bf16 is in pairs too
        CHECK(detail::unpack16_b(pb) == B);  // the panels hold B exactly (the onednn layer reads it back)
        for (float beta : {0.0f, 0.5f}) {
          for (int threads : {1, 2}) {
            std::vector<float> C(static_cast<std::size_t>(s.M * ldc), beta == 0.0f ? NAN : 0.25f);
            detail::Gemm16Args g;
            g.M = s.M, g.N = s.N, g.K = s.K, g.A = A.data(), g.lda = lda, g.B = &pb, g.b_col = b_col;
            g.C = C.data(), g.ldc = ldc, g.beta = beta;
            detail::gemm16(g, threads, kt);
            double worst = 0;
            for (std::int64_t i = 0; i < s.M; ++i) {
              for (std::int64_t j = 0; j < s.N; ++j) {
                double want = beta == 0.0f ? 0.0 : 0.25 * beta, mag = 0;
                for (std::int64_t k = 0; k < s.K; ++k) {
                  const double p = widen(A[i * lda + k]) * widen(B[k * NB + b_col + j]);
                  want += p, mag += std::fabs(p);
                }
                worst = std::max(worst, std::fabs(C[i * ldc + j] - want) / (1e-30 + 1e-6 * (1.0 + mag)));
              }
              // The padding column past N is not written.
              CHECK(std::isnan(C[i * ldc + s.N]) == (beta == 0.0f));
            }
            CHECK(worst <= 1.0);
            // A packed once (pack16_a, one block of the kernels; not on AMX's tiles) gives the
            // same bits, A itself not read
            if (detail::pack16_a_fits(s.M, s.K, pb, kt)) {
              std::vector<std::uint32_t, detail::AlignedAllocator<std::uint32_t>> ap(
                  static_cast<std::size_t>(detail::pack16_a_words(s.M, s.K, pb, kt)));
              detail::pack16_a(A.data(), lda, s.M, s.K, pb, ap.data(), kt);
              std::vector<float> C2(C.size(), beta == 0.0f ? NAN : 0.25f);
              g.A = nullptr, g.packed_a = ap.data(), g.C = C2.data();
              detail::gemm16(g, threads, kt);
              CHECK(std::equal(C.begin(), C.end(), C2.begin(), [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the avx512_bf16 level's bf16 GEMM: vdpbf16ps pairs on AMD's cores, widening to f32 on others") {
  using namespace simdattn;
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    if (kt->isa != simd::Isa::avx512_bf16) continue;
    CAPTURE(simd::bf16_pairs_preferred());
    CHECK(kt->gemm_bf16.pairs == simd::bf16_pairs_preferred());
    CHECK(kt->gemm_f16.pairs == false);
    if (simd::bf16_pairs_preferred()) CHECK((kt->gemm_bf16.ukernel[1] == kt->gemm_bf16_pairs.ukernel[1]));
  }
}
