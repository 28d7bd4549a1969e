// Properties of attention that hold for any inputs, checked on random cases for every backend.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "support/test_util.hpp"

using namespace simdattn;
using test::Buffer;

namespace {

struct Case {
  std::int64_t B, H, Hkv, Sq, Sk, D, Dv;
  Buffer<double> q, k, v;
};

Case random_case(std::mt19937_64& rng, std::int64_t Hkv_div = 1) {
  std::uniform_int_distribution<std::int64_t> small(1, 3), seq(1, 9), dim(1, 7);
  Case c;
  c.B = small(rng);
  c.Hkv = small(rng);
  c.H = c.Hkv * Hkv_div;
  c.Sq = seq(rng);
  c.Sk = seq(rng);
  c.D = dim(rng);
  c.Dv = dim(rng);
  c.q = Buffer<double>({c.B, c.H, c.Sq, c.D});
  c.k = Buffer<double>({c.B, c.Hkv, c.Sk, c.D});
  c.v = Buffer<double>({c.B, c.Hkv, c.Sk, c.Dv});
  c.q.fill_normal(rng, 2.0);
  c.k.fill_normal(rng, 2.0);
  c.v.fill_normal(rng, 3.0);
  return c;
}

// Runs the case in the backend's precision (f64; f32 for onednn, which has no f64) and returns
// the output as f64.
Buffer<double> run(const Case& c, const Buffer<double>& k, const Buffer<double>& v,
                   const AttentionOptions& opt) {
  Buffer<double> o({c.B, c.H, c.Sq, c.Dv});
  if (opt.backend == Backend::onednn) {
    const Buffer<float> qf = test::cast<float>(c.q), kf = test::cast<float>(k), vf = test::cast<float>(v);
    Buffer<float> of = test::cast<float>(o);
    attention(qf.cview(), kf.cview(), vf.cview(), of.view(), opt);
    return test::cast<double>(of);
  }
  attention(c.q.cview(), k.cview(), v.cview(), o.view(), opt);
  return o;
}

// Relative slack of a backend's results: f64 roundings, or f32 ones for onednn.
double slack(Backend be) { return be == Backend::onednn ? 1e-5 : 1e-12; }

}  // namespace

TEST_CASE("each output row is a convex combination of V rows") {
  std::mt19937_64 rng(test::base_seed() + 1);
  for (Backend be : test::backends()) {
    for (int trial = 0; trial < 40; ++trial) {
      Case c = random_case(rng);
      AttentionOptions opt;
      opt.backend = be;
      opt.causal = static_cast<Causal>(trial % 3);
      const Buffer<double> o = run(c, c.k, c.v, opt);
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t d = 0; d < c.Dv; ++d) {
            double lo = INFINITY, hi = -INFINITY;
            for (std::int64_t j = 0; j < c.Sk; ++j) {
              lo = std::min(lo, c.v.at(b, h / (c.H / c.Hkv), j, d));
              hi = std::max(hi, c.v.at(b, h / (c.H / c.Hkv), j, d));
            }
            for (std::int64_t i = 0; i < c.Sq; ++i) {
              const double x = o.at(b, h, i, d);
              if (x == 0.0) continue;  // a causal row that sees no key (Sq > Sk, bottom-right)
              CHECK(x >= lo - slack(be) * std::max(1.0, std::abs(lo)));
              CHECK(x <= hi + slack(be) * std::max(1.0, std::abs(hi)));
            }
          }
    }
  }
}

TEST_CASE("permuting keys and values together leaves non-causal output unchanged") {
  std::mt19937_64 rng(test::base_seed() + 2);
  for (Backend be : test::backends()) {
    for (int trial = 0; trial < 30; ++trial) {
      Case c = random_case(rng);
      AttentionOptions opt;
      opt.backend = be;
      std::vector<std::int64_t> perm(static_cast<std::size_t>(c.Sk));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      Buffer<double> k2 = c.k, v2 = c.v;
      k2.for_each([&](double& x, auto b, auto h, auto j, auto d) { x = c.k.at(b, h, perm[j], d); });
      v2.for_each([&](double& x, auto b, auto h, auto j, auto d) { x = c.v.at(b, h, perm[j], d); });
      const double err = test::max_abs_diff(run(c, c.k, c.v, opt), run(c, k2, v2, opt));
      CHECK(err <= slack(be) * std::max(1.0, test::max_abs(c.v)));
    }
  }
}

TEST_CASE("changing future keys and values leaves causal rows unchanged (both alignments)") {
  std::mt19937_64 rng(test::base_seed() + 3);
  for (Backend be : test::backends()) {
    for (int trial = 0; trial < 30; ++trial) {
      Case c = random_case(rng);
      for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
        AttentionOptions opt;
        opt.backend = be;
        opt.causal = causal;
        // Changing key j changes only rows whose position i + offset < j.
        const std::int64_t offset = causal == Causal::top_left ? 0 : c.Sk - c.Sq;
        const std::int64_t j0 = std::uniform_int_distribution<std::int64_t>(0, c.Sk - 1)(rng);
        Buffer<double> k2 = c.k, v2 = c.v;
        k2.for_each([&](double& x, auto, auto, auto j, auto) { if (j >= j0) x = x * 3.0 + 1.0; });
        v2.for_each([&](double& x, auto, auto, auto j, auto) { if (j >= j0) x = -x + 5.0; });
        const Buffer<double> a = run(c, c.k, c.v, opt), b = run(c, k2, v2, opt);
        bool some_row_changed = false;
        for (std::int64_t bb = 0; bb < c.B; ++bb)
          for (std::int64_t h = 0; h < c.H; ++h)
            for (std::int64_t i = 0; i < c.Sq; ++i)
              for (std::int64_t d = 0; d < c.Dv; ++d) {
                if (i + offset < j0) CHECK(a.at(bb, h, i, d) == b.at(bb, h, i, d));
                else if (a.at(bb, h, i, d) != b.at(bb, h, i, d)) some_row_changed = true;
              }
        // The rows that do see the changed keys must notice (guards against a test that
        // compares two identical runs).
        if (j0 <= c.Sq - 1 + offset) CHECK(some_row_changed);
      }
    }
  }
}

TEST_CASE("grouped-query attention equals multi-head attention with K/V heads repeated") {
  std::mt19937_64 rng(test::base_seed() + 4);
  for (Backend be : test::backends()) {
    for (int trial = 0; trial < 30; ++trial) {
      const std::int64_t group = 1 + trial % 4;
      Case c = random_case(rng, group);
      AttentionOptions opt;
      opt.backend = be;
      opt.causal = static_cast<Causal>(trial % 3);
      Buffer<double> k2({c.B, c.H, c.Sk, c.D}), v2({c.B, c.H, c.Sk, c.Dv});
      k2.for_each([&](double& x, auto b, auto h, auto j, auto d) { x = c.k.at(b, h / group, j, d); });
      v2.for_each([&](double& x, auto b, auto h, auto j, auto d) { x = c.v.at(b, h / group, j, d); });
      const Buffer<double> gqa = run(c, c.k, c.v, opt), mha = run(c, k2, v2, opt);
      // Exact for the reference; the native kernels may group the rows of a GQA head group into
      // one product, which sums in another order, and onednn runs in f32.
      const double tol = be == Backend::reference ? 0.0 : slack(be) * std::max(1.0, test::max_abs(c.v));
      CHECK(test::max_abs_diff(gqa, mha) <= tol);
    }
  }
}

TEST_CASE("a fully masked row is zero (boolean mask, key length 0, additive -inf, window)") {
  std::mt19937_64 rng(test::base_seed() + 5);
  for (Backend be : test::backends()) {
    Case c = random_case(rng);
    c.B = 2;
    c.q = Buffer<double>({2, c.H, c.Sq, c.D});
    c.k = Buffer<double>({2, c.Hkv, c.Sk, c.D});
    c.v = Buffer<double>({2, c.Hkv, c.Sk, c.Dv});
    c.q.fill_normal(rng);
    c.k.fill_normal(rng);
    c.v.fill_normal(rng);
    AttentionOptions opt;
    opt.backend = be;

    SUBCASE("key length 0 in batch 1") {
      const std::int64_t L[] = {c.Sk, 0};
      opt.key_lengths = L;
      const Buffer<double> o = run(c, c.k, c.v, opt);
      for (std::int64_t h = 0; h < c.H; ++h)
        for (std::int64_t i = 0; i < c.Sq; ++i)
          for (std::int64_t d = 0; d < c.Dv; ++d) CHECK(o.at(1, h, i, d) == 0.0);
    }
    SUBCASE("boolean mask hides every key of query 0") {
      Buffer<std::uint8_t> m({1, 1, c.Sq, c.Sk});
      m.for_each([](std::uint8_t& x, auto, auto, auto i, auto) { x = i == 0 ? 0 : 1; });
      opt.mask = m.cview();
      const Buffer<double> o = run(c, c.k, c.v, opt);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t d = 0; d < c.Dv; ++d) CHECK(o.at(b, h, 0, d) == 0.0);
    }
    SUBCASE("additive mask of -inf on every key of query 0") {
      Buffer<float> m({1, 1, c.Sq, c.Sk});
      m.for_each([](float& x, auto, auto, auto i, auto) { x = i == 0 ? -INFINITY : 0.5f; });
      opt.mask = m.cview();
      const Buffer<double> o = run(c, c.k, c.v, opt);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t d = 0; d < c.Dv; ++d) CHECK(o.at(b, h, 0, d) == 0.0);
    }
    SUBCASE("a window entirely beyond the keys") {
      // Bottom-right offset Sk - Sq; with window (0, 0) query i sees key i + Sk - Sq only, so
      // queries before Sq - Sk see nothing.
      c.Sq = c.Sk + 2;
      c.q = Buffer<double>({2, c.H, c.Sq, c.D});
      c.q.fill_normal(rng);
      opt.window = Window{0, 0};
      const Buffer<double> o = run(c, c.k, c.v, opt);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t i = 0; i < 2; ++i)
            for (std::int64_t d = 0; d < c.Dv; ++d) CHECK(o.at(b, h, i, d) == 0.0);
    }
  }
}

TEST_CASE("a window wider than every query-key distance hides nothing, also with query offsets past Sq + Sk") {
  // The window's sides saturate (positions stay in range): with query offsets the distance from a
  // query to the keys can exceed Sq + Sk, and a saturation at Sq + Sk would hide keys.
  std::mt19937_64 rng(test::base_seed() + 77);
  const auto t = test::random_qkv<float>(rng, 2, 2, 1, 3, 10, 8);
  const std::vector<std::int64_t> offsets{12, 25};  // query positions 12..14 and 25..27, keys 0..9
  for (Backend backend : test::backends()) {
    CAPTURE_VALUE(backend_name(backend));
    AttentionOptions plain;
    plain.causal = Causal::top_left;
    plain.query_offsets = offsets;
    AttentionOptions wide = plain;
    wide.window = Window{40, 0};  // every key is within 28 of every query
    const auto a = test::run_attention<float>(backend, t.q, t.k, t.v, plain);
    const auto b = test::run_attention<float>(backend, t.q, t.k, t.v, wide);
    CHECK(test::max_abs_diff(a, b) == 0.0);
    AttentionOptions narrow = plain;
    narrow.window = Window{17, 0};  // batch 0 sees keys >= 12 - 17: all; batch 1 keys >= 8 (row 0)
    const auto c = test::run_attention<float>(backend, t.q, t.k, t.v, narrow);
    CHECK(c.at(0, 0, 0, 0) == a.at(0, 0, 0, 0));
    CHECK(c.at(1, 0, 0, 0) != a.at(1, 0, 0, 0));
  }
}
