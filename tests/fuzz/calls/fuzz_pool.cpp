// libFuzzer target: a KvPool driven by a sequence of operations taken from the input (add, fork,
// truncate, accept, release and forward_pool steps, some with a tree mask), their arguments mostly
// valid and sometimes not (handles that do not exist, lengths and kept lists out of range, a layer
// past the pool's, more tokens than free blocks), on pools of every dtype, block size and layer
// count, for an ordinary layer and a Multi-head Latent Attention one (its latent rows). After every
// operation the pool is checked against a model of it kept here: every live sequence's rows in
// every layer (K, V and an 8-bit pool's scales, byte for byte: a fork's write never changes its
// parent, accept moves exactly the kept rows), each block table as long as its sequence needs, and
// the free blocks exactly those no sequence holds. A call that throws simdattn::Error must leave
// the pool as it was; any other outcome (a crash, a read or write out of bounds under
// AddressSanitizer, a model that disagrees) aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input.hpp"
#include "simdattn/error.hpp"
#include "simdattn/kv_pool.hpp"
#include "simdattn/mha.hpp"

namespace {

using namespace simdattn;

constexpr std::int64_t kD = 8, kHeads = 2, kKvHeads = 1, kHd = 4;

std::vector<float> weights(std::int64_t n, float s) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = s * static_cast<float>((i * 7 + 3) % 11) - 5.0f * s;
  return x;
}

// The layers the pools serve: an ordinary one (2 heads over 1 kv head, RoPE) and a Multi-head
// Latent Attention one (2 heads over one latent row of kv_lora_rank 6 + rope 4 a token).
const MultiHeadAttention& layer(bool mla) {
  static const MultiHeadAttention plain = [] {
    MhaConfig c{.d_model = kD, .heads = kHeads, .kv_heads = kKvHeads, .head_dim = kHd};
    c.rope = RopeConfig{.theta = 10000.0};
    const std::int64_t nkv = kKvHeads * kHd;
    return MultiHeadAttention(c, MhaWeights<float>{weights(kD * kD, 0.05f),
                                                   weights(nkv * kD, 0.07f),
                                                   weights(nkv * kD, 0.03f),
                                                   weights(kD * kD, 0.05f),
                                                   {},
                                                   {},
                                                   {},
                                                   {}});
  }();
  static const MultiHeadAttention latent = [] {
    constexpr std::int64_t nope = 2, rope = 4, rank = 6, vd = 3;
    MhaConfig c{.d_model = kD, .heads = kHeads};
    c.rope = RopeConfig{.theta = 10000.0};
    c.mla = MlaConfig{.kv_lora_rank = rank, .qk_nope_head_dim = nope, .qk_rope_head_dim = rope, .v_head_dim = vd};
    MlaWeights<float> w;
    w.wq = weights(kHeads * (nope + rope) * kD, 0.05f);
    w.wkv_a = weights((rank + rope) * kD, 0.07f);
    w.kv_a_norm.assign(rank, 1.0f);
    w.wkv_b = weights(kHeads * (nope + vd) * rank, 0.03f);
    w.wo = weights(kD * kHeads * vd, 0.05f);
    return MultiHeadAttention(c, std::move(w));
  }();
  return mla ? latent : plain;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_pool: %s\n", what.c_str());
  std::abort();
}

// One token's rows in one layer, as bytes: K's and V's rows of every kv head, then their scales.
using Row = std::string;

Row read_row(const KvPool& pool, std::int64_t layer_index, std::int32_t block, std::int64_t slot) {
  Row r;
  auto take = [&](const ConstTensorView& v) {
    if (v.empty()) return;
    const std::size_t es = dtype_size(v.dtype);
    for (std::int64_t h = 0; h < v.shape[2]; ++h)
      for (std::int64_t d = 0; d < v.shape[3]; ++d) {
        const auto* p = static_cast<const char*>(v.data) +
                        (block * v.strides[0] + slot * v.strides[1] + h * v.strides[2] + d * v.strides[3]) *
                            static_cast<std::int64_t>(es);
        r.append(p, es);
      }
  };
  take(pool.keys(layer_index));
  take(pool.values(layer_index));
  take(pool.key_scales(layer_index));
  take(pool.value_scales(layer_index));
  return r;
}

// The model: each live sequence's rows, per layer.
using Model = std::map<KvPool::Sequence, std::vector<std::vector<Row>>>;

std::vector<std::vector<Row>> read_sequence(const KvPool& pool, KvPool::Sequence s) {
  std::vector<std::vector<Row>> layers(static_cast<std::size_t>(pool.layers()));
  const auto table = pool.block_table(s);
  for (std::int64_t l = 0; l < pool.layers(); ++l)
    for (std::int64_t t = 0; t < pool.length(s, l); ++t)
      layers[static_cast<std::size_t>(l)].push_back(
          read_row(pool, l, table[static_cast<std::size_t>(t / pool.block_size())], t % pool.block_size()));
  return layers;
}

void check(const KvPool& pool, const Model& model, const char* after) {
  if (pool.sequences() != static_cast<std::int64_t>(model.size())) fail(std::string("sequence count after ") + after);
  std::set<std::int32_t> held;
  for (const auto& [s, layers] : model) {
    if (!pool.contains(s)) fail(std::string("a live sequence lost after ") + after);
    std::int64_t longest = 0;
    for (std::int64_t l = 0; l < pool.layers(); ++l) {
      if (pool.length(s, l) != static_cast<std::int64_t>(layers[static_cast<std::size_t>(l)].size()))
        fail(std::string("a layer's length after ") + after);
      longest = std::max<std::int64_t>(longest, pool.length(s, l));
    }
    const auto table = pool.block_table(s);
    if (static_cast<std::int64_t>(table.size()) != (longest + pool.block_size() - 1) / pool.block_size())
      fail(std::string("a block table's length after ") + after);
    for (auto b : table) {
      if (b < 0 || b >= pool.num_blocks()) fail(std::string("a block index after ") + after);
      held.insert(b);
    }
    if (read_sequence(pool, s) != layers) fail(std::string("a sequence's rows after ") + after);
  }
  if (pool.free_blocks() != pool.num_blocks() - static_cast<std::int64_t>(held.size()))
    fail(std::string("the free blocks after ") + after);
}

KvPool::Sequence pick(Bytes& in, const Model& model) {
  if (model.empty() || in.next(8) == 0) return in.in(-2, 9);  // perhaps no such sequence
  auto it = model.begin();
  std::advance(it, static_cast<long>(in.next(static_cast<unsigned>(model.size()))));
  return it->first;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in{data, size};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::int8, DType::fp8_e4m3, DType::fp8_e5m2};
  const MultiHeadAttention& attn = layer(in.next(3) == 0);
  KvPool pool(attn, in.in(1, 12), in.in(1, 5), in.in(1, 2), dtypes[in.next(6)]);
  Model model;
  for (int op = 0; op < 48 && in.n > 0; ++op) {
    const unsigned kind = in.next(6);
    const Model before = model;
    const char* name = "?";
    try {
      if (kind == 0) {
        name = "add";
        const auto s = pool.add();
        model[s] = std::vector<std::vector<Row>>(static_cast<std::size_t>(pool.layers()));
      } else if (kind == 1) {
        name = "fork";
        const auto parent = pick(in, model);
        const auto s = pool.fork(parent);
        model[s] = model.at(parent);
      } else if (kind == 2) {
        name = "truncate";
        const auto s = pick(in, model);
        const std::int64_t len = in.next(6) == 0 ? in.in(-2, 40) : in.in(0, model.count(s) ? pool.length(s) : 3);
        pool.truncate(s, len);
        for (auto& rows : model.at(s))
          if (static_cast<std::int64_t>(rows.size()) > len) rows.resize(static_cast<std::size_t>(len));
      } else if (kind == 3) {
        name = "accept";
        const auto s = pick(in, model);
        const std::int64_t length = model.count(s) ? pool.length(s) : 3;
        const std::int64_t first = in.next(8) == 0 ? in.in(-2, length + 2) : in.in(0, length);
        std::vector<std::int64_t> kept;
        std::int64_t next = in.next(8) == 0 ? -1 : 0;
        const std::int64_t count = in.in(0, 6);
        for (std::int64_t i = 0; i < count; ++i) {
          next += in.next(8) == 0 ? -1 : in.in(0, 2);
          kept.push_back(next++);
        }
        pool.accept(s, first, kept);
        for (auto& rows : model.at(s)) {
          std::vector<Row> now(rows.begin(),
                               rows.begin() + std::min<std::int64_t>(first, static_cast<std::int64_t>(rows.size())));
          for (auto k : kept)
            if (first + k < static_cast<std::int64_t>(rows.size()))
              now.push_back(rows[static_cast<std::size_t>(first + k)]);
          rows = now;
        }
      } else if (kind == 4) {
        name = "release";
        const auto s = pick(in, model);
        pool.release(s);
        model.erase(s);
      } else {
        name = "forward_pool";
        const std::int64_t layer_index = in.next(10) == 0 ? in.in(-1, 3) : in.in(0, pool.layers() - 1);
        const std::int64_t n = in.in(1, 2);
        std::vector<std::vector<float>> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
        std::vector<std::vector<std::uint8_t>> masks(static_cast<std::size_t>(n));
        std::vector<PoolStep> steps;
        for (std::int64_t i = 0; i < n; ++i) {
          const auto s = pick(in, model);
          const std::int64_t t = in.in(1, 6);
          auto& xi = x[static_cast<std::size_t>(i)];
          xi.resize(static_cast<std::size_t>(t * kD));
          for (auto& e : xi) e = static_cast<float>(in.in(-8, 8)) * 0.25f;
          y[static_cast<std::size_t>(i)].assign(xi.size(), 0.0f);
          PoolStep step{ConstSeqView(xi.data(), 1, t, kD), s, SeqView(y[static_cast<std::size_t>(i)].data(), 1, t, kD)};
          if (in.next(3) == 0) {  // a draft tree: each token sees itself and tokens before it, at random
            auto& m = masks[static_cast<std::size_t>(i)];
            m.assign(static_cast<std::size_t>(t * t), 0);
            for (std::int64_t j = 0; j < t; ++j)
              for (std::int64_t j2 = 0; j2 <= j; ++j2) m[static_cast<std::size_t>(j * t + j2)] = j2 == j || in.next(2);
            step.tree_mask = m;
          }
          steps.push_back(step);
        }
        attn.forward_pool(steps, pool, layer_index);
        for (const auto& step : steps) {  // the appended rows, read back; the others are checked below
          auto& rows = model.at(step.sequence)[static_cast<std::size_t>(layer_index)];
          const auto now = read_sequence(pool, step.sequence)[static_cast<std::size_t>(layer_index)];
          if (now.size() != rows.size() + static_cast<std::size_t>(step.query.S))
            fail("forward_pool's appended length");
          rows.insert(rows.end(), now.begin() + static_cast<long>(rows.size()), now.end());
        }
      }
    } catch (const Error&) {
      model = before;
    } catch (const std::out_of_range&) {  // model.at: the pool accepted a handle the model does not hold
      fail(std::string(name) + " accepted a sequence that does not exist");
    }
    check(pool, model, name);
  }
  return 0;
}
