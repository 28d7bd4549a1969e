// simdattn_serve_bench cascade (main.cpp has the mode's description): the measurements behind
// forward_pool's cascade rule (layer/cache/pool_core.hpp's cascade_pays).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "layer/cache/pool_core.hpp"
#include "serve/serve.hpp"
#include "simdattn/simdattn.hpp"

namespace serve {
namespace {

constexpr std::int64_t kH = 32, kHkv = 8, kHd = 128, kBs = 16, kOwn = 64;

struct Row {
  std::int64_t members, shared, tokens;
  double plain_us, cascade_us;
  bool rule;
};

// m sequences sharing `shared` keys (whole blocks), kOwn keys each of their own, `tokens` new
// tokens each (in the cache), in a shuffled table: one attention_paged call over every key,
// against the prefix once for every sequence's tokens + each sequence's own keys + the merge.
// Best of 7 rounds of >= 30 ms each, the two interleaved.
template <class T>
Row measure(DType pool, std::int64_t m, std::int64_t shared, std::int64_t tokens, int threads) {
  const bool codes = pool == DType::int8;
  const std::int64_t pb = shared / kBs, ob = (kOwn + tokens + kBs - 1) / kBs, blocks = pb + m * ob, all = pb + ob;
  const std::int64_t elems = blocks * kBs * kHkv * kHd, rows = m * tokens;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<T> k(static_cast<std::size_t>(codes ? 0 : elems)), v(k.size()), q(static_cast<std::size_t>(rows * kH * kHd));
  std::vector<std::int8_t> k8(static_cast<std::size_t>(codes ? elems : 0)), v8(k8.size());
  std::vector<float> scales(static_cast<std::size_t>(blocks * kBs * kHkv), 0.02f);
  for (auto* x : {&k, &v, &q})
    for (T& e : *x) e = detail::narrow<T>(n(rng));
  for (auto* x : {&k8, &v8})
    for (auto& e : *x) e = static_cast<std::int8_t>(static_cast<int>(rng() % 255) - 127);
  std::vector<T> out(q.size()), prefix_out(q.size());
  std::vector<float> prefix_lse(static_cast<std::size_t>(rows * kH)), own_lse(prefix_lse.size());
  std::vector<std::int32_t> order(static_cast<std::size_t>(blocks)), table, own;
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (std::int64_t f = 0; f < m; ++f) {
    for (std::int64_t c = 0; c < pb; ++c) table.push_back(order[static_cast<std::size_t>(c)]);
    for (std::int64_t c = 0; c < ob; ++c) {
      table.push_back(order[static_cast<std::size_t>(pb + f * ob + c)]);
      own.push_back(table.back());
    }
  }
  const Shape4 shape{blocks, kBs, kHkv, kHd};
  const ConstTensorView kc = codes ? ConstTensorView(k8.data(), DType::int8, shape) : ConstTensorView(k.data(), shape);
  const ConstTensorView vc = codes ? ConstTensorView(v8.data(), DType::int8, shape) : ConstTensorView(v.data(), shape);
  const std::vector<std::int64_t> lens(static_cast<std::size_t>(m), shared + kOwn + tokens), own_lens(lens.size(), kOwn + tokens);
  std::vector<std::int64_t> starts(static_cast<std::size_t>(m + 1));
  for (std::int64_t i = 0; i <= m; ++i) starts[static_cast<std::size_t>(i)] = i * tokens;
  const std::int64_t prefix_len = shared, prefix_starts[2] = {0, rows};
  PagedAttentionOptions plain, pre, suf;
  for (PagedAttentionOptions* o : {&plain, &pre, &suf}) {
    o->threads = threads;
    if (codes) o->k_scale = o->v_scale = ConstTensorView(scales.data(), {blocks, kBs, kHkv, 1});
  }
  plain.query_start = suf.query_start = starts;
  pre.query_start = prefix_starts;
  pre.causal = Causal::none;  // every sequence's tokens follow the whole prefix
  pre.lse = TensorView(prefix_lse.data(), {1, rows, kH, 1});
  suf.lse = TensorView(own_lse.data(), {1, rows, kH, 1});
  const ConstTensorView qv(q.data(), {1, rows, kH, kHd});
  const TensorView ov(out.data(), {1, rows, kH, kHd}), pv(prefix_out.data(), {1, rows, kH, kHd});
  auto run_plain = [&] { attention_paged(qv, kc, vc, BlockTable{table.data(), m, all, all}, lens, ov, plain); };
  auto run_cascade = [&] {
    attention_paged(qv, kc, vc, BlockTable{table.data(), 1, pb, pb}, {&prefix_len, 1}, pv, pre);
    attention_paged(qv, kc, vc, BlockTable{own.data(), m, ob, ob}, own_lens, ov, suf);
    merge_attention_states(pv, pre.lse, ov, suf.lse, ov, suf.lse);
  };
  double best[2] = {1e30, 1e30};
  for (int round = 0; round < 7; ++round)
    for (int which = 0; which < 2; ++which) {
      const auto t0 = Clock::now();
      int calls = 0;
      do {
        if (which == 0) run_plain();
        else run_cascade();
        ++calls;
      } while (Clock::now() - t0 < std::chrono::milliseconds(30));
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / calls;
      best[which] = std::min(best[which], us);
    }
  const std::int64_t key_bytes = kHkv * 2 * (kHd * static_cast<std::int64_t>(dtype_size(pool)) + (codes ? 4 : 0));
  return {m, shared, tokens, best[0], best[1], detail::cascade_pays(m, shared, m * tokens, key_bytes)};
}

}  // namespace

// The grid: 2-32 sequences, 64-2048 shared keys, 1-64 new tokens each (at most 512 in all and no
// more than the shared keys), 32 heads over 8 kv heads of 128, blocks of 16, in a pool of `dtype`.
int cascade(const Args& a) {
  if (a.dtype != "f32" && a.dtype != "bf16" && a.dtype != "int8") {
    std::fprintf(stderr, "simdattn_serve_bench: --dtype: expected f32, bf16 or int8, got '%s'\n", a.dtype.c_str());
    return 2;
  }
  const int threads = a.threads == 0 ? 2 : a.threads;
  std::vector<Row> rows;
  std::printf("cascade: %s pool, %d threads: plain = one attention_paged call; cascade = prefix + own keys + merge\n",
              a.dtype.c_str(), threads);
  std::printf("%8s %8s %8s %12s %12s %12s %8s %6s\n", "members", "shared", "tokens", "shared_MiB", "plain_us", "cascade_us",
              "speedup", "rule");
  for (const std::int64_t tokens : {1, 4, 16, 64})
    for (const std::int64_t m : {2, 4, 8, 32})
      for (const std::int64_t shared : {64, 128, 256, 512, 2048}) {
        if (m * tokens > 512 || m * tokens > shared) continue;
        const Row r = a.dtype == "bf16" ? measure<bfloat16>(DType::bf16, m, shared, tokens, threads)
                                        : measure<float>(a.dtype == "int8" ? DType::int8 : DType::f32, m, shared, tokens, threads);
        const double bytes = static_cast<double>(m * shared * kHkv * 2) *
                             (a.dtype == "f32" ? 4.0 * kHd : a.dtype == "bf16" ? 2.0 * kHd : kHd + 4.0);
        std::printf("%8lld %8lld %8lld %12.1f %12.1f %12.1f %7.2fx %6s\n", static_cast<long long>(m),
                    static_cast<long long>(shared), static_cast<long long>(tokens), bytes / (1 << 20), r.plain_us,
                    r.cascade_us, r.plain_us / r.cascade_us, r.rule ? "yes" : "no");
        std::fflush(stdout);
        rows.push_back(r);
      }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"dtype\": \"" << a.dtype << "\", \"threads\": " << threads << ", \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i)
      f << (i ? ", " : "") << "{\"members\": " << rows[i].members << ", \"shared\": " << rows[i].shared
        << ", \"tokens\": " << rows[i].tokens << ", \"plain_us\": " << rows[i].plain_us
        << ", \"cascade_us\": " << rows[i].cascade_us << ", \"rule\": " << (rows[i].rule ? "true" : "false") << "}";
    f << "]}\n";
  }
  return 0;
}

}  // namespace serve
