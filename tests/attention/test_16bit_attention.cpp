// Attention in bf16 and f16 against the reference: key lengths over poisoned tails and additive
// masks of another float dtype (the reference's result the rounding of the f64 reference on the
// widened inputs), views whose innermost stride is not 1 on the decode, short-key and fused
// paths, a NaN in Q and fully masked rows on every backend and native path, and bf16 at the tile
// edges (AMX, or vdpbf16ps on AMD, where the CPU has it) at 1 and 2 threads. (oneDNN's bf16 with sliding windows:
// attention/onednn/test_onednn.cpp.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "simdattn/half.hpp"
#include "support/test_util.hpp"

using simdattn::bfloat16;
using simdattn::float16;

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

TEST_CASE("bf16 attention at the tile edges (AMX or vdpbf16ps where the CPU has them): D = 40, 64, 80, 128, 256, 576, Sk = 1, "
          "77 and past the key blocks, causal, masks, grouped heads, any thread count gives the same bits" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 46);
  int n = 0;
  // (576: MLA's latent width, past one depth block of the tile GEMM: the S products' depth is D whole)
  for (std::int64_t D : {40, 64, 80, 128, 256, 576})
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
      CAPTURE_VALUE(Sq);
      CAPTURE_VALUE(Sk);
      CAPTURE(n);
      CHECK(test::max_abs_diff(one, ref) <= test::tolerance<bfloat16>(test::max_abs(t.v)));
      bool same = true;
      for (std::size_t i = 0; i < one.data.size(); ++i) same = same && one.data[i].bits == two.data[i].bits;
      CHECK(same);
      ++n;
    }
}

TEST_CASE("bf16 decode steps with many rows per kv head (MQA's 32 heads, MLA's latent D = 576, Dv = 512) on the tile "
          "path's layouts where the CPU has them: against the reference, split keys, any thread count gives the same bits" *
          doctest::test_suite(simdattn::test::every_isa)) {
  using namespace simdattn;
  std::mt19937_64 rng(test::base_seed() + 62);
  struct Case {
    std::int64_t H, Hkv, Sq, Sk, D, Dv;
    Causal causal;
  };
  for (const Case& c : {Case{32, 1, 1, 300, 128, 128, Causal::none}, Case{16, 2, 3, 77, 64, 64, Causal::bottom_right},
                        Case{16, 1, 1, 1, 576, 512, Causal::none}, Case{24, 1, 2, 700, 576, 512, Causal::bottom_right},
                        Case{32, 1, 1, 4100, 128, 128, Causal::none}}) {
    CAPTURE_VALUE(c.H);
    CAPTURE_VALUE(c.Sq);
    CAPTURE_VALUE(c.Sk);
    CAPTURE_VALUE(c.D);
    auto t = test::random_qkv<bfloat16>(rng, 1, c.H, c.Hkv, c.Sq, c.Sk, c.D, c.Dv);
    AttentionOptions opt;
    opt.causal = c.causal;
    const test::Buffer<bfloat16> ref = test::run_attention(Backend::reference, t.q, t.k, t.v, opt);
    opt.threads = 1;
    const test::Buffer<bfloat16> one = test::run_attention(Backend::native, t.q, t.k, t.v, opt);
    opt.threads = 3;
    const test::Buffer<bfloat16> three = test::run_attention(Backend::native, t.q, t.k, t.v, opt);
    CHECK(test::max_abs_diff(one, ref) <= test::tolerance<bfloat16>(test::max_abs(t.v)));
    bool same = true;
    for (std::size_t i = 0; i < one.data.size(); ++i) same = same && one.data[i].bits == three.data[i].bits;
    CHECK(same);
  }
}
