// Speculative decoding's verification (docs/serving.md, "Speculative decoding"), a 32-token draft
// tree over a 4096-token context, 32 heads, 8 kv heads, d 128, in blocks of 16 tokens:
//   attention/native/tree32-verify/t<N> (.bf16): one attention_paged call with the tree's mask;
//     against attention/native/tree32-as-decodes/t<N> (.bf16): the same 32 drafts as 32 one-token
//     decode calls (draft j over the context and drafts 0 .. j)
//   mha/native/tree32-step/t<N> (.bf16): one forward_pool step of the tree through a llama-shaped
//     layer (d_model 4096, 32 heads, 8 kv heads, RoPE), its tokens at their depths; against
//     mha/native/tree32-as-steps/t<N> (.bf16): the 32 tokens as 32 one-token steps
//   attention/native/forks32-cascade/t<N> (.bf16): 32 forks of a 2048-token prompt with 64 tokens
//     each, a decode step each, as a prefix call + a suffix call + merge_attention_states; against
//     attention/native/forks32-plain/t<N> (.bf16): one attention_paged call over all 2112 keys each
//   mha/native/forks32-batch/t<N> (.bf16): those 32 forks' decode step as one forward_pool batch of
//     the llama-shaped layer (the cascade chosen by the layer); against
//     mha/native/forks32-batch-unshared/t<N> (.bf16): the same batch over 32 sequences that each
//     hold their own copy of the prompt (nothing shared). The pools are filled by a smaller layer
//     of the same kv heads and head_dim (8 x 128), which gives the same bytes and blocks.
// Counters: GFLOP/s of the visible pairs (attention rows) or of the 32 tokens' projections (layer
// rows; the same work both ways, so the ratio is the tokens/s ratio). The drafts are truncated
// away after each iteration.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "perf_util.hpp"
#include "simdattn/simdattn.hpp"

namespace {

using simdattn::perf::from_float;

constexpr std::int64_t kCtx = 4096, kTree = 32, kH = 32, kHkv = 8, kD = 128, kBs = 16;

// A draft tree of kTree tokens (token j's parent a random earlier token, as drafted trees branch):
// its [kTree, kTree] mask (ancestors and itself) and its tokens' depths.
struct Tree {
  std::vector<std::uint8_t> mask;
  std::vector<std::int64_t> depth;
  std::int64_t visible = 0;  // the mask's nonzero entries
  Tree() : mask(kTree * kTree, 0), depth(kTree, 0) {
    std::mt19937 rng(17);
    std::vector<std::int64_t> parent(kTree, -1);
    for (std::int64_t j = 1; j < kTree; ++j) parent[j] = std::uniform_int_distribution<std::int64_t>(std::max<std::int64_t>(0, j - 4), j - 1)(rng);
    for (std::int64_t j = 0; j < kTree; ++j)
      for (std::int64_t a = j; a >= 0; a = parent[a]) mask[j * kTree + a] = 1, ++visible;
    for (std::int64_t j = 1; j < kTree; ++j) depth[j] = depth[parent[j]] + 1;
  }
};
const Tree& tree() {
  static const Tree t;
  return t;
}

// K and V in `blocks` blocks of kBs ([blocks, kBs, Hkv, D]), `queries` tokens' q, and the blocks in
// a shuffled order (a table's).
template <class T>
struct Blocks {
  simdattn::perf::HugeArray<T> k, v;  // as a KvPool keeps its blocks
  std::vector<T> q;
  std::vector<std::int32_t> order;
  std::int64_t blocks;
  Blocks(std::int64_t n, std::int64_t queries, unsigned seed) : blocks(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    const auto fill = [&](auto& x, std::int64_t count) {
      x.resize(static_cast<std::size_t>(count));
      for (T& e : x) e = from_float<T>(d(rng));
    };
    fill(k, blocks * kBs * kHkv * kD), fill(v, blocks * kBs * kHkv * kD), fill(q, queries * kH * kD);
    order.resize(static_cast<std::size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
  }
  simdattn::ConstTensorView keys() const { return simdattn::ConstTensorView(k.data(), {blocks, kBs, kHkv, kD}); }
  simdattn::ConstTensorView values() const { return simdattn::ConstTensorView(v.data(), {blocks, kBs, kHkv, kD}); }
};

// The context and the drafts in blocks (one sequence: its table the shuffled order), and the
// drafts' queries.
template <class T>
struct Cache : Blocks<T> {
  Cache() : Blocks<T>((kCtx + kTree + kBs - 1) / kBs, kTree, 5) {}
};

template <class T>
void bench_verify(benchmark::State& state, bool as_decodes, int threads) {
  static const Cache<T> c;
  std::vector<T> out(c.q.size());
  const simdattn::BlockTable table{c.order.data(), 1, c.blocks, c.blocks};
  simdattn::PagedAttentionOptions o;
  o.threads = threads;
  const double pair = 2.0 * kH * (kD + kD);
  if (!as_decodes) {
    const std::int64_t len = kCtx + kTree;
    const std::int64_t starts[2] = {0, kTree};
    o.query_start = starts;
    o.tree_mask = tree().mask;
    simdattn::perf::timed_loop(state, pair * double(kTree * kCtx + tree().visible), "GFLOP/s", [&] {
      simdattn::attention_paged(simdattn::ConstTensorView(c.q.data(), {1, kTree, kH, kD}), c.keys(), c.values(), table,
                                {&len, 1}, simdattn::TensorView(out.data(), {1, kTree, kH, kD}), o);
    });
    return;
  }
  simdattn::perf::timed_loop(state, pair * double(kTree * kCtx + kTree * (kTree + 1) / 2), "GFLOP/s", [&] {
    for (std::int64_t j = 0; j < kTree; ++j) {
      const std::int64_t len = kCtx + j + 1;
      simdattn::attention_paged(simdattn::ConstTensorView(c.q.data() + j * kH * kD, {1, 1, kH, kD}), c.keys(), c.values(),
                                table, {&len, 1}, simdattn::TensorView(out.data() + j * kH * kD, {1, 1, kH, kD}), o);
    }
  });
}

// The llama-shaped layer and a pool holding the context, prefilled once per dtype.
template <class T>
struct Layer {
  static constexpr std::int64_t d = 4096, nkv = d / kH * kHkv;
  std::unique_ptr<simdattn::MultiHeadAttention> layer;
  std::unique_ptr<simdattn::KvPool> pool;
  simdattn::KvPool::Sequence seq = 0;
  std::vector<T> x;
  Layer() {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.f, 1.f / 64.f);
    auto w = [&](std::int64_t count) {
      std::vector<T> e(static_cast<std::size_t>(count));
      for (T& a : e) a = from_float<T>(n(rng));
      return e;
    };
    simdattn::MhaConfig cfg{.d_model = d, .heads = kH, .kv_heads = kHkv};
    cfg.rope = simdattn::RopeConfig{.theta = 500000.0};
    layer = std::make_unique<simdattn::MultiHeadAttention>(
        cfg, simdattn::MhaWeights<T>{w(d * d), w(nkv * d), w(nkv * d), w(d * d), w(d), w(nkv), w(nkv), w(d)});
    pool = std::make_unique<simdattn::KvPool>(*layer, (kCtx + kTree) / kBs + 2, kBs);
    seq = pool->add();
    x = w(kCtx * d);
    std::vector<T> y(x.size());
    for (std::int64_t t0 = 0; t0 < kCtx; t0 += 512) {  // the context in chunks
      const simdattn::PoolStep s{simdattn::ConstSeqView(x.data() + t0 * d, 1, 512, d), seq,
                                 simdattn::SeqView(y.data() + t0 * d, 1, 512, d)};
      layer->forward_pool({&s, 1}, *pool);
    }
  }
};

template <class T>
void bench_layer_step(benchmark::State& state, bool as_steps, int threads) {
  static Layer<T> l;
  constexpr std::int64_t d = Layer<T>::d;
  std::vector<T> y(static_cast<std::size_t>(kTree * d));
  simdattn::MhaOptions o;
  o.threads = threads;
  std::vector<std::int64_t> pos(kTree);
  for (std::int64_t j = 0; j < kTree; ++j) pos[j] = kCtx + (as_steps ? j : tree().depth[j]);
  const double flops = 2.0 * kTree * d * (2.0 * d + 2.0 * Layer<T>::nkv);
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
    if (as_steps) {
      for (std::int64_t j = 0; j < kTree; ++j) {
        const simdattn::PoolStep s{simdattn::ConstSeqView(l.x.data() + j * d, 1, 1, d), l.seq,
                                   simdattn::SeqView(y.data() + j * d, 1, 1, d), {&pos[j], 1}};
        l.layer->forward_pool({&s, 1}, *l.pool, 0, o);
      }
    } else {
      simdattn::PoolStep s{simdattn::ConstSeqView(l.x.data(), 1, kTree, d), l.seq, simdattn::SeqView(y.data(), 1, kTree, d),
                           pos};
      s.tree_mask = tree().mask;
      l.layer->forward_pool({&s, 1}, *l.pool, 0, o);
    }
    l.pool->truncate(l.seq, kCtx);
  });
}

// Shared prefixes: kForks sequences forked from a kPrefix-token prompt, each with kOwn tokens of its
// own, one decode step each, over one cache in blocks of kBs (the prompt's blocks shared).
constexpr std::int64_t kForks = 32, kPrefix = 2048, kOwn = 64;

template <class T>
struct Forks : Blocks<T> {
  static constexpr std::int64_t all = (kPrefix + kOwn) / kBs, mine = kOwn / kBs;
  std::vector<std::int32_t> table, own;  // [kForks, all]: the prompt's blocks, then the fork's; [kForks, mine]
  Forks() : Blocks<T>(kPrefix / kBs + kForks * mine, kForks, 7) {
    static_assert(kPrefix % kBs == 0 && kOwn % kBs == 0);
    const auto& shuffled = this->order;
    for (std::int64_t f = 0; f < kForks; ++f) {
      for (std::int64_t c = 0; c < kPrefix / kBs; ++c) table.push_back(shuffled[static_cast<std::size_t>(c)]);
      for (std::int64_t c = 0; c < mine; ++c) {
        const std::int32_t b = shuffled[static_cast<std::size_t>(kPrefix / kBs + f * mine + c)];
        table.push_back(b), own.push_back(b);
      }
    }
  }
};

// attention/native/forks32-cascade/t<N> (.bf16): the prefix once for every fork's token (one
// sequence of kForks queries over the prompt, lse out), each fork's own keys (lse out), and
// merge_attention_states; against attention/native/forks32-plain/t<N> (.bf16): one attention_paged
// call over every fork's kPrefix + kOwn keys.
template <class T>
void bench_forks(benchmark::State& state, bool cascade, int threads) {
  static const Forks<T> f;
  std::vector<T> out(f.q.size()), prefix_out(f.q.size()), own_out(f.q.size());
  std::vector<float> prefix_lse(static_cast<std::size_t>(kForks * kH)), own_lse(prefix_lse.size());
  const double flops = 2.0 * kH * (kD + kD) * double(kForks * (kPrefix + kOwn));
  const simdattn::ConstTensorView q(f.q.data(), {1, kForks, kH, kD});
  const simdattn::TensorView o(out.data(), {1, kForks, kH, kD});
  if (!cascade) {
    const std::vector<std::int64_t> lens(kForks, kPrefix + kOwn);
    simdattn::PagedAttentionOptions opt;
    opt.threads = threads;
    const simdattn::BlockTable table{f.table.data(), kForks, f.all, f.all};
    simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] { simdattn::attention_paged(q, f.keys(), f.values(), table, lens, o, opt); });
    return;
  }
  const std::int64_t prefix_len = kPrefix, starts[2] = {0, kForks};
  const std::vector<std::int64_t> own_lens(kForks, kOwn);
  const simdattn::BlockTable prefix_table{f.table.data(), 1, kPrefix / kBs, kPrefix / kBs}, own_table{f.own.data(), kForks, f.mine, f.mine};
  simdattn::PagedAttentionOptions po, so;
  po.threads = so.threads = threads;
  po.query_start = starts;
  po.causal = simdattn::Causal::none;  // every fork's token follows the whole prompt
  po.lse = simdattn::TensorView(prefix_lse.data(), {1, kForks, kH, 1});
  so.lse = simdattn::TensorView(own_lse.data(), {1, kForks, kH, 1});
  const simdattn::TensorView pv(prefix_out.data(), {1, kForks, kH, kD}), ov(own_out.data(), {1, kForks, kH, kD});
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
    simdattn::attention_paged(q, f.keys(), f.values(), prefix_table, {&prefix_len, 1}, pv, po);
    simdattn::attention_paged(q, f.keys(), f.values(), own_table, own_lens, ov, so);
    simdattn::merge_attention_states(pv, po.lse, ov, so.lse, o, simdattn::TensorView(prefix_lse.data(), {1, kForks, kH, 1}));
  });
}

// The forks' pool, shared (one prompt, kForks forks with kOwn tokens each) or not (kForks
// sequences of kPrefix + kOwn tokens each), filled by a d_model 1024 layer of 8 heads of 128.
template <class T>
struct ForkPool {
  std::unique_ptr<simdattn::MultiHeadAttention> filler;
  std::unique_ptr<simdattn::KvPool> pool;
  std::vector<simdattn::KvPool::Sequence> seqs;
  explicit ForkPool(bool shared) {
    constexpr std::int64_t d = kHkv * kD;
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.f, 1.f / 32.f);
    auto w = [&](std::int64_t count) {
      std::vector<T> e(static_cast<std::size_t>(count));
      for (T& a : e) a = from_float<T>(n(rng));
      return e;
    };
    simdattn::MhaConfig cfg{.d_model = d, .heads = kHkv, .kv_heads = kHkv};
    cfg.rope = simdattn::RopeConfig{.theta = 500000.0};
    filler = std::make_unique<simdattn::MultiHeadAttention>(cfg, simdattn::MhaWeights<T>{w(d * d), w(d * d), w(d * d), w(d * d), {}, {}, {}, {}});
    const std::int64_t per = (kPrefix + kOwn) / kBs + 1;
    pool = std::make_unique<simdattn::KvPool>(*filler, shared ? kPrefix / kBs + kForks * (kOwn / kBs + 1) : kForks * per, kBs);
    const std::vector<T> x = w(kPrefix * d);
    std::vector<T> y(x.size());
    auto feed = [&](simdattn::KvPool::Sequence s, std::int64_t t0, std::int64_t count) {
      const simdattn::PoolStep step{simdattn::ConstSeqView(x.data() + t0 * d, 1, count, d), s, simdattn::SeqView(y.data(), 1, count, d)};
      filler->forward_pool({&step, 1}, *pool);
    };
    simdattn::KvPool::Sequence prompt = -1;
    if (shared) prompt = pool->add(), feed(prompt, 0, kPrefix);
    for (std::int64_t f = 0; f < kForks; ++f) {
      seqs.push_back(shared ? pool->fork(prompt) : pool->add());
      if (!shared) feed(seqs.back(), 0, kPrefix);
      feed(seqs.back(), f, kOwn);  // each fork's own tokens (rows f .. f + kOwn of x)
    }
  }
};

template <class T>
void bench_fork_batch(benchmark::State& state, bool shared, int threads) {
  static Layer<T> l;  // the llama-shaped layer (its own pool unused here)
  static ForkPool<T> shared_pool(true), own_pool(false);
  ForkPool<T>& f = shared ? shared_pool : own_pool;
  constexpr std::int64_t d = Layer<T>::d;
  std::vector<T> y(static_cast<std::size_t>(kForks * d));
  std::vector<std::int64_t> pos(1, kPrefix + kOwn);
  std::vector<simdattn::PoolStep> steps;
  for (std::int64_t i = 0; i < kForks; ++i)
    steps.push_back({simdattn::ConstSeqView(l.x.data() + i * d, 1, 1, d), f.seqs[static_cast<std::size_t>(i)],
                     simdattn::SeqView(y.data() + i * d, 1, 1, d), pos});
  simdattn::MhaOptions o;
  o.threads = threads;
  const double flops = 2.0 * kForks * d * (2.0 * d + 2.0 * Layer<T>::nkv);
  simdattn::perf::timed_loop(state, flops, "GFLOP/s", [&] {
    l.layer->forward_pool(steps, *f.pool, 0, o);
    for (const simdattn::KvPool::Sequence s : f.seqs) f.pool->truncate(s, kPrefix + kOwn);
  });
}

int register_all() {
  for (int t : {1, 2}) {
    const std::string ts = "/t" + std::to_string(t);
    for (bool cascade : {true, false}) {
      const std::string a = cascade ? "forks32-cascade" : "forks32-plain";
      benchmark::RegisterBenchmark(("attention/native/" + a + ts).c_str(), bench_forks<float>, cascade, t)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("attention/native/" + a + ".bf16" + ts).c_str(), bench_forks<simdattn::bfloat16>, cascade, t)
          ->Unit(benchmark::kMillisecond);
    }
    for (bool shared : {true, false}) {
      const std::string a = shared ? "forks32-batch" : "forks32-batch-unshared";
      benchmark::RegisterBenchmark(("mha/native/" + a + ts).c_str(), bench_fork_batch<float>, shared, t)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("mha/native/" + a + ".bf16" + ts).c_str(), bench_fork_batch<simdattn::bfloat16>, shared, t)
          ->Unit(benchmark::kMillisecond);
    }
    for (bool as : {false, true}) {
      const std::string a = as ? "tree32-as-decodes" : "tree32-verify", m = as ? "tree32-as-steps" : "tree32-step";
      benchmark::RegisterBenchmark(("attention/native/" + a + ts).c_str(), bench_verify<float>, as, t)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("attention/native/" + a + ".bf16" + ts).c_str(), bench_verify<simdattn::bfloat16>, as, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("mha/native/" + m + ts).c_str(), bench_layer_step<float>, as, t)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("mha/native/" + m + ".bf16" + ts).c_str(), bench_layer_step<simdattn::bfloat16>, as, t)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}
const int registered = register_all();

}  // namespace
