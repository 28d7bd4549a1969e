// Values that must not leak or overflow, on every backend: poison (1e6, NaN, Inf) at hidden keys
// never reaches an output, a NaN in Q poisons exactly its own row, and logits of ~1e4 stay finite.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "support/test_util.hpp"

using namespace simdattn;
using test::Buffer;

TEST_CASE("poison V: 1e6 at every hidden key never reaches an output" * doctest::test_suite(test::every_isa)) {
  // Keys hidden from every query (past the key length, or masked out) hold V = 1e6; causal and a
  // window hide more per query. Outputs are convex combinations of visible V rows, all of
  // magnitude < 10, so a leak of even 1e-5 of a poisoned row shows.
  std::mt19937_64 rng(test::base_seed() + 16);
  const std::int64_t B = 2, H = 4, Hkv = 2, Sq = 150, Sk = 300, D = 24;
  const auto [q, k, v] = test::random_qkv<float>(rng, B, H, Hkv, Sq, Sk, D);
  const std::int64_t L[] = {250, 180};
  Buffer<std::uint8_t> m({B, 1, 1, Sk});
  m.for_each([](std::uint8_t& x, auto, auto, auto, auto j) { x = (j % 7 == 3) ? 0 : 1; });
  for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
    AttentionOptions opt;
    opt.causal = causal;
    opt.key_lengths = L;
    opt.window = Window{60, -1};
    opt.mask = m.cview();
    Buffer<float> vp = v;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < Sk; ++j)
        if (j >= L[b] || j % 7 == 3)
          for (std::int64_t hk = 0; hk < Hkv; ++hk)
            for (std::int64_t d = 0; d < D; ++d) vp.at(b, hk, j, d) = 1e6f;
    for (Backend be : test::fast_backends()) {
      const Buffer<float> out = test::run_attention(be, q, k, vp, opt);
      const Buffer<float> ref = test::run_attention(Backend::reference, q, k, v, opt);  // unpoisoned V
      CAPTURE(backend_name(be));
      CHECK(test::max_abs(out) < 10.0);
      CHECK(test::max_abs_diff(out, ref) <= test::tolerance<float>(test::max_abs(v)));
    }
  }
}

TEST_CASE("NaN and Inf in K/V past the key lengths (a KV cache's unused tail) are never read") {
  std::mt19937_64 rng(test::base_seed() + 17);
  // Sq = 1 and 2 take the decode path; 200 the blocked one. Causal rows also see their first key
  // only in a later key block.
  for (std::int64_t Sq : {1, 2, 200}) {
    const std::int64_t B = 2, H = 4, Hkv = 2, Sk = 300, D = 32;
    const auto [q, k, v] = test::random_qkv<float>(rng, B, H, Hkv, Sq, Sk, D);
    const std::int64_t L[] = {170, 260};
    Buffer<float> kp = k, vp = v;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t hk = 0; hk < Hkv; ++hk)
        for (std::int64_t j = L[b]; j < Sk; ++j)
          for (std::int64_t d = 0; d < D; ++d) {
            kp.at(b, hk, j, d) = (j + d) % 2 ? NAN : INFINITY;
            vp.at(b, hk, j, d) = (j + d) % 2 ? INFINITY : NAN;
          }
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      AttentionOptions opt;
      opt.causal = causal;
      opt.key_lengths = L;
      const Buffer<float> ref = test::run_attention(Backend::reference, q, k, v, opt);
      for (Backend be : test::fast_backends()) {
        const Buffer<float> out = test::run_attention(be, q, kp, vp, opt);
        CAPTURE(Sq);
        CAPTURE(backend_name(be));
        CHECK(test::max_abs_diff(out, ref) <= test::tolerance<float>(test::max_abs(v)));
      }
    }
  }
}

TEST_CASE("large-magnitude logits stay finite and agree") {
  // Scores of magnitude ~1e4: exp would overflow without the max subtraction.
  std::mt19937_64 rng(test::base_seed() + 12);
  const std::int64_t B = 1, H = 2, Sq = 9, Sk = 13, D = 16;
  Buffer<float> q({B, H, Sq, D}), k({B, H, Sk, D}), v({B, H, Sk, D});
  q.fill_normal(rng, 30.0);
  k.fill_normal(rng, 30.0);
  v.fill_normal(rng);
  AttentionOptions opt;
  opt.scale = 1.0;
  const Buffer<float> ref = test::run_attention(Backend::reference, q, k, v, opt);
  CHECK(test::max_abs(ref) > 0.0);
  for (float x : ref.data) CHECK(std::isfinite(x));
  for (Backend be : test::fast_backends()) {
    const Buffer<float> out = test::run_attention(be, q, k, v, opt);
    CHECK(test::max_abs_diff(out, ref) <= test::tolerance<float>(test::max_abs(v)));
  }
}

TEST_CASE("short key rows: NaN in Q poisons exactly its own row" * doctest::test_suite(test::every_isa)) {
  // 77 keys, D 40, no mask: the native kernel's transposed form, the NaN in the last panel.
  std::mt19937_64 rng(test::base_seed() + 17);
  const std::int64_t Sq = 130, D = 40;
  auto [q, k, v] = test::random_qkv<float>(rng, 1, 2, 2, Sq, 77, D);
  q.at(0, 1, 129, 3) = std::numeric_limits<float>::quiet_NaN();
  const Buffer<float> out = test::run_attention(Backend::native, q, k, v);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < Sq; ++i)
      for (std::int64_t d = 0; d < D; ++d) CHECK(std::isnan(out.at(0, h, i, d)) == (h == 1 && i == 129));
  for (float x : out.data) CHECK(!std::isinf(x));
}

TEST_CASE("NaN in Q poisons exactly its own row, masked poison in V never leaks") {
  std::mt19937_64 rng(test::base_seed() + 13);
  const std::int64_t B = 1, H = 2, Sq = 6, Sk = 7, D = 5;
  auto [q, k, v] = test::random_qkv<float>(rng, B, H, H, Sq, Sk, D);
  q.at(0, 1, 2, 3) = std::numeric_limits<float>::quiet_NaN();
  // Causal: keys after each query's position are hidden; poison them in V.
  for (std::int64_t j = 4; j < Sk; ++j)
    for (std::int64_t d = 0; d < D; ++d) v.at(0, 0, j, d) = 1e6f;
  for (Backend be : test::backends()) {
    CAPTURE(backend_name(be));
    AttentionOptions opt;
    opt.causal = Causal::top_left;
    const Buffer<float> out = test::run_attention(be, q, k, v, opt);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i)
        for (std::int64_t d = 0; d < D; ++d) {
          const float x = out.at(0, h, i, d);
          if (h == 1 && i == 2) CHECK(std::isnan(x));
          else CHECK(std::isfinite(x));
          if (h == 0 && i < 4) CHECK(std::abs(x) < 100.f);  // rows 0-3 never see keys 4-6
        }
  }
}
