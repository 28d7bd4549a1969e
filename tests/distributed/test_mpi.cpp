// simdattn::mpi under mpirun -np 1..4 (tests/CMakeLists.txt, label mpi): every rank runs every
// case on the same random inputs (one seed), gives its shard, and checks the sharded result
// against attention() on the whole sequence in this process, and that every rank got the same
// bytes.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstring>
#include <string>

#include "simdattn/mpi.hpp"
#include "support/test_util.hpp"

namespace simdattn::test {
namespace {

using mpi::ShardOrder;
using mpi::TokenRange;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int ranks() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The positions `ranges` of a [B, H, S, W] buffer's sequence axis, one after the other.
template <class T>
Buffer<T> take(const Buffer<T>& a, const std::vector<TokenRange>& ranges) {
  std::int64_t n = 0;
  for (const TokenRange& r : ranges) n += r.length;
  Buffer<T> out({a.shape[0], a.shape[1], n, a.shape[3]});
  for (std::int64_t b = 0; b < a.shape[0]; ++b)
    for (std::int64_t h = 0; h < a.shape[1]; ++h) {
      std::int64_t at = 0;
      for (const TokenRange& r : ranges)
        for (std::int64_t i = 0; i < r.length; ++i, ++at)
          for (std::int64_t d = 0; d < a.shape[3]; ++d) out.at(b, h, at, d) = a.at(b, h, r.start + i, d);
    }
  return out;
}

// Whether every rank holds the same bytes.
bool same_on_every_rank(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  std::uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// Whether every rank has the same flag (a check that failed on one rank must not leave the
// others waiting in a later collective: every case's collectives run whatever it finds).
bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

struct Case {
  std::int64_t B = 1, H = 4, Hkv = 4, Sq = 5, Sk = 37, D = 16, Dv = 16;
  ShardOrder order = ShardOrder::contiguous;
  bool given = false;              // false: shard_ranges(Sk, ranks, rank, order)
  std::vector<TokenRange> ranges;  // given: this rank's ranges
};

// The sharded calls' tolerance: the dtype's (test_util.hpp), and for f64 that of the f32 lse
// each rank's partial carries (attention()'s lse output is f32): 1e-6 * max(1, max|V|).
template <class T>
double sharded_tolerance(double max_abs_v) {
  if constexpr (std::is_same_v<T, double>) return 1e-6 * std::max(1.0, max_abs_v);
  return tolerance<T>(max_abs_v);
}

// sharded_attention against attention() on the whole K/V.
template <class T>
void check_sharded(const Case& c, AttentionOptions opt, std::uint64_t seed, int root = -1, bool with_lse = true) {
  std::mt19937_64 rng(seed);
  const auto t = random_qkv<T>(rng, c.B, c.H, c.Hkv, c.Sq, c.Sk, c.D, c.Dv);
  Buffer<float> lse_all({c.B, c.H, c.Sq, 1}), lse({c.B, c.H, c.Sq, 1});
  AttentionOptions whole = opt;
  if (with_lse) whole.lse = lse_all.view();
  const Buffer<T> expected = run_attention<T>(Backend::native, t.q, t.k, t.v, whole);

  const std::vector<TokenRange> ranges =
      c.given ? c.ranges : mpi::shard_ranges(c.Sk, ranks(), rank(), c.order);
  const Buffer<T> k = take(t.k, ranges), v = take(t.v, ranges);
  Buffer<T> out({c.B, c.H, c.Sq, c.Dv});
  if (with_lse) opt.lse = lse.view();
  mpi::ShardOptions shard;
  shard.total_keys = c.Sk;
  shard.key_ranges = ranges;
  shard.root = root;
  mpi::sharded_attention(MPI_COMM_WORLD, t.q.cview(), k.cview(), v.cview(), out.view(), opt, shard);
  if (root == -1 || root == rank()) {
    CHECK(max_abs_diff(out, expected) <= sharded_tolerance<T>(max_abs(t.v)));
    if (with_lse) CHECK(max_abs_diff(lse, lse_all) <= 1e-5 * std::max(1.0, max_abs(lse_all)));
  }
  if (root == -1) CHECK(same_on_every_rank(out.data.data(), out.data.size() * sizeof(T)));
}

TEST_CASE("shard_ranges cover the sequence once, zigzag pairs chunk r with 2N-1-r") {
  for (std::int64_t total : {0, 1, 5, 16, 37})
    for (int n : {1, 2, 3, 4}) {
      std::vector<int> owner(static_cast<std::size_t>(total), -1);
      for (ShardOrder order : {ShardOrder::contiguous, ShardOrder::zigzag}) {
        std::fill(owner.begin(), owner.end(), -1);
        std::int64_t held = 0;
        for (int r = 0; r < n; ++r) {
          for (const TokenRange& t : mpi::shard_ranges(total, n, r, order))
            for (std::int64_t i = t.start; i < t.start + t.length; ++i) {
              CHECK(owner[static_cast<std::size_t>(i)] == -1);
              owner[static_cast<std::size_t>(i)] = r;
            }
          held += mpi::shard_length(total, n, r, order);
        }
        CHECK(held == total);
      }
      if (total == 16 && n == 4)  // chunks of 2: rank 0 holds [0, 2) and [14, 16)
        CHECK(mpi::shard_ranges(16, 4, 0, ShardOrder::zigzag) == std::vector<TokenRange>{{0, 2}, {14, 2}});
    }
  CHECK_THROWS_AS(mpi::shard_ranges(5, 0, 0, ShardOrder::zigzag), Error);
  CHECK_THROWS_AS(mpi::shard_ranges(5, 2, 2, ShardOrder::zigzag), Error);
}

TEST_CASE("sharded attention equals one process: orders, causal alignments, GQA, window, modifiers") {
  std::uint64_t seed = base_seed();
  for (ShardOrder order : {ShardOrder::contiguous, ShardOrder::zigzag})
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Case c;
      c.order = order;
      c.Hkv = 2;  // grouped-query
      AttentionOptions opt;
      opt.causal = causal;
      CAPTURE_VALUE(mpi::shard_order_name(order));
      CAPTURE_VALUE(causal_name(causal));
      check_sharded<float>(c, opt, ++seed);
      opt.window = Window{7, causal == Causal::none ? 3 : 0};
      check_sharded<float>(c, opt, ++seed);
      opt.window.reset();
      opt.softcap = 5.0;
      const std::vector<float> slopes = standard_alibi_slopes(c.H);
      opt.alibi_slopes = slopes;
      check_sharded<float>(c, opt, ++seed);
      const std::vector<std::int64_t> lengths{29, 0, 37};
      Case b = c;
      b.B = 3;
      opt.key_lengths = lengths;
      check_sharded<float>(b, opt, ++seed);
      const std::vector<float> sinks{0.5f, -1.f, 2.f, 0.f};
      opt.sinks = sinks;
      const std::vector<std::int64_t> offsets{3, -2, 30};
      opt.query_offsets = offsets;
      check_sharded<float>(b, opt, ++seed);
    }
}

TEST_CASE("sharded attention: uneven and empty shards, one-rank-holds-all, root, T5 bias, f64, bf16") {
  std::uint64_t seed = base_seed() + 1000;
  Case c;
  c.Sk = 2;  // fewer keys than ranks: empty shards
  AttentionOptions opt;
  opt.causal = Causal::bottom_right;
  check_sharded<float>(c, opt, ++seed);
  c.Sk = 23;  // uneven, chosen by hand: rank r holds [0, 23) on the last rank only, or split oddly
  const int n = ranks(), me = rank();
  c.given = true;
  c.ranges.clear();
  if (n == 1) c.ranges = {{0, 23}};
  else if (me == n - 1) c.ranges = {{0, 3}, {20, 3}};
  else if (me == 0) c.ranges = {{3, 17}};
  // other ranks: nothing
  check_sharded<float>(c, opt, ++seed);
  // striped in blocks of 2 (rank b % n holds block b): up to 12 ranges a rank, more than the
  // agreement's message carries inline
  c.ranges.clear();
  for (std::int64_t b = 0; 2 * b < c.Sk; ++b)
    if (b % n == me) c.ranges.push_back({2 * b, std::min<std::int64_t>(2, c.Sk - 2 * b)});
  check_sharded<float>(c, opt, ++seed);
  c.given = false;
  for (int root = 0; root < n; ++root) check_sharded<float>(c, opt, ++seed, root);
  // T5's bias over absolute positions
  std::mt19937_64 rng(++seed);
  Buffer<float> table({1, 1, 8, c.H});
  table.fill_normal(rng);
  opt.relative_bias = RelativePositionBias{table.cview(), true, 20};
  check_sharded<float>(c, opt, ++seed);
  opt.relative_bias.reset();
  check_sharded<double>(c, opt, ++seed);
  c.order = ShardOrder::zigzag;
  check_sharded<bfloat16>(c, opt, ++seed);
}

TEST_CASE("sharded attention: a boolean mask given as each rank's columns") {
  const int n = ranks(), me = rank();
  Case c;
  c.Sk = 19;
  std::mt19937_64 rng(base_seed() + 2000);
  const auto t = random_qkv<float>(rng, c.B, c.H, c.Hkv, c.Sq, c.Sk, c.D, c.Dv);
  Buffer<std::uint8_t> mask({1, 1, c.Sq, c.Sk});
  mask.for_each([&](std::uint8_t& m, auto, auto, std::int64_t i, std::int64_t j) { m = (i * 7 + j * 3) % 4 != 0; });
  AttentionOptions opt;
  opt.mask = mask.cview();
  const Buffer<float> expected = run_attention<float>(Backend::native, t.q, t.k, t.v, opt);
  const auto ranges = mpi::shard_ranges(c.Sk, n, me, ShardOrder::zigzag);
  const Buffer<float> k = take(t.k, ranges), v = take(t.v, ranges);
  // the mask's columns of this rank's keys: [1, 1, Sq, n_local]
  Buffer<std::uint8_t> local({1, 1, c.Sq, k.shape[2]});
  std::int64_t col = 0;
  for (const TokenRange& r : ranges)
    for (std::int64_t j = 0; j < r.length; ++j, ++col)
      for (std::int64_t i = 0; i < c.Sq; ++i) local.at(0, 0, i, col) = mask.at(0, 0, i, r.start + j);
  opt.mask = local.cview();
  Buffer<float> out({c.B, c.H, c.Sq, c.Dv});
  mpi::ShardOptions shard;
  shard.total_keys = c.Sk;
  shard.key_ranges = ranges;
  mpi::sharded_attention(MPI_COMM_WORLD, t.q.cview(), k.cview(), v.cview(), out.view(), opt, shard);
  CHECK(max_abs_diff(out, expected) <= tolerance<float>(max_abs(t.v)));
}

// ring_attention against attention() on the whole sequence: each rank's queries' rows.
// The same tensor laid out as [B, S, H, W] (heads interleaved: strided views).
template <class T>
Buffer<T> interleaved(const Buffer<T>& a) {
  Buffer<T> out(a.shape, true);
  out.for_each([&](T& x, auto b, auto h, auto i, auto d) { x = a.at(b, h, i, d); });
  return out;
}

template <class T>
void check_ring(std::int64_t S, ShardOrder order, AttentionOptions opt, std::uint64_t seed, std::int64_t H = 4,
                std::int64_t Hkv = 2, bool strided = false) {
  std::mt19937_64 rng(seed);
  const std::int64_t B = 2, D = 16;
  const auto t = random_qkv<T>(rng, B, H, Hkv, S, S, D, D);
  Buffer<float> lse_all({B, H, S, 1});
  AttentionOptions whole = opt;
  whole.lse = lse_all.view();
  const Buffer<T> expected = run_attention<T>(Backend::native, t.q, t.k, t.v, whole);
  const auto ranges = mpi::shard_ranges(S, ranks(), rank(), order);
  const Buffer<T> q = take(t.q, ranges);
  const Buffer<T> k = strided ? interleaved(take(t.k, ranges)) : take(t.k, ranges);
  const Buffer<T> v = strided ? interleaved(take(t.v, ranges)) : take(t.v, ranges);
  Buffer<T> out({B, H, q.shape[2], D});
  Buffer<float> lse({B, H, q.shape[2], 1});
  opt.lse = lse.view();
  mpi::RingOptions ring;
  ring.total_tokens = S;
  ring.order = order;
  mpi::ring_attention(MPI_COMM_WORLD, q.cview(), k.cview(), v.cview(), out.view(), opt, ring);
  CHECK(max_abs_diff(out, take(expected, ranges)) <= sharded_tolerance<T>(max_abs(t.v)));
  CHECK(max_abs_diff(lse, take(lse_all, ranges)) <= 1e-5 * std::max(1.0, max_abs(lse_all)));
}

TEST_CASE("ring attention equals the unsharded attention") {
  std::uint64_t seed = base_seed() + 3000;
  for (ShardOrder order : {ShardOrder::zigzag, ShardOrder::contiguous})
    for (std::int64_t S : {1, 3, 41, 96}) {
      CAPTURE_VALUE(mpi::shard_order_name(order));
      CAPTURE(S);
      AttentionOptions opt;
      for (Causal causal : {Causal::top_left, Causal::bottom_right, Causal::none}) {
        opt.causal = causal;
        check_ring<float>(S, order, opt, ++seed);
      }
      opt.causal = Causal::top_left;
      opt.window = Window{9, 0};
      check_ring<float>(S, order, opt, ++seed);
      opt.window.reset();
      const std::vector<float> slopes = standard_alibi_slopes(4);
      const std::vector<float> sinks{1.f, 0.f, -0.5f, 2.f};
      opt.alibi_slopes = slopes;
      opt.sinks = sinks;
      opt.softcap = 8.0;
      check_ring<float>(S, order, opt, ++seed);
      opt = {};
      opt.causal = Causal::top_left;
      check_ring<bfloat16>(S, order, opt, ++seed, 4, 1);
      check_ring<float>(S, order, opt, ++seed, 4, 2, true);  // K/V as [B, S, H, D]: packed to travel
    }
}

TEST_CASE("the sharded cache decoding token by token equals the unsharded cache") {
  const std::int64_t H = 4, Hkv = 2, D = 16, steps = 29, prompt = 6;
  const std::int64_t capacity = (prompt + steps + ranks() - 1) / ranks() + 1;  // uneven fill
  std::mt19937_64 rng(base_seed() + 4000);
  const auto t = random_qkv<float>(rng, 1, H, Hkv, prompt + steps, prompt + steps, D, D);
  mpi::ShardedKvCache cache(MPI_COMM_WORLD, Hkv, D, D, capacity);
  cache.append(take(t.k, {{0, prompt}}).cview(), take(t.v, {{0, prompt}}).cview());
  CHECK(cache.size() == prompt);
  const std::vector<float> slopes = standard_alibi_slopes(H);
  for (std::int64_t s = prompt; s < prompt + steps; ++s) {
    cache.append(take(t.k, {{s, 1}}).cview(), take(t.v, {{s, 1}}).cview());
    const Buffer<float> q = take(t.q, {{s, 1}});
    AttentionOptions opt;
    opt.causal = Causal::bottom_right;
    opt.alibi_slopes = slopes;
    opt.window = Window{20, 0};
    Buffer<float> out({1, H, 1, D});
    cache.attend(q.cview(), out.view(), opt);
    const Buffer<float> k_all = take(t.k, {{0, s + 1}}), v_all = take(t.v, {{0, s + 1}});
    const Buffer<float> expected = run_attention<float>(Backend::native, q, k_all, v_all, opt);
    CAPTURE(s);
    CHECK(max_abs_diff(out, expected) <= tolerance<float>(max_abs(t.v)));
    CHECK(same_on_every_rank(out.data.data(), out.data.size() * sizeof(float)));
  }
  std::int64_t local = cache.local_size(), total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == prompt + steps);
  // Full: the next token is an Error on every rank, the cache unchanged.
  const std::int64_t room = capacity * ranks() - cache.size();
  const Buffer<float> more({1, Hkv, room + 1, D});
  CHECK_THROWS_AS(cache.append(more.cview(), more.cview()), Error);
  CHECK(cache.size() == prompt + steps);
}

// The Error every rank saw, as text; checks it is the same on every rank.
bool same_error_on_every_rank(const std::string& what) {
  return same_on_every_rank(what.data(), what.size()) && all_ranks(!what.empty());
}

TEST_CASE("an 8-bit sharded cache decodes as attention over the same codes in one process") {
  const std::int64_t H = 4, Hkv = 2, D = 16, steps = 13, prompt = 5;
  const std::int64_t capacity = (prompt + steps + ranks() - 1) / ranks() + 1;  // room for one more
  for (DType code : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    CAPTURE_VALUE(dtype_name(code));
    std::mt19937_64 rng(base_seed() + 4100 + static_cast<std::uint64_t>(code));
    const auto t = random_qkv<float>(rng, 1, H, Hkv, prompt + steps, prompt + steps, D, D);
    mpi::ShardedKvCache cache(MPI_COMM_WORLD, Hkv, D, D, capacity, code);
    // the whole sequence's codes and scales, as quantize_kv makes them row by row
    Buffer<std::uint8_t> kc({1, Hkv, prompt + steps, D}), vc({1, Hkv, prompt + steps, D});
    Buffer<float> ks({1, Hkv, prompt + steps, 1}), vs({1, Hkv, prompt + steps, 1});
    quantize_kv(t.k.cview(), code, TensorView(kc.data.data(), code, kc.shape), ks.view());
    quantize_kv(t.v.cview(), code, TensorView(vc.data.data(), code, vc.shape), vs.view());
    cache.append(take(t.k, {{0, prompt}}).cview(), take(t.v, {{0, prompt}}).cview());
    for (std::int64_t s = prompt; s < prompt + steps; ++s) {
      cache.append(take(t.k, {{s, 1}}).cview(), take(t.v, {{s, 1}}).cview());
      const Buffer<float> q = take(t.q, {{s, 1}});
      AttentionOptions opt;
      opt.causal = Causal::bottom_right;
      Buffer<float> out({1, H, 1, D});
      cache.attend(q.cview(), out.view(), opt);
      AttentionOptions whole = opt;
      const auto kp = take(ks, {{0, s + 1}}), vp = take(vs, {{0, s + 1}});
      whole.k_scale = kp.cview();
      whole.v_scale = vp.cview();
      const auto kcp = take(kc, {{0, s + 1}}), vcp = take(vc, {{0, s + 1}});
      Buffer<float> expected({1, H, 1, D});
      attention(q.cview(), ConstTensorView(kcp.data.data(), code, kcp.shape), ConstTensorView(vcp.data.data(), code, vcp.shape),
                expected.view(), whole);
      CAPTURE(s);
      CHECK(max_abs_diff(out, expected) <= tolerance<float>(max_abs(t.v)));
    }
    // a NaN in the owner's new row: the same Error on every rank, the cache unchanged
    {
      Buffer<float> bad({1, Hkv, 1, D});
      bad.at(0, 1, 0, 3) = NAN;
      std::string what;
      try {
        cache.append(bad.cview(), bad.cview());
      } catch (const Error& e) {
        what = e.what();
      }
      CHECK(what.rfind("x", 0) == 0);
      CHECK(same_error_on_every_rank(what));
      CHECK(cache.size() == prompt + steps);
    }
  }
}


TEST_CASE("a bad argument on one rank is the same Error on every rank") {
  const int n = ranks(), me = rank();
  std::mt19937_64 rng(base_seed() + 5000);
  const auto t = random_qkv<float>(rng, 1, 4, 4, 3, 16, 8, 8);
  const auto ranges = mpi::shard_ranges(16, n, me, ShardOrder::contiguous);
  const Buffer<float> k = take(t.k, ranges), v = take(t.v, ranges);
  Buffer<float> out({1, 4, 3, 8});
  mpi::ShardOptions shard;
  shard.total_keys = 16;
  shard.key_ranges = ranges;
  auto error_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.argument()) + "|" + e.what();
    }
    return std::string();
  };
  std::string what;
  if (n > 1) {  // the last rank's q has one query too many (alone, it is a valid call)
    const Buffer<float> q_bad({1, 4, 4, 8});
    Buffer<float> out_bad({1, 4, 4, 8});
    what = error_of([&] {
      mpi::sharded_attention(MPI_COMM_WORLD, me == n - 1 ? q_bad.cview() : t.q.cview(), k.cview(), v.cview(),
                             me == n - 1 ? out_bad.view() : out.view(), {}, shard);
    });
    CAPTURE(what);
    CHECK(what.rfind("q.shape[2]|", 0) == 0);
    CHECK(same_error_on_every_rank(what));
  }
  // the last rank's k has a wrong head dim: that rank's own check fails, and every rank hears it
  const Buffer<float> k_bad({1, 4, k.shape[2], 7});
  what = error_of([&] {
    mpi::sharded_attention(MPI_COMM_WORLD, t.q.cview(), me == n - 1 ? k_bad.cview() : k.cview(), v.cview(),
                           out.view(), {}, shard);
  });
  CAPTURE(what);
  CHECK(what.rfind("k", 0) == 0);
  CHECK(same_error_on_every_rank(what));
  // ranges that leave a gap (rank 0 drops its first key)
  std::vector<TokenRange> gap = ranges;
  if (me == 0 && !gap.empty()) {
    gap[0].start += 1;
    gap[0].length -= 1;
  }
  const Buffer<float> k_gap = take(t.k, gap), v_gap = take(t.v, gap);
  shard.key_ranges = gap;
  what = error_of([&] {
    mpi::sharded_attention(MPI_COMM_WORLD, t.q.cview(), k_gap.cview(), v_gap.cview(), out.view(), {}, shard);
  });
  CAPTURE(what);
  CHECK(what.rfind("shard.key_ranges|", 0) == 0);
  CHECK(same_error_on_every_rank(what));
  // ring: a rank with the wrong token count
  const auto ring_ranges = mpi::shard_ranges(16, n, me, ShardOrder::zigzag);
  const Buffer<float> rq = take(t.k, ring_ranges);  // [1, 4, n_r, 8] serves as q, k and v
  const Buffer<float> rq_bad({1, 4, rq.shape[2] + 1, 8});
  const Buffer<float>& mine = me == n - 1 ? rq_bad : rq;
  Buffer<float> rout({1, 4, mine.shape[2], 8});
  what = error_of([&] {
    mpi::ring_attention(MPI_COMM_WORLD, mine.cview(), mine.cview(), mine.cview(), rout.view(), {}, {16, ShardOrder::zigzag});
  });
  CAPTURE(what);
  CHECK(what.rfind("q|", 0) == 0);
  CHECK(same_error_on_every_rank(what));
  // options no sharded call takes
  AttentionOptions opt;
  opt.global_tokens = 2;
  shard.key_ranges = ranges;
  what = error_of([&] { mpi::sharded_attention(MPI_COMM_WORLD, t.q.cview(), k.cview(), v.cview(), out.view(), opt, shard); });
  CHECK(what.rfind("options.global_tokens|", 0) == 0);
  CHECK(same_error_on_every_rank(what));
}

}  // namespace
}  // namespace simdattn::test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context ctx(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) ctx.setOption("no-intro", true);
  const int failed = ctx.run();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
