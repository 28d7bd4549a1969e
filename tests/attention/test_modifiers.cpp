// The score modifiers (softcap, ALiBi, T5's relative bias, sinks, lse, explicit query offsets):
// the helpers against hand-computed values, each modifier alone and combined with the others
// and with causal, windows, key lengths, masks, grouped heads and sparse patterns, native
// against the reference in every dtype; lse merging two halves of a key range; the validation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

TEST_CASE("standard ALiBi slopes: powers of two and the heads between (BLOOM's rule)") {
  const std::vector<float> s8 = standard_alibi_slopes(8);
  REQUIRE(s8.size() == 8);
  for (int k = 1; k <= 8; ++k) CHECK(s8[k - 1] == std::ldexp(1.0f, -k));  // 2^(-8k/8)
  const std::vector<float> s12 = standard_alibi_slopes(12);
  REQUIRE(s12.size() == 12);
  for (int k = 1; k <= 8; ++k) CHECK(s12[k - 1] == s8[k - 1]);
  // the four extra heads: 2^(-4k/8) for k = 1, 3, 5, 7
  for (int e = 0; e < 4; ++e) CHECK(s12[8 + e] == doctest::Approx(std::exp2(-0.5 * (2 * e + 1))).epsilon(1e-6));
  const std::vector<float> s1 = standard_alibi_slopes(1);
  REQUIRE(s1.size() == 1);
  CHECK(s1[0] == std::ldexp(1.0f, -8));
  const std::vector<float> s3 = standard_alibi_slopes(3);  // 2^-4, 2^-8, then 2^-2
  REQUIRE(s3.size() == 3);
  CHECK(s3[0] == 0.0625f);
  CHECK(s3[1] == std::ldexp(1.0f, -8));
  CHECK(s3[2] == 0.25f);
  CHECK_THROWS_AS(standard_alibi_slopes(0), Error);
}

TEST_CASE("T5's relative position buckets: exact, logarithmic and saturated, both directions") {
  // bidirectional, 32 buckets, max distance 128: 16 per side, 8 exact
  CHECK(t5_relative_bucket(0, true, 32, 128) == 0);
  CHECK(t5_relative_bucket(-1, true, 32, 128) == 1);
  CHECK(t5_relative_bucket(1, true, 32, 128) == 17);
  CHECK(t5_relative_bucket(-7, true, 32, 128) == 7);
  CHECK(t5_relative_bucket(-8, true, 32, 128) == 8);    // log(1) = 0
  CHECK(t5_relative_bucket(-12, true, 32, 128) == 9);   // 8 + floor(log(1.5) / log(16) * 8) = 8 + 1
  CHECK(t5_relative_bucket(-127, true, 32, 128) == 15); // 8 + floor(7.977)
  CHECK(t5_relative_bucket(-128, true, 32, 128) == 15); // 8 + 8, capped at 15
  CHECK(t5_relative_bucket(200, true, 32, 128) == 31);
  // one way (a decoder): keys after the query share bucket 0; 16 exact
  CHECK(t5_relative_bucket(5, false, 32, 128) == 0);
  CHECK(t5_relative_bucket(-5, false, 32, 128) == 5);
  CHECK(t5_relative_bucket(-16, false, 32, 128) == 16);
  CHECK(t5_relative_bucket(-127, false, 32, 128) == 31);  // 16 + floor(15.94)
  CHECK(t5_relative_bucket(-1000, false, 32, 128) == 31);
  CHECK_THROWS_AS(t5_relative_bucket(0, true, 2, 128), Error);
  CHECK_THROWS_AS(t5_relative_bucket(0, true, 32, 8), Error);
}

namespace {

// A backend's lse against the reference's: infinities at the same rows, else within the dtype's
// relative tolerance (f64 1e-6, f32 1e-5, 16-bit 2e-2).
template <class T>
void check_lse(test::Buffer<float>& lse_ref, const test::Buffer<float>& lse_nat) {
  double worst = 0;
  bool same_inf = true;
  lse_ref.for_each([&](float& x, auto b, auto h, auto i, auto) {
    const float y = lse_nat.at(b, h, i, 0);
    if (std::isinf(x) || std::isinf(y)) same_inf = same_inf && x == y;
    else worst = std::max(worst, std::fabs(double(x) - double(y)) / (1.0 + std::fabs(double(x))));
  });
  CHECK(same_inf);
  CHECK(worst <= (std::is_same_v<T, double> ? 1e-6 : std::is_same_v<T, float> ? 1e-5 : 2e-2));
}

// One random configuration of the modifiers and the existing options, for dtype T.
template <class T>
void check_modified(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  const std::int64_t Hkv = 1 + n % 2, H = Hkv * (1 + (n / 2) % 3), B = 1 + n % 2;
  const std::int64_t Sq = 1 + pick(rng) % 150, Sk = 1 + pick(rng) % 300, D = 8 * (1 + pick(rng) % 10);
  test::Qkv<T> t = test::random_qkv<T>(rng, B, H, Hkv, Sq, Sk, D);
  const int mods = 1 + n % 31;  // a nonempty subset of softcap, ALiBi, T5, sinks, lse
  AttentionOptions opt;
  std::vector<float> slopes = standard_alibi_slopes(H), sinks(static_cast<std::size_t>(H));
  for (auto& s : sinks) s = static_cast<float>(std::normal_distribution<double>(0.0, 2.0)(rng));
  test::Buffer<float> table({1, 1, 32, H});
  table.fill_normal(rng, 2.0);
  if (mods & 1) opt.softcap = 1.0 + pick(rng) % 30;
  if (mods & 2) opt.alibi_slopes = slopes;
  if (mods & 4) opt.relative_bias = RelativePositionBias{table.cview(), n % 3 != 0, 20 + pick(rng) % 100};
  if (mods & 8) opt.sinks = sinks;
  test::Buffer<float> lse_ref({B, H, Sq, 1}), lse_nat({B, H, Sq, 1});
  // the existing options, in turn
  const int extra = (n / 3) % 7;
  std::vector<std::int64_t> lengths, offsets;
  test::Buffer<float> mask({1, 1, Sq, Sk});
  mask.for_each([&](float& x, auto, auto, auto i, auto j) { x = (i * 5 + j * 3) % 13 == 0 ? -INFINITY : 0.05f * float(j % 7); });
  if (extra == 1) opt.causal = Causal::bottom_right;
  if (extra == 2) opt.window = Window{1 + pick(rng) % 40, pick(rng) % 5};
  if (extra == 3) {
    for (std::int64_t b = 0; b < B; ++b) lengths.push_back(pick(rng) % (Sk + 1));
    opt.key_lengths = lengths;
    opt.causal = Causal::top_left;
  }
  if (extra == 4) opt.mask = mask.cview();
  if (extra == 5) {
    for (std::int64_t b = 0; b < B; ++b) offsets.push_back(pick(rng) % (Sk + 10) - 5);
    opt.query_offsets = offsets;
    opt.causal = Causal::top_left;
  }
  if (extra == 6) opt.global_tokens = 3, opt.window = Window{10, 0};
  CAPTURE(n);
  CAPTURE(B);
  CAPTURE(H);
  CAPTURE(Hkv);
  CAPTURE(Sq);
  CAPTURE(Sk);
  CAPTURE(D);
  CAPTURE(mods);
  CAPTURE(extra);
  AttentionOptions ro = opt;
  if (mods & 16) ro.lse = lse_ref.view();
  const test::Buffer<T> ref = test::run_attention(Backend::reference, t.q, t.k, t.v, ro);
  // One backend's output and (asked for) lse against the reference's.
  auto check = [&](Backend be, int threads) {
    AttentionOptions o = opt;
    o.threads = threads;
    if (mods & 16) o.lse = lse_nat.view();
    const test::Buffer<T> out = test::run_attention(be, t.q, t.k, t.v, o);
    CHECK(test::max_abs_diff(out, ref) <= test::tolerance<T>(test::max_abs(t.v)));
    if (mods & 16) {
      check_lse<T>(lse_ref, lse_nat);
    }
  };
  for (int threads : {1, 2}) check(Backend::native, threads);
  // onednn: the softcap as post-ops, ALiBi and T5's bias in its mask, sinks and lse from a pass
  // over the scores
  if (backend_takes(Backend::onednn, dtype_of<T>())) check(Backend::onednn, 0);
}

}  // namespace

TEST_CASE("score modifiers alone and combined with causal, windows, key lengths, masks, offsets, grouped heads and "
          "sparse patterns: native and onednn equal the reference in every dtype they take, lse too" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 90);
  for (int n = 0; n < 60; ++n) {
    check_modified<float>(rng, n);
    check_modified<double>(rng, n);
    check_modified<bfloat16>(rng, n);
    check_modified<float16>(rng, n);
  }
}

TEST_CASE("the reference's modifiers against the contract written out in double for one row") {
  // B = H = 1, Sq = 1 at position 5 (offset), Sk = 9: softcap 2, ALiBi slope 0.5, T5 table, sink
  const std::int64_t Sk = 9, D = 4;
  test::Buffer<double> q({1, 1, 1, D}), k({1, 1, Sk, D}), v({1, 1, Sk, 1});
  std::mt19937_64 rng(test::base_seed() + 91);
  q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng);
  test::Buffer<float> table({1, 1, 8, 1});
  table.fill_normal(rng);
  const std::vector<float> slope{0.5f}, sink{0.75f};
  const std::vector<std::int64_t> offset{5};
  AttentionOptions opt;
  opt.scale = 0.7;
  opt.softcap = 2.0;
  opt.alibi_slopes = slope;
  opt.relative_bias = RelativePositionBias{table.cview(), true, 16};
  opt.sinks = sink;
  opt.query_offsets = offset;
  test::Buffer<float> lse({1, 1, 1, 1});
  opt.lse = lse.view();
  const test::Buffer<double> out = test::run_attention(Backend::reference, q, k, v, opt);
  std::vector<double> s(static_cast<std::size_t>(Sk));
  double m = 0.75;
  for (std::int64_t j = 0; j < Sk; ++j) {
    double dot = 0;
    for (std::int64_t d = 0; d < D; ++d) dot += q.at(0, 0, 0, d) * k.at(0, 0, j, d);
    const std::int64_t rel = j - 5;
    s[j] = 2.0 * std::tanh(0.7 * dot / 2.0) + 0.5 * double(rel) +
           double(table.at(0, 0, t5_relative_bucket(rel, true, 8, 16), 0));
    m = std::max(m, s[j]);
  }
  double sum = std::exp(0.75 - m), acc = 0;
  for (std::int64_t j = 0; j < Sk; ++j) sum += std::exp(s[j] - m), acc += std::exp(s[j] - m) * v.at(0, 0, j, 0);
  CHECK(out.at(0, 0, 0, 0) == doctest::Approx(acc / sum).epsilon(1e-12));
  CHECK(lse.at(0, 0, 0, 0) == doctest::Approx(m + std::log(sum)).epsilon(1e-6));
}

TEST_CASE("lse: attention over two halves of the keys merges into the whole (native and reference)") {
  std::mt19937_64 rng(test::base_seed() + 92);
  const std::int64_t B = 2, H = 3, Sq = 37, Sk = 200, D = 32, half = 90;
  for (Backend be : {Backend::reference, Backend::native}) {
    test::Qkv<double> t = test::random_qkv<double>(rng, B, H, H, Sq, Sk, D);
    auto slice = [&](const test::Buffer<double>& a, std::int64_t j0, std::int64_t j1) {
      test::Buffer<double> r({a.shape[0], a.shape[1], j1 - j0, a.shape[3]});
      r.for_each([&](double& x, auto b, auto h, auto j, auto d) { x = a.at(b, h, j0 + j, d); });
      return r;
    };
    const std::vector<float> slopes = standard_alibi_slopes(H);
    AttentionOptions opt;
    opt.alibi_slopes = slopes;  // positions matter: each half gets its query positions by offset
    test::Buffer<float> l1({B, H, Sq, 1}), l2({B, H, Sq, 1});
    // whole: queries at positions 0 .. Sq-1 (top-left offsets 0, no causal)
    const std::vector<std::int64_t> zero(B, 0), shifted(B, -half);
    opt.query_offsets = zero;
    test::Buffer<double> whole = test::run_attention(be, t.q, t.k, t.v, opt);
    opt.lse = l1.view();
    const test::Buffer<double> a = test::run_attention(be, t.q, slice(t.k, 0, half), slice(t.v, 0, half), opt);
    opt.lse = l2.view();
    opt.query_offsets = shifted;  // keys half.. are keys 0.. of the second call
    const test::Buffer<double> b = test::run_attention(be, t.q, slice(t.k, half, Sk), slice(t.v, half, Sk), opt);
    double worst = 0;
    whole.for_each([&](double& w, auto bb, auto h, auto i, auto d) {
      const double x = l1.at(bb, h, i, 0), y = l2.at(bb, h, i, 0), m = std::max(x, y);
      const double wa = std::exp(x - m), wb = std::exp(y - m);
      const double merged = (wa * a.at(bb, h, i, d) + wb * b.at(bb, h, i, d)) / (wa + wb);
      worst = std::max(worst, std::fabs(merged - w));
    });
    CAPTURE(backend_name(be));
    CHECK(worst <= 1e-6);  // lse is f32
  }
}

TEST_CASE("a fully masked row with a sink outputs zeros and lse = sink, without one lse = -inf") {
  std::mt19937_64 rng(test::base_seed() + 93);
  test::Qkv<float> t = test::random_qkv<float>(rng, 1, 2, 2, 4, 6, 8);
  const std::vector<std::int64_t> lengths{0};
  const std::vector<float> sinks{1.5f, -2.0f};
  for (Backend be : {Backend::reference, Backend::native}) {
    for (bool with_sink : {true, false}) {
      AttentionOptions opt;
      opt.key_lengths = lengths;
      if (with_sink) opt.sinks = sinks;
      test::Buffer<float> lse({1, 2, 4, 1});
      opt.lse = lse.view();
      const test::Buffer<float> out = test::run_attention(be, t.q, t.k, t.v, opt);
      for (float x : out.data) CHECK(x == 0.0f);
      lse.for_each([&](float& x, auto, auto h, auto, auto) {
        if (with_sink) CHECK(x == sinks[static_cast<std::size_t>(h)]);
        else CHECK(x == -std::numeric_limits<float>::infinity());
      });
    }
  }
}

TEST_CASE("score modifier arguments are validated and named, nothing written") {
  std::mt19937_64 rng(test::base_seed() + 94);
  test::Qkv<float> t = test::random_qkv<float>(rng, 2, 4, 2, 5, 7, 8);
  auto expect_error = [&](const AttentionOptions& opt, const std::string& name) {
    test::Buffer<float> out({2, 4, 5, 8});
    for (auto& x : out.data) x = 42.0f;
    bool thrown = false;
    try {
      attention(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), opt);
    } catch (const Error& e) {
      thrown = true;
      CHECK_MESSAGE(std::string(e.what()).find(name) != std::string::npos, e.what());
    }
    CHECK_MESSAGE(thrown, "expected an Error naming " << name);
    for (float x : out.data) CHECK(x == 42.0f);
  };
  const std::vector<float> three{1, 2, 3}, four{1, 2, 3, 4}, bad{1, NAN, 3, 4};
  const std::vector<std::int64_t> one_offset{1}, huge{0, std::int64_t{1} << 50};
  AttentionOptions o;
  o.softcap = 0.0;
  expect_error(o, "options.softcap");
  o = {};
  o.softcap = INFINITY;
  expect_error(o, "options.softcap");
  o = {};
  o.alibi_slopes = three;
  expect_error(o, "options.alibi_slopes");
  o = {};
  o.sinks = bad;
  expect_error(o, "options.sinks");
  o = {};
  o.query_offsets = one_offset;
  expect_error(o, "options.query_offsets");
  o = {};
  o.query_offsets = huge;
  expect_error(o, "options.query_offsets");
  test::Buffer<float> table({1, 1, 32, 3});  // H = 4 expected
  o = {};
  o.relative_bias = RelativePositionBias{table.cview(), true, 128};
  expect_error(o, "options.relative_bias.table");
  test::Buffer<float> table4({1, 1, 32, 4});
  o = {};
  o.relative_bias = RelativePositionBias{table4.cview(), true, 8};
  expect_error(o, "options.relative_bias.max_distance");
  test::Buffer<float> lse_bad({2, 4, 5, 2});
  o = {};
  o.lse = lse_bad.view();
  expect_error(o, "options.lse");
  test::Buffer<double> lse_f64({2, 4, 5, 1});
  o = {};
  o.lse = lse_f64.view();
  expect_error(o, "options.lse");
  o = {};
  o.lse = TensorView(t.q.data.data(), Shape4{2, 4, 5, 1}, Shape4{20, 5, 1, 1});  // over q
  expect_error(o, "options.lse");
  if (backend_takes(Backend::onednn, DType::f64) == false && backend_available(Backend::onednn)) {
    o = {};
    o.backend = Backend::onednn;
    o.sinks = bad;  // validated before the backend runs, whichever it is
    expect_error(o, "options.sinks");
  }
}

TEST_CASE("the scores output at every stage: scaled, capped, biased (hidden keys -inf), softmax (weights that give "
          "the output), the output unchanged, every backend") {
  std::mt19937_64 rng(test::base_seed() + 95);
  const std::int64_t B = 2, H = 2, Sq = 5, Sk = 7, D = 8;
  test::Qkv<double> t = test::random_qkv<double>(rng, B, H, 1, Sq, Sk, D);
  const std::vector<float> slopes{0.25f, 0.5f}, sinks{0.3f, -1.0f};
  const std::vector<std::int64_t> lengths{7, 4};
  test::Buffer<float> table({1, 1, 8, H}), mask({1, 1, Sq, Sk});
  table.fill_normal(rng);
  mask.for_each([&](float& x, auto, auto, auto i, auto j) { x = 0.1f * float((i + 2 * j) % 3); });
  AttentionOptions opt;
  opt.causal = Causal::bottom_right;
  opt.key_lengths = lengths;
  opt.softcap = 1.5;
  opt.alibi_slopes = slopes;
  opt.relative_bias = RelativePositionBias{table.cview(), false, 16};
  opt.mask = mask.cview();
  opt.sinks = sinks;
  const double scale = 1.0 / std::sqrt(double(D));
  for (Backend be : test::backends(true)) {
    if (be == Backend::onednn) continue;  // (refuses the modifiers)
    const test::Buffer<double> plain = test::run_attention(be, t.q, t.k, t.v, opt);
    for (ScoreStage stage : {ScoreStage::scaled, ScoreStage::capped, ScoreStage::biased, ScoreStage::softmax}) {
      CAPTURE(backend_name(be));
      CAPTURE(score_stage_name(stage));
      test::Buffer<double> sc({B, H, Sq, Sk});
      AttentionOptions o = opt;
      o.scores = sc.view();
      o.scores_stage = stage;
      const test::Buffer<double> out = test::run_attention(be, t.q, t.k, t.v, o);
      CHECK(test::max_abs_diff(out, plain) == 0.0);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < Sq; ++i) {
            const std::int64_t p = i + lengths[b] - Sq;  // bottom-right
            std::vector<double> biased(Sk);
            for (std::int64_t j = 0; j < Sk; ++j) {
              double dot = 0;
              for (std::int64_t d = 0; d < D; ++d) dot += t.q.at(b, h, i, d) * t.k.at(b, 0, j, d);
              const double scaled = scale * dot, capped = 1.5 * std::tanh(scaled / 1.5);
              const bool visible = j < lengths[b] && j <= p;
              biased[j] = visible ? capped + slopes[h] * double(j - p) +
                                        table.at(0, 0, t5_relative_bucket(j - p, false, 8, 16), h) + mask.at(0, 0, i, j)
                                  : -INFINITY;
              if (stage == ScoreStage::scaled) CHECK(sc.at(b, h, i, j) == doctest::Approx(scaled).epsilon(1e-12));
              if (stage == ScoreStage::capped) CHECK(sc.at(b, h, i, j) == doctest::Approx(capped).epsilon(1e-12));
              if (stage == ScoreStage::biased) {
                if (visible) CHECK(sc.at(b, h, i, j) == doctest::Approx(biased[j]).epsilon(1e-12));
                else CHECK(sc.at(b, h, i, j) == -INFINITY);
              }
            }
            if (stage != ScoreStage::softmax) continue;
            double m = sinks[h];
            for (double x : biased) m = std::max(m, x);
            double sum = std::exp(sinks[h] - m);
            for (double x : biased) sum += std::exp(x - m);
            double o_want = 0;
            for (std::int64_t j = 0; j < Sk; ++j) {
              CHECK(sc.at(b, h, i, j) == doctest::Approx(std::exp(biased[j] - m) / sum).epsilon(1e-12));
              o_want += sc.at(b, h, i, j) * t.v.at(b, 0, j, 0);
            }
            CHECK(out.at(b, h, i, 0) == doctest::Approx(o_want).epsilon(1e-9));
          }
    }
  }
  // validation: shape, dtype, overlap with out, nothing written
  test::Buffer<double> out({B, H, Sq, D});
  for (auto& x : out.data) x = 42.0;
  test::Buffer<double> wrong({B, H, Sq, Sk + 1});
  test::Buffer<std::uint8_t> u8({B, H, Sq, Sk});
  AttentionOptions bad;
  bad.scores = wrong.view();
  CHECK_THROWS_WITH_AS(attention(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), bad), doctest::Contains("options.scores"), Error);
  bad.scores = u8.view();
  CHECK_THROWS_WITH_AS(attention(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), bad), doctest::Contains("options.scores"), Error);
  bad.scores = TensorView(out.data.data(), Shape4{B, H, Sq, Sk}, Shape4{H * Sq * Sk, Sq * Sk, Sk, 1});
  CHECK_THROWS_WITH_AS(attention(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), bad), doctest::Contains("options.scores"), Error);
  for (double x : out.data) CHECK(x == 42.0);
}

namespace {

// A decode-shaped call (few query rows per kv head: the decode paths) with sinks and/or lse,
// native against the reference, in dtype T (and, code != f32, with K and V as 8-bit codes).
template <class T>
void check_decode_finish(std::mt19937_64& rng, int n, DType code) {
  const std::int64_t Hkv = 1 + n % 2, H = Hkv * (1 + n % 4), B = 1 + n % 2, Sq = 1 + n % 2;
  const std::int64_t Sk = 1 + static_cast<std::int64_t>(rng() % 700), D = 16 * (1 + n % 4);
  test::Qkv<T> t = test::random_qkv<T>(rng, B, H, Hkv, Sq, Sk, D);
  std::vector<float> sinks(static_cast<std::size_t>(H));
  for (auto& s : sinks) s = static_cast<float>(std::normal_distribution<double>(0.0, 2.0)(rng));
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < B; ++b) lengths.push_back(static_cast<std::int64_t>(rng() % (Sk + 1)));  // 0 too
  AttentionOptions opt;
  if (n % 3 != 1) opt.sinks = sinks;
  opt.causal = Causal::bottom_right;
  if (n % 2 == 0) opt.key_lengths = lengths;
  test::Buffer<float> lse_ref({B, H, Sq, 1}), lse_nat({B, H, Sq, 1});
  const bool want_lse = n % 3 != 0;
  // 8-bit codes: the same codes and scales for both backends
  test::Buffer<std::uint8_t> kc({B, Hkv, Sk, D}), vc({B, Hkv, Sk, D});
  test::Buffer<float> ks({B, Hkv, Sk, 1}), vs({B, Hkv, Sk, 1});
  ConstTensorView k = t.k.cview(), v = t.v.cview();
  if (code != DType::f32) {
    quantize_kv(t.k.cview(), code, TensorView(kc.data.data(), code, kc.shape), ks.view());
    quantize_kv(t.v.cview(), code, TensorView(vc.data.data(), code, vc.shape), vs.view());
    k = ConstTensorView(kc.data.data(), code, kc.shape);
    v = ConstTensorView(vc.data.data(), code, vc.shape);
    opt.k_scale = ks.cview();
    opt.v_scale = vs.cview();
  }
  CAPTURE(n);
  CAPTURE(Sk);
  CAPTURE_VALUE(dtype_name(code));
  auto run = [&](Backend be, test::Buffer<float>& lse) {
    AttentionOptions o = opt;
    o.backend = be;
    if (want_lse) o.lse = lse.view();
    test::Buffer<T> out({B, H, Sq, D});
    attention(t.q.cview(), k, v, out.view(), o);
    return out;
  };
  const test::Buffer<T> ref = run(Backend::reference, lse_ref), nat = run(Backend::native, lse_nat);
  CHECK(test::max_abs_diff(nat, ref) <= test::tolerance<T>(test::max_abs(t.v)));
  if (want_lse) {
    check_lse<T>(lse_ref, lse_nat);
  }
}

}  // namespace

TEST_CASE("sinks and lse on the decode paths: f32, f64, bf16, f16 and 8-bit K/V against the reference" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 91);
  for (int n = 0; n < 24; ++n) {
    check_decode_finish<float>(rng, n, DType::f32);
    check_decode_finish<double>(rng, n, DType::f32);
    check_decode_finish<bfloat16>(rng, n, DType::f32);
    check_decode_finish<float16>(rng, n, DType::f32);
    check_decode_finish<float>(rng, n, DType::int8);
    check_decode_finish<bfloat16>(rng, n, DType::fp8_e4m3);
  }
}
