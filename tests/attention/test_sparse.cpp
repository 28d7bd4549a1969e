// Sparse patterns (global tokens, block masks) on every backend against the reference backend
// given the equivalent dense boolean mask, built here from the definition in docs/design.md:
//   key j is visible to query i of batch b iff j < L[b] and
//     (j < G or 0 <= p < G)                              global key or global query, or
//     (block [i/bs, j/bs] listed, causal and window allow it)
//   with p = i + offset, offset = 0 for top_left, L[b] - Sq otherwise.
// And (a regression) bottom-right alignment with key lengths, no sparse pattern, against the same rule.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;
using test::Buffer;

namespace {

struct SparseCase {
  std::int64_t B, H, Hkv, Sq, Sk, D;
  Causal causal = Causal::none;
  std::optional<Window> window;
  std::vector<std::int64_t> lengths;  // empty: Sk
  std::int64_t G = 0, bs = 64;
  std::vector<std::uint8_t> blocks;  // [nbq, nbk]; empty: no block mask
  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "B=%lld H=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld causal=%d window=%lld,%lld L=%d G=%lld bs=%lld blocks=%d",
                  (long long)B, (long long)H, (long long)Hkv, (long long)Sq, (long long)Sk, (long long)D, int(causal),
                  window ? (long long)window->left : -2LL, window ? (long long)window->right : -2LL, int(!lengths.empty()),
                  (long long)G, (long long)bs, int(!blocks.empty()));
    return buf;
  }
};

// The dense [B, 1, Sq, Sk] boolean mask equivalent to the case's structure and sparse pattern.
Buffer<std::uint8_t> dense_mask(const SparseCase& c) {
  Buffer<std::uint8_t> m({c.B, 1, c.Sq, c.Sk});
  const std::int64_t nbk = (c.Sk + c.bs - 1) / c.bs;
  m.for_each([&](std::uint8_t& x, std::int64_t b, std::int64_t, std::int64_t i, std::int64_t j) {
    const std::int64_t L = c.lengths.empty() ? c.Sk : c.lengths[std::size_t(b)];
    const std::int64_t pos = i + (c.causal == Causal::top_left ? 0 : L - c.Sq);
    bool vis = true;
    if (!c.blocks.empty()) vis = c.blocks[std::size_t((i / c.bs) * nbk + j / c.bs)] != 0;
    if (c.causal != Causal::none && j > pos) vis = false;
    if (c.window && c.window->left >= 0 && j < pos - c.window->left) vis = false;
    if (c.window && c.window->right >= 0 && j > pos + c.window->right) vis = false;
    if (j < c.G || (pos >= 0 && pos < c.G)) vis = true;
    x = j < L && vis;
  });
  return m;
}

template <class T>
void check_sparse(const SparseCase& c, std::mt19937_64& rng) {
  const auto [q, k, v] = test::random_qkv<T>(rng, c.B, c.H, c.Hkv, c.Sq, c.Sk, c.D);
  const Buffer<std::uint8_t> dense = dense_mask(c);
  AttentionOptions want_opt;
  want_opt.mask = dense.cview();
  const Buffer<T> want = test::run_attention(Backend::reference, q, k, v, want_opt);

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window = c.window;
  if (!c.lengths.empty()) opt.key_lengths = c.lengths;
  opt.global_tokens = c.G;
  opt.block_size = c.bs;
  const std::int64_t nbq = (c.Sq + c.bs - 1) / c.bs, nbk = (c.Sk + c.bs - 1) / c.bs;
  if (!c.blocks.empty()) opt.block_mask = ConstTensorView(c.blocks.data(), DType::u8, {1, 1, nbq, nbk});
  for (Backend be : test::backends(sizeof(T) == 8)) {  // oneDNN has no f64
    const Buffer<T> out = test::run_attention(be, q, k, v, opt);
    CAPTURE(backend_name(be));
    CAPTURE(c.describe());
    CHECK(test::max_abs_diff(out, want) <= test::tolerance<T>(test::max_abs(v)));
  }
}

SparseCase random_case(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  SparseCase c;
  c.B = pick(1, 2);
  c.Hkv = pick(1, 2);
  c.H = c.Hkv * pick(1, 2);
  const bool big = pick(0, 3) == 0;  // crosses the native kernel's 96 x 128 tiles
  c.Sq = big ? pick(60, 300) : pick(1, 40);
  c.Sk = pick(0, 2) == 0 ? c.Sq : (big ? pick(60, 300) : pick(1, 40));
  c.D = std::int64_t{1} << pick(0, 5);
  c.causal = static_cast<Causal>(pick(0, 2));
  if (pick(0, 3) == 0) c.window = Window{pick(-1, 20), pick(-1, 20)};
  if (pick(0, 2) == 0)
    for (std::int64_t b = 0; b < c.B; ++b) c.lengths.push_back(pick(0, c.Sk));
  c.G = pick(0, 2) == 0 ? 0 : pick(1, 6);
  if (pick(0, 3) != 0) {
    const std::int64_t sizes[] = {1, 3, 7, 16, 33, 64, 100};
    c.bs = sizes[pick(0, 6)];
    const std::int64_t nbq = (c.Sq + c.bs - 1) / c.bs, nbk = (c.Sk + c.bs - 1) / c.bs;
    std::bernoulli_distribution listed(0.35);
    c.blocks.resize(std::size_t(nbq * nbk));
    for (auto& x : c.blocks) x = listed(rng);
    if (pick(0, 1) == 0) {  // a block row with nothing listed: its rows see only global keys
      const std::int64_t r = pick(0, nbq - 1);
      for (std::int64_t j = 0; j < nbk; ++j) c.blocks[std::size_t(r * nbk + j)] = 0;
    }
  }
  return c;
}

}  // namespace

TEST_CASE("sparse patterns equal the reference with the equivalent dense mask (random, every backend)" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 41);
  for (int trial = 0; trial < 200; ++trial) {
    const SparseCase c = random_case(rng);
    if (trial % 2) check_sparse<float>(c, rng);
    else check_sparse<double>(c, rng);
  }
}

TEST_CASE("sparse edge cases: whole rows hidden, block sizes that do not divide S, global beyond S") {
  std::mt19937_64 rng(test::base_seed() + 42);
  SparseCase c;
  c.B = 1, c.H = 2, c.Hkv = 1, c.Sq = 130, c.Sk = 130, c.D = 16;
  c.bs = 64;  // 130 = 2 * 64 + 2: a last block of two rows
  c.blocks = {1, 0, 0, /**/ 0, 0, 0, /**/ 0, 1, 1};  // block row 1 hides rows 64..127 entirely
  check_sparse<float>(c, rng);
  c.causal = Causal::top_left;
  check_sparse<float>(c, rng);
  c.G = 3;  // ...until global keys give them something to see
  check_sparse<float>(c, rng);
  c.G = 1000;  // everything global: dense attention
  check_sparse<double>(c, rng);
  c.G = 0;
  c.blocks.assign(9, 1);  // every block listed: the same as no block mask
  c.window = Window{10, 0};
  check_sparse<double>(c, rng);
}

TEST_CASE("an additive mask's NaN or +inf at keys a sparse pattern hides never reaches a row") {
  // f32 inputs with an f64 mask take the native kernel's element-by-element mask path.
  std::mt19937_64 rng(test::base_seed() + 43);
  const std::int64_t S = 40;
  const auto [q, k, v] = test::random_qkv<float>(rng, 1, 2, 2, S, S, 8);
  Buffer<double> m({1, 1, S, S});
  m.for_each([](double& x, auto, auto, auto i, auto j) { x = j > i ? (j % 2 ? NAN : INFINITY) : 0.25 * double(j % 3); });
  std::vector<std::uint8_t> blocks{1, 0, 1, 1, 1, 0, 0, 1, 1};  // bs 16: 3 x 3 blocks
  AttentionOptions opt;
  opt.causal = Causal::top_left;  // hides every NaN / +inf entry (j > i)
  opt.mask = m.cview();           // additive (f32); no global tokens: a global query would see them
  opt.block_size = 16;
  opt.block_mask = ConstTensorView(blocks.data(), DType::u8, {1, 1, 3, 3});
  const Buffer<float> ref = test::run_attention(Backend::reference, q, k, v, opt);
  for (float x : ref.data) REQUIRE(std::isfinite(x));
  for (Backend be : test::fast_backends()) {
    const Buffer<float> out = test::run_attention(be, q, k, v, opt);
    CAPTURE(backend_name(be));
    CHECK(test::max_abs_diff(out, ref) <= test::tolerance<float>(test::max_abs(v)));
  }
}

TEST_CASE("sparse options are validated") {
  Buffer<float> q({1, 1, 10, 4}), k({1, 1, 20, 4}), v({1, 1, 20, 4}), o({1, 1, 10, 4});
  AttentionOptions opt;
  opt.global_tokens = -1;
  CHECK_THROWS_WITH_AS(attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("options.global_tokens"), Error);
  opt.global_tokens = 0;
  std::vector<std::uint8_t> bm(6, 1);
  opt.block_size = 4;  // ceil(10/4) = 3, ceil(20/4) = 5: [1, 1, 3, 5] expected
  opt.block_mask = ConstTensorView(bm.data(), DType::u8, {1, 1, 2, 3});
  CHECK_THROWS_WITH_AS(attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("[1, 1, 3, 5]"), Error);
  opt.block_size = 0;
  CHECK_THROWS_WITH_AS(attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("options.block_size"), Error);
  const std::vector<float> fm(15, 1.f);
  opt.block_size = 4;
  opt.block_mask = ConstTensorView(fm.data(), {1, 1, 3, 5});
  CHECK_THROWS_WITH_AS(attention(q.cview(), k.cview(), v.cview(), o.view(), opt),
                       doctest::Contains("dtype u8"), Error);
}

// A regression: issue 23's mutation run planted the bug this title names and the rest of the suite passed.
TEST_CASE("regression: bottom-right alignment with key lengths: row i sees keys j < L[b] and j <= i + L[b] - Sq" *
          doctest::test_suite(test::every_isa)) {
  // The same call given as an explicit boolean mask built from the rule, on every backend.
  std::mt19937_64 rng(test::base_seed() + 73);
  const std::int64_t B = 3, H = 2, Sq = 4, Sk = 9, D = 8;
  const std::vector<std::int64_t> L = {9, 6, 3};  // full, shorter, shorter than Sq: row 0 sees none
  const std::vector<float> q = test::normal(rng, std::size_t(B * H * Sq * D), 1.f),
                           k = test::normal(rng, std::size_t(B * H * Sk * D), 1.f),
                           v = test::normal(rng, std::size_t(B * H * Sk * D), 1.f);
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
    CHECK(test::max_diff(got, want) <= 1e-5);
  }
  // Batch 2, row 0 (position 0 + 3 - 4 = -1) sees no key: zeros.
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t d = 0; d < D; ++d) CHECK(want[std::size_t(((2 * H + h) * Sq + 0) * D + d)] == 0.f);
}
