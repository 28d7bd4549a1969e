// simdattn_serve_bench decode (main.cpp has the mode's description).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "serve/serve.hpp"
#include "simdattn/simdattn.hpp"

namespace serve {

int decode(const Args& a) {
  const MultiHeadAttention layer = gpt_layer();
  const int S = a.streams;
  const std::int64_t G = a.steps;
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.f, 1.f);
  // Each stream: its cache prefilled with kv tokens once (kept across repetitions by truncating
  // back), the tokens of its steps, and the outputs of both modes.
  std::vector<KvCache> caches;
  std::vector<std::vector<float>> x(S), y_alone(S), y_sched(S);
  for (int s = 0; s < S; ++s) {
    caches.emplace_back(layer, 1, a.kv + G);
    std::vector<float> prompt(static_cast<std::size_t>(a.kv * kD)), out(prompt.size());
    for (auto& e : prompt) e = n(rng);
    layer.forward(ConstSeqView(prompt.data(), 1, a.kv, kD), caches.back(), SeqView(out.data(), 1, a.kv, kD));
    x[s].resize(static_cast<std::size_t>(G * kD));
    for (auto& e : x[s]) e = n(rng);
    y_alone[s].assign(x[s].size(), 0.f);
    y_sched[s].assign(x[s].size(), 0.f);
  }
  DecodeScheduler scheduler(layer);
  auto run = [&](bool batched) {
    for (auto& c : caches) c.truncate(0, a.kv);
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (int s = 0; s < S; ++s)
      threads.emplace_back([&, s] {
        for (std::int64_t g = 0; g < G; ++g) {
          const ConstSeqView q(x[s].data() + g * kD, 1, 1, kD);
          auto& y = batched ? y_sched[s] : y_alone[s];
          const SeqView o(y.data() + g * kD, 1, 1, kD);
          if (batched) scheduler.step({q, &caches[s], o});
          else layer.forward(q, caches[s], o);
        }
      });
    for (auto& t : threads) t.join();
    return static_cast<double>(S * G) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  run(false);  // warm-up: buffers, worker teams
  run(true);
  std::vector<double> alone, sched;
  for (int r = 0; r < a.reps; ++r) {
    if (r % 2 == 0) alone.push_back(run(false)), sched.push_back(run(true));
    else sched.push_back(run(true)), alone.push_back(run(false));
  }
  double worst = 0;
  for (int s = 0; s < S; ++s)
    for (std::size_t i = 0; i < x[s].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(y_sched[s][i] - y_alone[s][i])) /
                                  std::max(1.0, static_cast<double>(std::abs(y_alone[s][i]))));
  const double ba = *std::max_element(alone.begin(), alone.end()), bs = *std::max_element(sched.begin(), sched.end());
  std::printf("decode: %d streams, gpt-layer (d_model %lld, %lld heads, f32), %lld cached tokens, %lld steps each, %d reps\n",
              S, static_cast<long long>(kD), static_cast<long long>(kHeads), static_cast<long long>(a.kv),
              static_cast<long long>(G), a.reps);
  std::printf("  alone      tokens/s best %9.1f  median %9.1f\n", ba, median(alone));
  std::printf("  scheduler  tokens/s best %9.1f  median %9.1f  (%zu steps in %zu batches)\n", bs, median(sched),
              scheduler.steps_run(), scheduler.batches());
  std::printf("  scheduler / alone: %.2fx (best), %.2fx (median); max relative difference of the outputs %.2e\n",
              bs / ba, median(sched) / median(alone), worst);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"mode\": \"decode\", \"streams\": " << S << ", \"kv\": " << a.kv << ", \"steps\": " << G
      << ", \"reps\": " << a.reps << ", \"alone_best\": " << ba << ", \"alone_median\": " << median(alone)
      << ", \"scheduler_best\": " << bs << ", \"scheduler_median\": " << median(sched)
      << ", \"batches\": " << scheduler.batches() << ", \"steps_run\": " << scheduler.steps_run()
      << ", \"max_relative_difference\": " << worst << "}\n";
  }
  return worst <= 1e-4 ? 0 : 1;
}

}  // namespace serve
