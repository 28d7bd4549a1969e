// Bad arguments to attention(): each throws simdattn::Error naming the argument, and nothing is
// written to the output; an output adjacent to q is accepted (a regression).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;

namespace {

struct Fixture {
  std::vector<float> q = std::vector<float>(2 * 4 * 3 * 8, 0.5f);
  std::vector<float> k = std::vector<float>(2 * 2 * 5 * 8, 0.25f);
  std::vector<float> v = std::vector<float>(2 * 2 * 5 * 6, 1.0f);
  std::vector<float> o = std::vector<float>(2 * 4 * 3 * 6, 7.0f);
  ConstTensorView qv{q.data(), {2, 4, 3, 8}};
  ConstTensorView kv{k.data(), {2, 2, 5, 8}};
  ConstTensorView vv{v.data(), {2, 2, 5, 6}};
  TensorView ov{o.data(), {2, 4, 3, 6}};
  AttentionOptions opt;

  // Runs the call, requires an Error naming `argument` with `fragment` in its message, and
  // requires the output to be untouched.
  void expect_error(const std::string& argument, const std::string& fragment) {
    bool thrown = false;
    try {
      attention(qv, kv, vv, ov, opt);
    } catch (const Error& e) {
      thrown = true;
      CHECK(e.argument() == argument);
      CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    }
    CHECK_MESSAGE(thrown, "expected an Error naming " << argument);
    for (float x : o) REQUIRE(x == 7.0f);
  }

  // The same, and attention_output_shape (which sees only q, k and v) throws the same Error.
  void expect_shape_error(const std::string& argument, const std::string& fragment) {
    expect_error(argument, fragment);
    bool thrown = false;
    try {
      attention_output_shape(qv, kv, vv);
    } catch (const Error& e) {
      thrown = true;
      CHECK(e.argument() == argument);
      CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    }
    CHECK_MESSAGE(thrown, "attention_output_shape: expected an Error naming " << argument);
  }
};

}  // namespace

TEST_CASE("the fixture itself is valid") {
  Fixture f;
  attention(f.qv, f.kv, f.vv, f.ov, f.opt);
  CHECK(f.o[0] == doctest::Approx(1.0f));
}

TEST_CASE("shape errors name the argument and the shapes") {
  Fixture f;
  CHECK(attention_output_shape(f.qv, f.kv, f.vv) == Shape4{2, 4, 3, 6});
  SUBCASE("k batch") { f.kv.shape[0] = 1; f.expect_shape_error("k", "[1, 2, 5, 8]"); }
  SUBCASE("k head size") { f.kv.shape[3] = 7; f.expect_shape_error("k", "D=8"); }
  SUBCASE("H % Hkv") {
    std::vector<float> k3(2 * 3 * 5 * 8), v3(2 * 3 * 5 * 6);
    f.kv = ConstTensorView(k3.data(), {2, 3, 5, 8});
    f.vv = ConstTensorView(v3.data(), {2, 3, 5, 6});
    f.expect_shape_error("k", "not a multiple");
  }
  SUBCASE("v keys") { f.vv.shape[2] = 4; f.expect_shape_error("v", "Sk=5"); }
  SUBCASE("v heads") { f.vv.shape[1] = 1; f.expect_shape_error("v", "Hkv=2"); }
  SUBCASE("out shape") { f.ov.shape[3] = 8; f.expect_error("out", "[2, 4, 3, 6]"); }
  SUBCASE("zero heads") { f.qv.shape[1] = 0; f.expect_shape_error("q", "H >= 1"); }
  SUBCASE("zero head size") { f.qv.shape[3] = 0; f.kv.shape[3] = 0; f.expect_shape_error("q", "D >= 1"); }
  SUBCASE("negative size") { f.qv.shape[2] = -1; f.expect_shape_error("q", "negative size"); }
}

TEST_CASE("dtype errors") {
  Fixture f;
  std::vector<double> d(2 * 2 * 5 * 8);
  SUBCASE("k f64 with q f32") {
    f.kv = ConstTensorView(d.data(), {2, 2, 5, 8});
    f.expect_error("k", "differs from q's f32");
  }
  SUBCASE("q integer") {
    f.qv.dtype = DType::i32;
    f.expect_error("q", "dtype must be f32, f64, bf16 or f16, got i32");
  }
  SUBCASE("mask of an integer dtype other than u8") {
    std::vector<std::int32_t> m(15);
    f.opt.mask = ConstTensorView(m.data(), {1, 1, 3, 5});
    f.expect_error("options.mask", "dtype must be u8 (boolean: nonzero = attend) or f32, f64, bf16 or f16 (additive), got i32");
  }
}

TEST_CASE("stride, overlap and overflow errors") {
  Fixture f;
  SUBCASE("negative stride") { f.kv.strides[2] = -8; f.expect_error("k", "negative stride"); }
  SUBCASE("out aliases q") {
    std::vector<float> buf(2 * 4 * 3 * 8 + 2 * 4 * 3 * 6, 7.0f);
    f.qv = ConstTensorView(buf.data(), {2, 4, 3, 8});
    f.ov = TensorView(buf.data() + 10, {2, 4, 3, 6});
    bool thrown = false;
    try { attention(f.qv, f.kv, f.vv, f.ov, f.opt); } catch (const Error& e) {
      thrown = true;
      CHECK(e.argument() == "out");
      CHECK(std::string(e.what()).find("overlaps q") != std::string::npos);
    }
    CHECK(thrown);
  }
  SUBCASE("out overlaps itself") { f.ov.strides = {0, 18, 6, 1}; f.expect_error("out", "overlap"); }
  SUBCASE("out overlaps the mask") {
    f.opt.mask = ConstTensorView(f.o.data(), {1, 1, 3, 5});
    f.expect_error("out", "overlaps options.mask");
  }
  SUBCASE("size overflow") {
    f.kv.strides = {std::numeric_limits<std::int64_t>::max() / 2, 1, 1, 1};
    f.expect_error("k", "overflow");
  }
  SUBCASE("null data") { f.vv.data = nullptr; f.expect_error("v", "null"); }
}

TEST_CASE("option errors") {
  Fixture f;
  SUBCASE("mask with a shape but no data") {  // not silently left out
    f.opt.mask = ConstTensorView(static_cast<const void*>(nullptr), DType::u8, {1, 1, 3, 5});
    f.expect_error("options.mask", "null data");
  }
  SUBCASE("mask of dtype i64") {
    const std::vector<std::int64_t> m(3 * 5, 1);
    f.opt.mask = ConstTensorView(m.data(), {1, 1, 3, 5});
    f.expect_error("options.mask", "got i64");
  }
  SUBCASE("mask not broadcastable") {
    std::vector<float> m(2 * 3 * 5);
    f.opt.mask = ConstTensorView(m.data(), {2, 3, 1, 5});
    f.expect_error("options.mask", "not broadcastable to [B, H, Sq, Sk] = [2, 4, 3, 5]");
  }
  SUBCASE("key lengths count") {
    const std::int64_t L[] = {5};
    f.opt.key_lengths = L;
    f.expect_error("options.key_lengths", "expected 2 entries");
  }
  SUBCASE("key length out of range") {
    const std::int64_t L[] = {5, 6};
    f.opt.key_lengths = L;
    f.expect_error("options.key_lengths", "0 <= L <= Sk=5");
  }
  SUBCASE("window side below -1") { f.opt.window = Window{-2, 0}; f.expect_error("options.window", ">= 0"); }
  SUBCASE("scale not finite") {
    f.opt.scale = std::numeric_limits<double>::infinity();
    f.expect_error("options.scale", "finite");
  }
  SUBCASE("negative threads") { f.opt.threads = -1; f.expect_error("options.threads", ">= 0"); }
  SUBCASE("unknown causal") { f.opt.causal = static_cast<Causal>(9); f.expect_error("options.causal", "unknown"); }
}

TEST_CASE("empty problems are valid and write nothing") {
  // B = 0 and Sq = 0 have no output elements; Sk = 0 gives all-zero rows.
  std::vector<float> q(8, 1.f), o(6, 7.f);
  attention(ConstTensorView(q.data(), {0, 1, 1, 8}), ConstTensorView(q.data(), {0, 1, 1, 8}),
            ConstTensorView(q.data(), {0, 1, 1, 6}), TensorView(o.data(), {0, 1, 1, 6}));
  CHECK(o[0] == 7.f);
  float kdummy = 0.f;
  attention(ConstTensorView(q.data(), {1, 1, 1, 8}), ConstTensorView(&kdummy, {1, 1, 0, 8}),
            ConstTensorView(&kdummy, {1, 1, 0, 6}), TensorView(o.data(), {1, 1, 1, 6}));
  for (float x : o) CHECK(x == 0.f);
}

// A regression: issue 23's mutation run planted the bug this title names and the rest of the suite passed.
TEST_CASE("regression: out may touch q (adjacent in one buffer), sharing one element is an overlap") {
  const std::int64_t H = 2, S = 3, D = 4;
  const std::int64_t n = H * S * D;
  std::mt19937_64 rng(test::base_seed() + 72);
  std::vector<float> buf = test::normal(rng, std::size_t(2 * n + 1), 1.f);
  const std::vector<float> k = test::normal(rng, std::size_t(n), 1.f), v = test::normal(rng, std::size_t(n), 1.f);
  const ConstTensorView kv(k.data(), {1, H, S, D}), vv(v.data(), {1, H, S, D});
  std::vector<float> separate(static_cast<std::size_t>(n));
  attention(ConstTensorView(buf.data(), {1, H, S, D}), kv, vv, TensorView(separate.data(), {1, H, S, D}));
  // out starts right after q's last element: accepted, and the same result.
  CHECK_NOTHROW(attention(ConstTensorView(buf.data(), {1, H, S, D}), kv, vv, TensorView(buf.data() + n, {1, H, S, D})));
  CHECK(std::vector<float>(buf.begin() + n, buf.begin() + 2 * n) == separate);
  // out starts on q's last element: refused, naming out.
  CHECK_THROWS_WITH_AS(
      attention(ConstTensorView(buf.data(), {1, H, S, D}), kv, vv, TensorView(buf.data() + n - 1, {1, H, S, D})),
      doctest::Contains("overlaps q"), Error);
}
