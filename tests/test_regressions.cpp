// Cases a mutation run showed the rest of the suite did not pin down (issue 23): each test here
// fails when the bug named in its title is planted.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

namespace {

std::vector<float> normal(std::mt19937_64& rng, std::size_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> x(n);
  for (auto& e : x) e = d(rng);
  return x;
}

// The largest |a - b| over two equal-sized buffers.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace

TEST_CASE("a large logit late in a long row rescales what earlier key blocks accumulated (online softmax)" *
          doctest::test_suite(test::every_isa)) {
  // Rows over ~8 key blocks; the scaled logits are N(0, ~0.1) except at the keys planted
  // below, 20 and then 45 above the rest: far past the online softmax's slack, so a kernel that
  // moved its running max without rescaling the output it had accumulated would keep the early
  // blocks' values at full weight.
  std::mt19937_64 rng(test::base_seed() + 71);
  const std::int64_t H = 2, Sq = 40, Sk = 1000, D = 16;  // Sq: past the decode path (few rows), on the fused kernel
  for (const std::vector<std::int64_t>& planted : {std::vector<std::int64_t>{999}, {300, 900}, {130, 520}}) {
    CAPTURE(planted.front());
    std::vector<float> q = normal(rng, std::size_t(H * Sq * D), 0.3f), k = normal(rng, std::size_t(H * Sk * D), 0.3f),
                       v = normal(rng, std::size_t(H * Sk * D), 1.f);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        float* qi = &q[std::size_t((h * Sq + i) * D)];
        for (std::int64_t d = 0; d < D; ++d) qi[d] = d == 0 ? 1.f : 0.f;  // score = k[j][0] / sqrt(D)
      }
    for (std::size_t n = 0; n < planted.size(); ++n)
      for (std::int64_t h = 0; h < H; ++h)
        k[std::size_t((h * Sk + planted[n]) * D)] = static_cast<float>((n == 0 ? 20.0 : 45.0) * std::sqrt(double(D)));
    std::vector<float> want(static_cast<std::size_t>(H * Sq * D)), got(want.size());
    const ConstTensorView qv(q.data(), {1, H, Sq, D}), kv(k.data(), {1, H, Sk, D}), vv(v.data(), {1, H, Sk, D});
    AttentionOptions ref;
    ref.backend = Backend::reference;
    attention(qv, kv, vv, TensorView(want.data(), {1, H, Sq, D}), ref);
    for (Backend b : test::fast_backends()) {
      CAPTURE(backend_name(b));
      AttentionOptions o;
      o.backend = b;
      attention(qv, kv, vv, TensorView(got.data(), {1, H, Sq, D}), o);
      CHECK(max_diff(got, want) <= 1e-5);
    }
    // The rows' weight sits on the last planted key: the output is (nearly) its value row.
    for (std::int64_t d = 0; d < D; ++d)
      CHECK(std::abs(want[std::size_t(d)] - v[std::size_t(planted.back() * D + d)]) <= 1e-5);
  }
}

TEST_CASE("out may touch q (adjacent in one buffer); sharing one element is an overlap") {
  const std::int64_t H = 2, S = 3, D = 4;
  const std::int64_t n = H * S * D;
  std::mt19937_64 rng(test::base_seed() + 72);
  std::vector<float> buf = normal(rng, std::size_t(2 * n + 1), 1.f);
  const std::vector<float> k = normal(rng, std::size_t(n), 1.f), v = normal(rng, std::size_t(n), 1.f);
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

TEST_CASE("the default scale is 1/sqrt(D), computed independently of the engine's reference") {
  // q = e0, k0 = 2 e0, k1 = 0: scores 2/sqrt(D) and 0, so with D = 4 the weights are
  // (e, 1) / (e + 1); v0 = 1, v1 = 0 makes the output e / (e + 1) in every column.
  const std::int64_t D = 4;
  std::vector<float> q(D, 0.f), k(2 * D, 0.f), v(2 * D, 0.f), out(D);
  q[0] = 1.f, k[0] = 2.f;
  for (std::int64_t d = 0; d < D; ++d) v[std::size_t(d)] = 1.f;
  const double e = std::exp(2.0 / std::sqrt(double(D)));
  for (Backend b : test::backends()) {
    CAPTURE(backend_name(b));
    AttentionOptions o;
    o.backend = b;
    attention(ConstTensorView(q.data(), {1, 1, 1, D}), ConstTensorView(k.data(), {1, 1, 2, D}),
              ConstTensorView(v.data(), {1, 1, 2, D}), TensorView(out.data(), {1, 1, 1, D}), o);
    for (float x : out) CHECK(std::abs(x - e / (e + 1)) <= 1e-6);
  }
}

TEST_CASE("bottom-right alignment with key lengths: row i sees keys j < L[b] and j <= i + L[b] - Sq" *
          doctest::test_suite(test::every_isa)) {
  // The same call given as an explicit boolean mask built from the rule, on every backend.
  std::mt19937_64 rng(test::base_seed() + 73);
  const std::int64_t B = 3, H = 2, Sq = 4, Sk = 9, D = 8;
  const std::vector<std::int64_t> L = {9, 6, 3};  // full, shorter, shorter than Sq: row 0 sees none
  const std::vector<float> q = normal(rng, std::size_t(B * H * Sq * D), 1.f),
                           k = normal(rng, std::size_t(B * H * Sk * D), 1.f),
                           v = normal(rng, std::size_t(B * H * Sk * D), 1.f);
  std::vector<std::uint8_t> mask(std::size_t(B * Sq * Sk));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < Sq; ++i)
      for (std::int64_t j = 0; j < Sk; ++j) mask[std::size_t((b * Sq + i) * Sk + j)] = j < L[b] && j <= i + L[b] - Sq;
  const ConstTensorView qv(q.data(), {B, H, Sq, D}), kv(k.data(), {B, H, Sk, D}), vv(v.data(), {B, H, Sk, D});
  std::vector<float> want(static_cast<std::size_t>(B * H * Sq * D)), got(want.size());
  AttentionOptions explicit_mask;
  explicit_mask.backend = Backend::reference;
  explicit_mask.mask = ConstTensorView(mask.data(), {B, 1, Sq, Sk});
  attention(qv, kv, vv, TensorView(want.data(), {B, H, Sq, D}), explicit_mask);
  for (Backend b : test::backends()) {
    CAPTURE(backend_name(b));
    AttentionOptions o;
    o.backend = b;
    o.causal = Causal::bottom_right;
    o.key_lengths = L;
    attention(qv, kv, vv, TensorView(got.data(), {B, H, Sq, D}), o);
    CHECK(max_diff(got, want) <= 1e-5);
  }
  // Batch 2, row 0 (position 0 + 3 - 4 = -1) sees no key: zeros.
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t d = 0; d < D; ++d) CHECK(want[std::size_t(((2 * H + h) * Sq + 0) * D + d)] == 0.f);
}

TEST_CASE("KV cache: a step that exactly fills the capacity succeeds; one token more is refused") {
  std::mt19937_64 rng(test::base_seed() + 74);
  const std::int64_t d = 8;
  MhaWeights<float> w;
  w.wq = normal(rng, std::size_t(d * d), 0.3f), w.wk = normal(rng, std::size_t(d * d), 0.3f);
  w.wv = normal(rng, std::size_t(d * d), 0.3f), w.wo = normal(rng, std::size_t(d * d), 0.3f);
  const MultiHeadAttention layer(MhaConfig{.d_model = d, .heads = 2}, w);
  const std::vector<float> x = normal(rng, std::size_t(4 * d), 1.f);
  std::vector<float> y(x.size());
  // First, two sequences, the first full and the second not: a step is refused for the first.
  // (Were the bound off by one, the first sequence's extra row would land inside the cache, in
  // the next head's first row: this REQUIRE then ends the case with a failed assertion before
  // the single-sequence steps below would write past the buffer.)
  KvCache two(layer, 2, 4);
  std::vector<float> x2(static_cast<std::size_t>(2 * 4 * d)), y2(x2.size());
  for (std::size_t i = 0; i < x2.size(); ++i) x2[i] = x[i % x.size()];
  layer.forward(ConstSeqView(x2.data(), 2, 4, d), two, SeqView(y2.data(), 2, 4, d));
  two.truncate(1, 2);
  REQUIRE_THROWS_WITH_AS(layer.forward(ConstSeqView(x2.data(), 2, 1, d), two, SeqView(y2.data(), 2, 1, d)),
                         doctest::Contains("capacity"), Error);
  CHECK(two.lengths()[0] == 4);
  CHECK(two.lengths()[1] == 2);
  for (std::int64_t first : {4, 3}) {  // one step of 4 tokens, or 3 then 1
    CAPTURE(first);
    KvCache cache(layer, 1, 4);
    CHECK_NOTHROW(layer.forward(ConstSeqView(x.data(), 1, first, d), cache, SeqView(y.data(), 1, first, d)));
    if (first < 4)
      CHECK_NOTHROW(layer.forward(ConstSeqView(x.data(), 1, 4 - first, d), cache, SeqView(y.data(), 1, 4 - first, d)));
    CHECK(cache.lengths()[0] == 4);
    CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, 1, d), cache, SeqView(y.data(), 1, 1, d)),
                         doctest::Contains("capacity"), Error);
    CHECK(cache.lengths()[0] == 4);
  }
}

TEST_CASE("no keys at all (Sk = 0) in every dtype: zeros, no crash (found by fuzz_attention: a division by zero on AMX)") {
  const std::int64_t B = 1, H = 2, Sq = 20, D = 8;
  const std::vector<float> qf(static_cast<std::size_t>(B * H * Sq * D), 0.5f);
  const std::vector<bfloat16> qb(qf.size(), to_bfloat16(0.5f));
  const std::vector<float16> qh(qf.size(), to_float16(0.5f));
  const float no_key = 0.f;
  for (Backend b : test::backends()) {
    CAPTURE(backend_name(b));
    AttentionOptions o;
    o.backend = b;
    std::vector<float> of(qf.size(), -7.f);
    attention(ConstTensorView(qf.data(), {B, H, Sq, D}), ConstTensorView(&no_key, {B, H, 0, D}),
              ConstTensorView(&no_key, {B, H, 0, D}), TensorView(of.data(), {B, H, Sq, D}), o);
    for (float x : of) CHECK(x == 0.f);
    auto half = [&](const auto& q, auto sentinel) {  // bf16 or f16, where the backend takes it
      using H16 = decltype(sentinel);
      if (!backend_takes(b, dtype_of<H16>())) return;
      std::vector<H16> out(q.size(), sentinel);
      const H16 nk{};
      attention(ConstTensorView(q.data(), {B, H, Sq, D}), ConstTensorView(&nk, {B, H, 0, D}),
                ConstTensorView(&nk, {B, H, 0, D}), TensorView(out.data(), {B, H, Sq, D}), o);
      for (H16 x : out) CHECK(to_float(x) == 0.f);
    };
    half(qb, to_bfloat16(-7.f));
    half(qh, to_float16(-7.f));
  }
}
