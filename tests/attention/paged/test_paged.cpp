// attention_paged(): against attention() on each sequence's gathered keys (the reference backend,
// float64 sums), for shuffled and shared block tables, block sizes that do and do not divide the
// lengths, mixed query lengths, GQA and every option, in f32, bf16 and f16; bitwise identical at
// 1, 2 and 3 threads; every malformed argument named before anything is written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/test_util.hpp"

namespace simdattn::test {
namespace {

struct PagedShape {
  std::int64_t H = 4, Hkv = 2, D = 32, Dv = 32, block_size = 16;
  std::vector<std::int64_t> seq_lens, query_lens;
};

// A paged cache with a shuffled table (and, with share, sequence 1 reusing sequence 0's first
// blocks), random q, K and V, and the inputs of one call.
template <class T>
struct PagedCase {
  PagedShape s;
  std::int64_t num_blocks = 0, max_blocks = 0, total_q = 0;
  std::vector<std::int32_t> table;
  std::vector<std::int64_t> query_start;
  Buffer<T> q, k, v;  // q [1, total_q, H, D], caches [num_blocks, block_size, Hkv, D]

  PagedCase(const PagedShape& shape, std::mt19937_64& rng, bool share = false, bool head_major = false) : s(shape) {
    const auto N = static_cast<std::int64_t>(s.seq_lens.size());
    for (auto L : s.seq_lens) max_blocks = std::max(max_blocks, (L + s.block_size - 1) / s.block_size);
    max_blocks += 1;  // rows longer than needed: the rest is never read
    std::int64_t used = 0;
    for (auto L : s.seq_lens) used += (L + s.block_size - 1) / s.block_size;
    num_blocks = used + 3;
    std::vector<std::int32_t> free_blocks(static_cast<std::size_t>(num_blocks));
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    table.assign(static_cast<std::size_t>(N * max_blocks), -7);  // unread entries: out of range on purpose
    std::size_t next = 0;
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t c = 0; c < (s.seq_lens[i] + s.block_size - 1) / s.block_size; ++c)
        table[static_cast<std::size_t>(i * max_blocks + c)] = free_blocks[next++];
    if (share && N > 1)  // sequence 1 starts with sequence 0's full blocks
      for (std::int64_t c = 0; c < std::min(s.seq_lens[0], s.seq_lens[1]) / s.block_size; ++c)
        table[static_cast<std::size_t>(max_blocks + c)] = table[static_cast<std::size_t>(c)];
    query_start.assign(1, 0);
    for (auto ql : s.query_lens) query_start.push_back(query_start.back() + ql);
    total_q = query_start.back();
    q = Buffer<T>({1, total_q, s.H, s.D});
    k = Buffer<T>({num_blocks, s.block_size, s.Hkv, s.D});
    v = Buffer<T>({num_blocks, s.block_size, s.Hkv, s.Dv});
    if (head_major) {  // [num_blocks, Hkv, block_size, D] storage, read through the strides
      k.strides = {s.Hkv * s.block_size * s.D, s.D, s.block_size * s.D, 1};
      v.strides = {s.Hkv * s.block_size * s.Dv, s.Dv, s.block_size * s.Dv, 1};
    }
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
  }

  BlockTable block_table() const {
    return {table.data(), static_cast<std::int64_t>(s.seq_lens.size()), max_blocks, max_blocks};
  }

  Buffer<T> run(PagedAttentionOptions opt) const {
    Buffer<T> out({1, total_q, s.H, s.Dv});
    opt.query_start = query_start;
    attention_paged(q.cview(), k.cview(), v.cview(), block_table(), s.seq_lens, out.view(), opt);
    return out;
  }

  // attention() on each sequence's keys gathered into dense [1, Hkv, L, D] buffers.
  Buffer<T> dense(const PagedAttentionOptions& opt, Backend backend) const {
    Buffer<T> out({1, total_q, s.H, s.Dv});
    for (std::size_t i = 0; i < s.seq_lens.size(); ++i) {
      const std::int64_t L = s.seq_lens[i], ql = s.query_lens[i], q0 = query_start[i];
      if (ql == 0) continue;
      Buffer<T> kd({1, s.Hkv, L, s.D}), vd({1, s.Hkv, L, s.Dv}), qd({1, s.H, ql, s.D}), od({1, s.H, ql, s.Dv});
      for (std::int64_t t = 0; t < L; ++t) {
        const std::int64_t blk = table[i * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(t / s.block_size)];
        for (std::int64_t h = 0; h < s.Hkv; ++h) {
          for (std::int64_t d = 0; d < s.D; ++d) kd.at(0, h, t, d) = k.at(blk, t % s.block_size, h, d);
          for (std::int64_t d = 0; d < s.Dv; ++d) vd.at(0, h, t, d) = v.at(blk, t % s.block_size, h, d);
        }
      }
      for (std::int64_t t = 0; t < ql; ++t)
        for (std::int64_t h = 0; h < s.H; ++h)
          for (std::int64_t d = 0; d < s.D; ++d) qd.at(0, h, t, d) = q.at(0, q0 + t, h, d);
      AttentionOptions a;
      a.causal = opt.causal;
      a.scale = opt.scale, a.window = opt.window, a.softcap = opt.softcap;
      a.alibi_slopes = opt.alibi_slopes, a.sinks = opt.sinks, a.backend = backend;
      attention(qd.cview(), kd.cview(), vd.cview(), od.view(), a);
      for (std::int64_t t = 0; t < ql; ++t)
        for (std::int64_t h = 0; h < s.H; ++h)
          for (std::int64_t d = 0; d < s.Dv; ++d) out.at(0, q0 + t, h, d) = od.at(0, h, t, d);
    }
    return out;
  }
};

template <class T>
bool bitwise_equal(const Buffer<T>& a, const Buffer<T>& b) {
  return a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(T)) == 0;
}

// Every option set the tests sweep: none, a window, softcap + ALiBi + sinks, no causality.
std::vector<PagedAttentionOptions> option_sets(const std::vector<float>& slopes, const std::vector<float>& sinks) {
  std::vector<PagedAttentionOptions> out(5);
  out[1].window = Window{40, 0};
  out[2].softcap = 5.0, out[2].alibi_slopes = slopes, out[2].sinks = sinks;
  out[3].causal = Causal::none, out[3].scale = 0.3;
  out[4].causal = Causal::none, out[4].window = Window{9, 3}, out[4].sinks = sinks;
  return out;
}

template <class T>
void check_against_dense(const PagedShape& shape, std::uint64_t seed, bool share, bool head_major) {
  std::mt19937_64 rng(seed);
  const PagedCase<T> c(shape, rng, share, head_major);
  const std::vector<float> slopes = standard_alibi_slopes(shape.H), sinks = normal(rng, static_cast<std::size_t>(shape.H), 1.0f);
  int set = 0;
  for (PagedAttentionOptions opt : option_sets(slopes, sinks)) {
    CAPTURE(set++);
    opt.backend = Backend::reference;
    const Buffer<T> ref = c.run(opt);
    CHECK(bitwise_equal(ref, c.dense(opt, Backend::reference)));  // the gather is exact
    opt.backend = Backend::native;
    opt.threads = 1;
    const Buffer<T> one = c.run(opt);
    CHECK(max_abs_diff(one, ref) <= tolerance<T>(max_abs(c.v)));
    for (int threads : {2, 3}) {
      opt.threads = threads;
      CHECK(bitwise_equal(c.run(opt), one));
    }
  }
}

template <class T>
void sweep(std::uint64_t seed) {
  // mixed steps (decode, a short chunk, a longer one), lengths not multiples of the block size
  PagedShape mixed;
  mixed.seq_lens = {1, 37, 700, 1300, 64, 300};
  mixed.query_lens = {1, 7, 1, 64, 64, 300};
  for (std::int64_t bs : {1, 16, 32, 7}) {
    CAPTURE(bs);
    mixed.block_size = bs;
    check_against_dense<T>(mixed, seed + static_cast<std::uint64_t>(bs), bs == 16, false);
  }
  // decode steps over long keys (split-KV), multi-query and head-major caches
  PagedShape decode;
  decode.H = 8, decode.Hkv = 1, decode.D = 64, decode.Dv = 48;
  decode.seq_lens = {2000, 5, 513, 1024, 0};
  decode.query_lens = {1, 1, 1, 1, 0};
  check_against_dense<T>(decode, seed + 100, true, true);
}

TEST_CASE("attention_paged: f32 against attention() on the gathered keys, any thread count") { sweep<float>(base_seed()); }
TEST_CASE("attention_paged: bf16") { sweep<bfloat16>(base_seed() + 1); }
TEST_CASE("attention_paged: f16") { sweep<float16>(base_seed() + 2); }

// Tree masks (speculative decoding) and the lse output: the native paths (decode for the short
// steps, fused for the long ones) against the reference backend reading the same mask; threads
// 1, 2, 3 bitwise; a lower-triangular tree is the causal call.
template <class T>
void check_tree_masks(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  PagedShape shape;
  shape.seq_lens = {5, 300, 40, 1300, 17};
  shape.query_lens = {5, 40, 1, 24, 16};
  for (std::int64_t bs : {1, 16}) {
    CAPTURE(bs);
    shape.block_size = bs;
    const PagedCase<T> c(shape, rng);
    std::vector<std::uint8_t> tree, tril;
    std::bernoulli_distribution coin(0.5);
    for (std::int64_t ql : shape.query_lens)
      for (std::int64_t j = 0; j < ql; ++j)
        for (std::int64_t x = 0; x < ql; ++x) tree.push_back(j == 0 && ql == 5 ? 0 : coin(rng)), tril.push_back(x <= j);
    const std::vector<float> sinks = normal(rng, static_cast<std::size_t>(shape.H), 1.0f);
    for (int set = 0; set < 2; ++set) {
      CAPTURE(set);
      PagedAttentionOptions opt;
      opt.tree_mask = tree;
      if (set == 1) opt.softcap = 4.0, opt.sinks = sinks;
      Buffer<float> ref_lse({1, c.total_q, shape.H, 1}), lse({1, c.total_q, shape.H, 1});
      opt.backend = Backend::reference, opt.lse = ref_lse.view();
      const Buffer<T> ref = c.run(opt);
      opt.backend = Backend::native, opt.threads = 1, opt.lse = lse.view();
      const Buffer<T> one = c.run(opt);
      CHECK(max_abs_diff(one, ref) <= tolerance<T>(max_abs(c.v)));
      for (std::size_t i = 0; i < lse.data.size(); ++i) {
        CHECK(std::isinf(lse.data[i]) == std::isinf(ref_lse.data[i]));
        if (std::isfinite(ref_lse.data[i])) CHECK(std::abs(lse.data[i] - ref_lse.data[i]) <= 1e-4f);
      }
      if (set == 0)  // sequence 0's first token: no context, an empty row
        for (std::int64_t h = 0; h < shape.H; ++h) CHECK(std::isinf(lse.at(0, 0, h, 0)));
      for (int threads : {2, 3}) {
        Buffer<float> again_lse({1, c.total_q, shape.H, 1});
        opt.threads = threads, opt.lse = again_lse.view();
        CHECK(bitwise_equal(c.run(opt), one));
        CHECK(bitwise_equal(again_lse, lse));
      }
    }
    PagedAttentionOptions causal, lower;
    lower.tree_mask = tril;
    CHECK(max_abs_diff(c.run(lower), c.run(causal)) <= tolerance<T>(max_abs(c.v)));
  }
}

TEST_CASE("attention_paged: tree masks and lse, native against the reference on every path, any thread count") {
  check_tree_masks<float>(base_seed() + 6);
  check_tree_masks<bfloat16>(base_seed() + 7);
}

TEST_CASE("attention_paged: a block shared by two sequences is read, never changed") {
  std::mt19937_64 rng(base_seed() + 3);
  PagedShape s;
  s.seq_lens = {96, 96};
  s.query_lens = {1, 1};
  PagedCase<float> c(s, rng, true);
  const Buffer<float> k_before = c.k, v_before = c.v, q_before = c.q;
  const Buffer<float> out = c.run({});
  CHECK(bitwise_equal(c.k, k_before));
  CHECK(bitwise_equal(c.v, v_before));
  CHECK(bitwise_equal(c.q, q_before));
  CHECK(max_abs_diff(out, c.dense({}, Backend::reference)) <= tolerance<float>(max_abs(c.v)));
}

TEST_CASE("attention_paged: decode steps without query_start, a one-key window with sinks") {
  std::mt19937_64 rng(base_seed() + 4);
  PagedShape s;
  s.seq_lens = {33, 1, 700};
  s.query_lens = {1, 1, 1};
  PagedCase<float> c(s, rng);
  Buffer<float> out({1, 3, s.H, s.Dv});
  attention_paged(c.q.cview(), c.k.cview(), c.v.cview(), c.block_table(), s.seq_lens, out.view());
  CHECK(max_abs_diff(out, c.dense({}, Backend::reference)) <= tolerance<float>(max_abs(c.v)));
  // each decode token sees only its own key, beside a sink
  PagedAttentionOptions opt;
  opt.window = Window{0, 0};
  opt.causal = Causal::none;
  const std::vector<float> sinks(static_cast<std::size_t>(s.H), 2.0f);
  opt.sinks = sinks;
  const Buffer<float> w = c.run(opt);
  CHECK(max_abs_diff(w, c.dense(opt, Backend::reference)) <= tolerance<float>(max_abs(c.v)));
}

TEST_CASE("attention_paged: every malformed argument is an Error naming it, and out is left as it was") {
  std::mt19937_64 rng(base_seed() + 5);
  PagedShape s;
  s.seq_lens = {40, 20};
  s.query_lens = {3, 1};
  PagedCase<float> c(s, rng);
  Buffer<float> out({1, c.total_q, s.H, s.Dv});
  std::fill(out.data.begin(), out.data.end(), 42.0f);
  const auto expect = [&](const std::string& argument, auto&& call) {
    CAPTURE(argument);
    try {
      call();
      FAIL("no Error");
    } catch (const Error& e) {
      CHECK(e.argument() == argument);
    }
    CHECK(std::all_of(out.data.begin(), out.data.end(), [](float x) { return x == 42.0f; }));
  };
  PagedAttentionOptions opt;
  opt.query_start = c.query_start;
  auto call = [&](const BlockTable& t, std::vector<std::int64_t> lens, PagedAttentionOptions o) {
    attention_paged(c.q.cview(), c.k.cview(), c.v.cview(), t, lens, out.view(), o);
  };
  std::vector<std::int32_t> bad = c.table;
  bad[1] = static_cast<std::int32_t>(c.num_blocks);  // block 1 of sequence 0 (40 keys use 3)
  expect("block_table", [&] { call({bad.data(), 2, c.max_blocks, c.max_blocks}, s.seq_lens, opt); });
  bad = c.table;
  bad[0] = -1;
  expect("block_table", [&] { call({bad.data(), 2, c.max_blocks, c.max_blocks}, s.seq_lens, opt); });
  expect("block_table", [&] { call({c.table.data(), 2, 2, c.max_blocks}, s.seq_lens, opt); });  // row too short for 40
  expect("block_table", [&] { call({c.table.data(), 3, c.max_blocks, c.max_blocks}, s.seq_lens, opt); });
  expect("seq_lens", [&] { call(c.block_table(), {40, 0}, opt); });  // 1 query token, 0 keys
  expect("seq_lens", [&] { call(c.block_table(), {-1, 20}, opt); });
  PagedAttentionOptions o2 = opt;
  const std::vector<std::int64_t> not_increasing{0, 3, 2}, bad_end{0, 1, 3}, bad_start{1, 3, 4}, short_start{0, 4};
  for (const auto* qs : {&not_increasing, &bad_end, &bad_start, &short_start}) {
    o2.query_start = *qs;
    expect("options.query_start", [&] { call(c.block_table(), s.seq_lens, o2); });
  }
  expect("q", [&] { call(c.block_table(), s.seq_lens, PagedAttentionOptions{}); });  // 4 tokens, 2 sequences
  o2 = opt;
  o2.causal = Causal::top_left;
  expect("options.causal", [&] { call(c.block_table(), s.seq_lens, o2); });
  o2 = opt;
  o2.softcap = -1.0;
  expect("options.softcap", [&] { call(c.block_table(), s.seq_lens, o2); });
  o2 = opt;
  const std::vector<float> three(3, 0.5f);
  o2.alibi_slopes = three;
  expect("options.alibi_slopes", [&] { call(c.block_table(), s.seq_lens, o2); });
  o2 = opt;
  o2.sinks = three;
  expect("options.sinks", [&] { call(c.block_table(), s.seq_lens, o2); });
  o2 = opt;
  o2.window = Window{-2, 0};
  expect("options.window", [&] { call(c.block_table(), s.seq_lens, o2); });
  o2 = opt;
  o2.backend = Backend::onednn;
  expect("options.backend", [&] { call(c.block_table(), s.seq_lens, o2); });
  // dtypes and shapes
  const Buffer<bfloat16> kb({c.num_blocks, s.block_size, s.Hkv, s.D});
  expect("k_cache", [&] {
    attention_paged(c.q.cview(), kb.cview(), c.v.cview(), c.block_table(), s.seq_lens, out.view(), opt);
  });
  Buffer<float> v_small({c.num_blocks, s.block_size - 1, s.Hkv, s.Dv});
  expect("v_cache", [&] {
    attention_paged(c.q.cview(), c.k.cview(), v_small.cview(), c.block_table(), s.seq_lens, out.view(), opt);
  });
  Buffer<float> k3({c.num_blocks, s.block_size, 3, s.D});
  expect("k_cache", [&] {
    attention_paged(c.q.cview(), k3.cview(), c.v.cview(), c.block_table(), s.seq_lens, out.view(), opt);
  });
  Buffer<float> out_small({1, c.total_q - 1, s.H, s.Dv});
  expect("out", [&] {
    attention_paged(c.q.cview(), c.k.cview(), c.v.cview(), c.block_table(), s.seq_lens, out_small.view(), opt);
  });
  const TensorView aliased(c.k.data.data(), DType::f32, out.shape, out.strides);
  try {
    attention_paged(c.q.cview(), c.k.cview(), c.v.cview(), c.block_table(), s.seq_lens, aliased, opt);
    FAIL("no Error");
  } catch (const Error& e) {
    CHECK(e.argument() == "out");
  }
  Buffer<double> q64({1, c.total_q, s.H, s.D});
  expect("q", [&] {
    attention_paged(q64.cview(), c.k.cview(), c.v.cview(), c.block_table(), s.seq_lens, out.view(), opt);
  });
}

}  // namespace
}  // namespace simdattn::test

namespace simdattn::test {
namespace {

TEST_CASE("merge_attention_states: the states over two key sets merge into the state over their union, in place too") {
  std::mt19937_64 rng(base_seed() + 8);
  PagedShape shape;
  shape.seq_lens = {40, 300};
  shape.query_lens = {1, 1};
  const PagedCase<float> c(shape, rng);
  // A: keys [0, L - 16), as shorter sequences; B: the last 16 keys, through a window of 15 behind
  PagedAttentionOptions all, first, last;
  Buffer<float> lse_all({1, 2, shape.H, 1}), lse_a({1, 2, shape.H, 1}), lse_b({1, 2, shape.H, 1});
  all.lse = lse_all.view();
  const Buffer<float> out_all = c.run(all);
  last.window = Window{15, 0}, last.lse = lse_b.view();
  const Buffer<float> out_b = c.run(last);
  Buffer<float> out_a({1, 2, shape.H, shape.Dv});
  const std::vector<std::int64_t> shorter{24, 284};
  first.lse = lse_a.view();
  first.query_start = c.query_start;
  first.causal = Causal::none;
  attention_paged(c.q.cview(), c.k.cview(), c.v.cview(), c.block_table(), shorter, out_a.view(), first);
  Buffer<float> out({1, 2, shape.H, shape.Dv}), lse({1, 2, shape.H, 1});
  merge_attention_states(out_a.cview(), lse_a.cview(), out_b.cview(), lse_b.cview(), out.view(), lse.view());
  CHECK(max_abs_diff(out, out_all) <= 1e-5);
  CHECK(max_abs_diff(lse, lse_all) <= 1e-5);
  merge_attention_states(out_a.cview(), lse_a.cview(), out_b.cview(), lse_b.cview(), out_a.view(), lse_a.view());
  CHECK(bitwise_equal(out_a, out));
  CHECK(bitwise_equal(lse_a, lse));
  Buffer<float> wrong({1, 2, shape.H, 1});
  CHECK_THROWS_AS(merge_attention_states(out_b.cview(), lse_b.cview(), out_b.cview(), wrong.cview(), wrong.view(), lse.view()),
                  Error);
}

}  // namespace
}  // namespace simdattn::test
