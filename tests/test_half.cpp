// bfloat16 and float16 (simdattn/half.hpp): exact conversion to f32, round to nearest even from
// f32 and f64 (ties, directly from f64 without double rounding), overflow to Inf, quiet NaN,
// subnormals; checked exhaustively over the 16-bit patterns and against a nearest-value search.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>

#include "simdattn/half.hpp"
#include "linalg/gemm16.hpp"
#include "support/simd_test_util.hpp"
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

TEST_CASE("bfloat16 and float16: every pattern converts to f32 and back unchanged; NaN stays NaN") {
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

TEST_CASE("bf16 and f16 attention: keys past the key lengths are not read, masks of any float dtype" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 41);
  auto run = [&](auto tag, std::int64_t Sq) {  // Sq = 1: the decode path on 16-bit K and V
    using T = decltype(tag);
    const std::int64_t B = 2, H = 4, Hkv = 2, Sk = 70, D = 24;
    test::Buffer<T> q({B, H, Sq, D}), k({B, Hkv, Sk, D}), v({B, Hkv, Sk, D});
    q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng, 2.0);
    const std::vector<std::int64_t> lengths{40, 70};
    // Poison past batch 0's length: never read, so it cannot reach an output.
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t j = 40; j < Sk; ++j)
        for (std::int64_t d = 0; d < D; ++d) {
          k.at(0, h, j, d) = test::value<T>(std::numeric_limits<double>::quiet_NaN());
          v.at(0, h, j, d) = test::value<T>(std::numeric_limits<double>::infinity());
        }
    test::Buffer<float16> mask({1, 1, Sq, Sk});  // an additive f16 mask, whatever the inputs' dtype
    mask.for_each([&](float16& x, auto, auto, auto i, auto j) { x = to_float16((i + j) % 7 == 0 ? -1e9 : 0.25 * double(j % 3)); });
    AttentionOptions opt;
    opt.key_lengths = lengths;
    opt.causal = Causal::bottom_right;
    opt.mask = mask.cview();
    test::Buffer<T> ref({B, H, Sq, D});
    opt.backend = Backend::reference;
    attention(q.cview(), k.cview(), v.cview(), ref.view(), opt);
    test::Buffer<T> out({B, H, Sq, D});
    opt.backend = Backend::native;
    attention(q.cview(), k.cview(), v.cview(), out.view(), opt);
    bool finite = true;
    out.for_each([&](T& x, auto...) { finite = finite && std::isfinite(test::as_double(x)); });
    CHECK(finite);
    CHECK(test::max_abs_diff(out, ref) <= test::tolerance<T>(test::max_abs(v) > 1e30 ? 8.0 : test::max_abs(v)));
    // The same inputs widened to f32 on the reference: the bf16/f16 result is its rounding.
    test::Buffer<double> q64({B, H, Sq, D}), k64({B, Hkv, Sk, D}), v64({B, Hkv, Sk, D}), ref64({B, H, Sq, D});
    q64.for_each([&](double& x, auto a, auto b, auto c, auto d) { x = test::as_double(q.at(a, b, c, d)); });
    k64.for_each([&](double& x, auto a, auto b, auto c, auto d) { x = test::as_double(k.at(a, b, c, d)); });
    v64.for_each([&](double& x, auto a, auto b, auto c, auto d) { x = test::as_double(v.at(a, b, c, d)); });
    opt.backend = Backend::reference;
    attention(q64.cview(), k64.cview(), v64.cview(), ref64.view(), opt);
    ref.for_each([&](T& x, auto a, auto b, auto c, auto d) {
      CHECK(test::as_double(x) == test::as_double(test::value<T>(ref64.at(a, b, c, d))));
    });
  };
  for (std::int64_t Sq : {5, 1}) {
    run(bfloat16{}, Sq);
    run(float16{}, Sq);
  }
#ifdef SIMDATTN_HAVE_ONEDNN
  {  // a dtype oneDNN has no matmul for here: a clear error naming the backend option, out untouched
    for (DType dt : {DType::bf16, DType::f16}) {
      if (backend_takes(Backend::onednn, dt)) continue;
      test::Buffer<bfloat16> q({1, 1, 2, 4}), o({1, 1, 2, 4});
      o.data.assign(o.data.size(), to_bfloat16(3.0));
      AttentionOptions opt;
      opt.backend = Backend::onednn;
      const std::string want = "has no " + std::string(dtype_name(dt)) + " matmul on this CPU";
      try {
        if (dt == DType::bf16) attention(q.cview(), q.cview(), q.cview(), o.view(), opt);
        else {
          test::Buffer<float16> h({1, 1, 2, 4}), ho({1, 1, 2, 4});
          attention(h.cview(), h.cview(), h.cview(), ho.view(), opt);
        }
        FAIL("no error for " << dtype_name(dt));
      } catch (const Error& e) {
        CHECK(e.argument() == "options.backend");
        CHECK(std::string(e.what()).find(want) != std::string::npos);
      }
      CHECK(to_float(o.data[0]) == 3.0f);
    }
  }
#endif
}

TEST_CASE("bf16 and f16 attention on views whose innermost stride is not 1: decode, short-key and fused paths" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 43);
  // A copy of a dense buffer with every element two apart; the gaps hold NaN, which no path may
  // read (nor, in an output, write).
  auto spread = [](auto dense) {
    auto s = dense;
    s.strides = {dense.strides[0] * 2, dense.strides[1] * 2, dense.strides[2] * 2, 2};
    s.data.assign(dense.data.size() * 2, test::value<typename decltype(s.data)::value_type>(std::nan("")));
    s.for_each([&](auto& x, auto a, auto b, auto c, auto d) { x = dense.at(a, b, c, d); });
    return s;
  };
  auto run = [&](auto tag, std::int64_t Sq, std::int64_t Sk, std::int64_t D, Causal causal) {
    using T = decltype(tag);
    const std::int64_t B = 2, H = 4, Hkv = 2;
    auto t = test::random_qkv<T>(rng, B, H, Hkv, Sq, Sk, D);
    AttentionOptions opt;
    opt.causal = causal;
    const test::Buffer<T> ref = test::run_attention(Backend::reference, t.q, t.k, t.v, opt);
    const auto q = spread(t.q), k = spread(t.k), v = spread(t.v);
    auto out = spread(test::Buffer<T>({B, H, Sq, D}));
    opt.backend = Backend::native;
    attention(q.cview(), k.cview(), v.cview(), out.view(), opt);
    INFO("Sq=" << Sq << " Sk=" << Sk << " D=" << D);
    CHECK(test::max_abs_diff(out, ref) <= test::tolerance<T>(test::max_abs(t.v)));
    std::int64_t gaps_kept = 0;
    for (std::size_t i = 1; i < out.data.size(); i += 2) gaps_kept += std::isnan(test::as_double(out.data[i]));
    CHECK(gaps_kept == std::int64_t(out.data.size() / 2));
  };
  for (auto [Sq, Sk, D, causal] : {std::tuple{std::int64_t{1}, std::int64_t{70}, std::int64_t{24}, Causal::none},
                                   {40, 60, 40, Causal::none}, {130, 200, 33, Causal::top_left}, {97, 129, 64, Causal::none}}) {
    run(bfloat16{}, Sq, Sk, D, causal);
    run(float16{}, Sq, Sk, D, causal);
  }
}

TEST_CASE("bf16 and f16: a NaN in Q poisons exactly its own row, fully masked rows are zeros, every backend and "
          "native path" * doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 45);
  auto run = [&](auto tag, std::int64_t Sq, std::int64_t Sk, std::int64_t D, bool mask) {
    using T = decltype(tag);
    const std::int64_t B = 1, H = 2;
    auto t = test::random_qkv<T>(rng, B, H, H, Sq, Sk, D);
    const std::int64_t nan_row = Sq - 1, empty_row = mask ? 0 : -1;
    t.q.at(0, 1, nan_row, D / 2) = test::value<T>(std::nan(""));
    test::Buffer<std::uint8_t> m({1, 1, Sq, Sk});  // every key visible but for row 0's, if mask
    m.for_each([&](std::uint8_t& x, auto, auto, auto i, auto) { x = i == empty_row ? 0 : 1; });
    for (Backend be : test::backends()) {
      if (!backend_takes(be, dtype_of<T>())) continue;
      AttentionOptions opt;
      if (mask) opt.mask = m.cview();
      const test::Buffer<T> out = test::run_attention(be, t.q, t.k, t.v, opt);
      CAPTURE(backend_name(be));
      CAPTURE(Sq);
      CAPTURE(Sk);
      std::int64_t wrong = 0;
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < Sq; ++i)
          for (std::int64_t d = 0; d < D; ++d) {
            const double x = test::as_double(out.at(0, h, i, d));
            if (i == empty_row) wrong += !(x == 0.0 && !std::signbit(x));
            else if (h == 1 && i == nan_row) wrong += !std::isnan(x);
            else wrong += !std::isfinite(x);
          }
      CHECK(wrong == 0);
    }
  };
  // decode (one row), short keys (77 keys, no mask), fused (masked, and past one key block)
  for (auto [Sq, Sk, D, mask] : {std::tuple{std::int64_t{1}, std::int64_t{90}, std::int64_t{16}, false},
                                 {130, 77, 40, false}, {130, 77, 40, true}, {100, 200, 24, true}}) {
    run(bfloat16{}, Sq, Sk, D, mask);
    run(float16{}, Sq, Sk, D, mask);
  }
}

TEST_CASE("bf16 attention at the tile edges (AMX where the CPU has it): D = 40, 64, 80, 128, 256, Sk = 1, 77 and "
          "past the key blocks, causal, masks, grouped heads; any thread count gives the same bits" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 46);
  int n = 0;
  for (std::int64_t D : {40, 64, 80, 128, 256})
    for (auto [Sq, Sk] : {std::pair<std::int64_t, std::int64_t>{33, 1}, {100, 77}, {17, 129}, {130, 300}}) {
      const std::int64_t Hkv = 1 + n % 2, H = Hkv * (1 + n % 3), B = 1 + (n / 3) % 2;
      auto t = test::random_qkv<bfloat16>(rng, B, H, Hkv, Sq, Sk, D, n % 4 == 3 ? 48 : D);
      AttentionOptions opt;
      opt.causal = n % 3 == 1 ? Causal::bottom_right : n % 3 == 2 ? Causal::top_left : Causal::none;
      test::Buffer<float> mask({1, 1, Sq, Sk});
      mask.for_each([&](float& x, auto, auto, auto i, auto j) { x = (i * 7 + j * 3) % 11 == 0 ? -1e30f : 0.1f * float(j % 5); });
      if (n % 2 == 0) opt.mask = mask.cview();
      const test::Buffer<bfloat16> ref = test::run_attention(Backend::reference, t.q, t.k, t.v, opt);
      opt.threads = 1;
      const test::Buffer<bfloat16> one = test::run_attention(Backend::native, t.q, t.k, t.v, opt);
      opt.threads = 2;
      const test::Buffer<bfloat16> two = test::run_attention(Backend::native, t.q, t.k, t.v, opt);
      CAPTURE(D);
      CAPTURE(Sq);
      CAPTURE(Sk);
      CAPTURE(n);
      CHECK(test::max_abs_diff(one, ref) <= test::tolerance<bfloat16>(test::max_abs(t.v)));
      bool same = true;
      for (std::size_t i = 0; i < one.data.size(); ++i) same = same && one.data[i].bits == two.data[i].bits;
      CHECK(same);
      ++n;
    }
}

TEST_CASE("16-bit GEMV kernels on every ISA: sizes around the vector width, beta, bf16 and f16" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 42);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    CAPTURE(simd::isa_name(kt->isa));
    for (bool bf16 : {true, false}) {
      const simd::Gemv16Kernels& g = bf16 ? kt->gemv_bf16 : kt->gemv_f16;
      auto widen = [&](std::uint16_t h) { return bf16 ? double(to_float(bfloat16{h})) : double(to_float(float16{h})); };
      for (std::int64_t n : {1, 3, 4, 5, 15, 16, 17, 33, 64, 70}) {
        for (std::int64_t k : {1, 7, 8, 16, 31, 128, 129}) {
          const std::int64_t ldb = std::max(n, k) + 3;
          std::vector<std::uint16_t> Bm(static_cast<std::size_t>(ldb * std::max(n, k)));
          for (auto& b : Bm) b = bf16 ? to_bfloat16(nd(rng)).bits : to_float16(nd(rng)).bits;
          std::vector<float> x(static_cast<std::size_t>(std::max(n, k)));
          for (auto& v : x) v = static_cast<float>(nd(rng));
          for (float beta : {0.0f, 0.5f}) {
            // dot_rows: y[j] = 1.5 * x . B[j, :] + beta y[j]; sum_rows: y[j] = 1.5 * sum_p x[p] B[p, j] + beta y[j]
            std::vector<float> y1(static_cast<std::size_t>(n), beta == 0.0f ? NAN : 0.25f), y2 = y1;
            g.gemv_t(n, k, 1.5f, x.data(), Bm.data(), ldb, beta, y1.data());
            g.gemv_n(n, k, 1.5f, x.data(), Bm.data(), ldb, beta, y2.data());
            for (std::int64_t j = 0; j < n; ++j) {
              double d = 0, s = 0, scale = 0;
              for (std::int64_t p = 0; p < k; ++p) {
                d += x[p] * widen(Bm[j * ldb + p]);
                s += x[p] * widen(Bm[p * ldb + j]);
                scale += std::fabs(x[p]) * 4.0;
              }
              const double prev = beta == 0.0f ? 0.0 : 0.25 * beta;
              CHECK(std::fabs(y1[j] - (1.5 * d + prev)) <= 1e-5 * (1.0 + 1.5 * scale));
              CHECK(std::fabs(y2[j] - (1.5 * s + prev)) <= 1e-5 * (1.0 + 1.5 * scale));
            }
          }
        }
      }
    }
  }
}

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
          }
        }
      }
    }
  }
}

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
        CAPTURE(rows);
        CAPTURE(cols);
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

TEST_CASE("bf16 on onednn with sliding windows: rows at the start of a block's key range (a regression: K and V views "
          "starting past key 0 gave wrong rows)") {
  using namespace simdattn;
  if (!backend_takes(Backend::onednn, DType::bf16)) {
    MESSAGE("onednn does not take bf16 here: not run");
    return;
  }
  std::mt19937_64 rng(test::base_seed() + 49);
  for (auto [Sq, Sk, left] : {std::tuple{std::int64_t{27}, std::int64_t{83}, std::int64_t{31}}, {27, 83, 30}, {16, 83, 31},
                              {100, 160, 60}}) {
    CAPTURE(Sq);
    CAPTURE(left);
    auto t = test::random_qkv<bfloat16>(rng, 1, 1, 1, Sq, Sk, 64);
    AttentionOptions opt;
    opt.window = Window{left, 2};
    const test::Buffer<bfloat16> ref = test::run_attention(Backend::reference, t.q, t.k, t.v, opt);
    const test::Buffer<bfloat16> dnn = test::run_attention(Backend::onednn, t.q, t.k, t.v, opt);
    CHECK(test::max_abs_diff(dnn, ref) <= test::tolerance<bfloat16>(test::max_abs(t.v)));
  }
}
