// simdattn_serve_bench pool | prefill | memory (main.cpp has the modes' descriptions).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "serve/serve.hpp"
#include "simdattn/simdattn.hpp"

namespace serve {
namespace {

std::vector<float> random_rows(std::mt19937& rng, std::int64_t rows, std::int64_t width = kD) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(rows * width));
  for (auto& e : x) e = n(rng);
  return x;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

// Decode throughput: S streams each alone (a thread each, forward with a KvCache) against the
// same streams as one forward_pool call per step ("pool": the batched step in a loop) and
// through a PoolScheduler (a request thread each).
int pool(const Args& a) {
  const MultiHeadAttention layer = gpt_layer();
  const int S = a.streams;
  const std::int64_t G = a.steps, N = a.kv;
  std::mt19937 rng(7);
  KvPool kvpool(layer, S * ((N + G) / kDefaultBlockSize + 2));
  std::vector<KvCache> caches;
  std::vector<KvPool::Sequence> seqs;
  std::vector<std::vector<float>> x(S), y_alone(S), y_pool(S), y_sched(S);
  for (int s = 0; s < S; ++s) {
    const std::vector<float> prompt = random_rows(rng, N);
    std::vector<float> out(prompt.size());
    caches.emplace_back(layer, 1, N + G);
    layer.forward(ConstSeqView(prompt.data(), 1, N, kD), caches.back(), SeqView(out.data(), 1, N, kD));
    seqs.push_back(kvpool.add());
    const PoolStep p{ConstSeqView(prompt.data(), 1, N, kD), seqs.back(), SeqView(out.data(), 1, N, kD)};
    layer.forward_pool({&p, 1}, kvpool);
    x[s] = random_rows(rng, G);
    y_alone[s].assign(x[s].size(), 0.f), y_pool[s] = y_sched[s] = y_alone[s];
  }
  auto reset = [&] {
    for (auto& c : caches) c.truncate(0, N);
    for (auto q : seqs) kvpool.truncate(q, N);
  };
  auto alone = [&] {
    reset();
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (int s = 0; s < S; ++s)
      threads.emplace_back([&, s] {
        for (std::int64_t g = 0; g < G; ++g)
          layer.forward(ConstSeqView(x[s].data() + g * kD, 1, 1, kD), caches[s], SeqView(y_alone[s].data() + g * kD, 1, 1, kD));
      });
    for (auto& t : threads) t.join();
    return double(S * G) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto batched = [&] {
    reset();
    std::vector<PoolStep> steps(static_cast<std::size_t>(S));
    const auto t0 = Clock::now();
    for (std::int64_t g = 0; g < G; ++g) {
      for (int s = 0; s < S; ++s)
        steps[static_cast<std::size_t>(s)] = {ConstSeqView(x[s].data() + g * kD, 1, 1, kD), seqs[static_cast<std::size_t>(s)],
                                              SeqView(y_pool[s].data() + g * kD, 1, 1, kD)};
      layer.forward_pool(steps, kvpool);
    }
    return double(S * G) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto scheduled = [&] {
    reset();
    PoolScheduler sched(layer, kvpool);
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (int s = 0; s < S; ++s)
      threads.emplace_back([&, s] {
        for (std::int64_t g = 0; g < G; ++g)
          sched.step({ConstSeqView(x[s].data() + g * kD, 1, 1, kD), seqs[static_cast<std::size_t>(s)],
                      SeqView(y_sched[s].data() + g * kD, 1, 1, kD)});
      });
    for (auto& t : threads) t.join();
    return double(S * G) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  alone(), batched(), scheduled();  // warm-up
  std::vector<double> ra, rb, rs;
  for (int r = 0; r < a.reps; ++r) {
    if (r % 2 == 0) ra.push_back(alone()), rb.push_back(batched()), rs.push_back(scheduled());
    else rs.push_back(scheduled()), rb.push_back(batched()), ra.push_back(alone());
  }
  double worst = 0;
  for (int s = 0; s < S; ++s)
    for (std::size_t i = 0; i < x[s].size(); ++i)
      for (const auto* y : {&y_pool[s], &y_sched[s]})
        worst = std::max(worst, double(std::abs((*y)[i] - y_alone[s][i])) / std::max(1.0, double(std::abs(y_alone[s][i]))));
  const double ba = *std::max_element(ra.begin(), ra.end()), bb = *std::max_element(rb.begin(), rb.end()),
               bs = *std::max_element(rs.begin(), rs.end());
  const double bytes = 4.0 * kD * kD * 4 + double(S) * double(N) * 2 * kD * 4;  // a batched step's reads
  std::printf("pool: %d streams, gpt-layer (d_model %lld, f32), %lld cached tokens, %lld steps each, %d reps\n", S,
              static_cast<long long>(kD), static_cast<long long>(N), static_cast<long long>(G), a.reps);
  std::printf("  alone      tokens/s best %9.1f  median %9.1f\n", ba, median(ra));
  std::printf("  pool step  tokens/s best %9.1f  median %9.1f  (%.1f GB/s of weights and K/V read)\n", bb, median(rb),
              bytes * bb / S * 1e-9);
  std::printf("  scheduler  tokens/s best %9.1f  median %9.1f\n", bs, median(rs));
  std::printf("  pool step / alone %.2fx, scheduler / alone %.2fx (best); max relative difference %.2e\n", bb / ba,
              bs / ba, worst);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"mode\": \"pool\", \"streams\": " << S << ", \"kv\": " << N << ", \"alone_best\": " << ba
      << ", \"pool_best\": " << bb << ", \"scheduler_best\": " << bs << ", \"pool_gbps\": " << bytes * bb / S * 1e-9
      << ", \"max_relative_difference\": " << worst << "}\n";
  }
  return worst <= 1e-4 ? 0 : 1;
}

// Chunked prefill: S streams decoding through a PoolScheduler, their step latencies without and
// with a `kv`-token prompt joining (token budget `budget`); the prompt's prefill time beside them
// against alone.
int prefill(const Args& a) {
  const MultiHeadAttention layer = gpt_layer();
  const int S = a.streams;
  const std::int64_t P = a.kv, G = a.steps, warm = 256;
  std::mt19937 rng(8);
  KvPool kvpool(layer, (S * (warm + G) + P) / kDefaultBlockSize + S + 8);
  PoolSchedulerOptions o;
  o.token_budget = a.budget;
  PoolScheduler sched(layer, kvpool, o);
  const std::vector<float> warm_x = random_rows(rng, warm), prompt = random_rows(rng, P);
  std::vector<std::vector<float>> x(S);
  for (auto& e : x) e = random_rows(rng, G);
  std::vector<float> warm_y(warm_x.size()), prompt_out(prompt.size());
  auto prefill_alone = [&] {  // the prompt with nothing beside it
    const KvPool::Sequence q = sched.open();
    const auto t0 = Clock::now();
    sched.step({ConstSeqView(prompt.data(), 1, P, kD), q, SeqView(prompt_out.data(), 1, P, kD)});
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    sched.close(q);
    return t;
  };
  // S fresh streams of `warm` tokens decode G steps; with the prompt joining once a quarter of
  // their steps ran. The latencies of the steps from then on, and the prompt's time.
  auto run = [&](bool with_prompt, double& prompt_seconds) {
    std::vector<KvPool::Sequence> seqs;
    for (int s = 0; s < S; ++s) {
      seqs.push_back(sched.open());
      sched.step({ConstSeqView(warm_x.data(), 1, warm, kD), seqs.back(), SeqView(warm_y.data(), 1, warm, kD)});
    }
    std::vector<std::vector<double>> lat(S);
    std::vector<std::thread> threads;
    std::atomic<int> quarter{0};
    for (int s = 0; s < S; ++s)
      threads.emplace_back([&, s] {
        std::vector<float> y(kD);
        for (std::int64_t g = 0; g < G; ++g) {
          if (g == G / 4) ++quarter;
          const auto t0 = Clock::now();
          sched.step({ConstSeqView(x[s].data() + g * kD, 1, 1, kD), seqs[static_cast<std::size_t>(s)],
                      SeqView(y.data(), 1, 1, kD)});
          if (g >= G / 4) lat[s].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      });
    if (with_prompt) {
      while (quarter.load() < S) std::this_thread::yield();
      prompt_seconds = prefill_alone();  // (beside the streams now)
    }
    for (auto& t : threads) t.join();
    for (auto q : seqs) sched.close(q);
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    return all;
  };
  double unused = 0, with = 0;
  std::vector<double> base_p99, with_p99, with_prompt_s, alone_prompt_s;
  for (int r = 0; r < a.reps; ++r) {
    base_p99.push_back(percentile(run(false, unused), 0.99));
    with_p99.push_back(percentile(run(true, with), 0.99));
    with_prompt_s.push_back(with);
    alone_prompt_s.push_back(prefill_alone());
  }
  const double b = median(base_p99), w = median(with_p99), pa = median(alone_prompt_s), pw = median(with_prompt_s);
  std::printf("prefill: %d streams decoding (gpt-layer, f32, %lld cached tokens), a %lld-token prompt joining in "
              "chunks (token budget %lld), %d reps (medians)\n",
              S, static_cast<long long>(warm), static_cast<long long>(P), static_cast<long long>(a.budget), a.reps);
  std::printf("  streams' p99 step latency: %.2f ms without the prompt, %.2f ms while it is prefilled: %.2fx\n", b * 1e3,
              w * 1e3, w / b);
  std::printf("  the prompt's prefill: %.3f s alone, %.3f s beside the streams: %.0f%% of its speed alone\n", pa, pw,
              100.0 * pa / pw);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"mode\": \"prefill\", \"streams\": " << S << ", \"prompt\": " << P << ", \"p99_without\": " << b
      << ", \"p99_with\": " << w << ", \"prompt_alone\": " << pa << ", \"prompt_beside\": " << pw << "}\n";
  }
  return 0;
}

// Memory: 64 sequences of random lengths 100-4000 in a pool against their tokens' bytes and
// against 4096-token slabs; 32 sequences forked from one 2048-token prompt, one token each.
int memory(const Args& a) {
  MhaWeights<float> w;
  w.wq = w.wk = w.wv = w.wo = std::vector<float>(64 * 64, 0.01f);
  const MultiHeadAttention layer(MhaConfig{.d_model = 64, .heads = 1}, std::move(w));
  std::mt19937 rng(12);
  std::uniform_int_distribution<std::int64_t> len(100, 4000);
  const double per_token = 2.0 * 64 * 4;  // K and V of one token
  KvPool kvpool(layer, 64 * (4000 / kDefaultBlockSize + 1));
  const std::int64_t block_bytes = kvpool.bytes() / kvpool.num_blocks();
  std::int64_t tokens = 0;
  for (int s = 0; s < 64; ++s) {
    const std::int64_t n = len(rng);
    const std::vector<float> x = random_rows(rng, n, 64);
    std::vector<float> y(x.size());
    const PoolStep p{ConstSeqView(x.data(), 1, n, 64), kvpool.add(), SeqView(y.data(), 1, n, 64)};
    layer.forward_pool({&p, 1}, kvpool);
    tokens += n;
  }
  const double used = double(kvpool.num_blocks() - kvpool.free_blocks()) * double(block_bytes);
  const double need = double(tokens) * per_token, slabs = 64.0 * 4096 * per_token;
  std::printf("memory: 64 sequences of 100-4000 tokens (%lld in all), blocks of %lld\n", static_cast<long long>(tokens),
              static_cast<long long>(kDefaultBlockSize));
  std::printf("  pool %.1f MiB = %.3fx their tokens' %.1f MiB; 4096-token slabs %.1f MiB = %.2fx\n", used / 1048576,
              used / need, need / 1048576, slabs / 1048576, slabs / need);
  KvPool shared(layer, 2048 / kDefaultBlockSize + 64);
  const std::vector<float> px = random_rows(rng, 2048, 64);
  std::vector<float> py(px.size());
  const KvPool::Sequence root = shared.add();
  const PoolStep p{ConstSeqView(px.data(), 1, 2048, 64), root, SeqView(py.data(), 1, 2048, 64)};
  layer.forward_pool({&p, 1}, shared);
  const std::int64_t prompt_blocks = shared.num_blocks() - shared.free_blocks();
  std::vector<KvPool::Sequence> forks;
  std::vector<float> one(64, 0.1f), out(64);
  std::vector<PoolStep> steps;
  for (int i = 0; i < 32; ++i) {
    forks.push_back(shared.fork(root));
    steps.push_back({ConstSeqView(one.data(), 1, 1, 64), forks.back(), SeqView(out.data(), 1, 1, 64)});
  }
  for (const PoolStep& st : steps) layer.forward_pool({&st, 1}, shared);
  const std::int64_t used_shared = shared.num_blocks() - shared.free_blocks();
  std::printf("  32 forks of a 2048-token prompt, one new token each: %lld blocks (the prompt's %lld once, plus %lld)"
              " against %lld unshared\n",
              static_cast<long long>(used_shared), static_cast<long long>(prompt_blocks),
              static_cast<long long>(used_shared - prompt_blocks), static_cast<long long>(33 * prompt_blocks + 32));
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"mode\": \"memory\", \"sequences\": 64, \"tokens\": " << tokens << ", \"block_size\": " << kDefaultBlockSize
      << ", \"pool_bytes\": " << used << ", \"token_bytes\": " << need << ", \"slab_bytes\": " << slabs
      << ", \"forks\": 32, \"fork_prompt_tokens\": 2048, \"fork_blocks\": " << used_shared
      << ", \"prompt_blocks\": " << prompt_blocks << ", \"unshared_blocks\": " << 33 * prompt_blocks + 32 << "}\n";
  }
  return used / need <= 1.1 && used_shared == prompt_blocks + 32 ? 0 : 1;
}

}  // namespace serve
