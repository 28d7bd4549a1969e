// simdattn_serve_bench (main.cpp has its usage): the decode and load modes' shared parts.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"

namespace serve {

using namespace simdattn;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode;
  int streams = 8;
  std::int64_t kv = 256, steps = 64;
  int reps = 5;
  std::string json;
  std::string workload = "bert";
  int clients = 8;
  std::vector<int> loads{30, 50, 70};
  double seconds = 2.0;
  int slices = 4;   // load: each measurement's slices, the servers taking turns
  int threads = 0;  // load: each library request's threads
  std::int64_t budget = PoolSchedulerOptions{}.token_budget;  // prefill: the PoolScheduler's token budget
  std::string dtype = "f32";  // cascade: the pool's dtype
};

constexpr std::int64_t kD = 1024, kHeads = 16;

// The gpt-layer stand-in: d_model 1024, 16 heads, f32, random weights (a fixed seed).
MultiHeadAttention gpt_layer();
double median(std::vector<double> v);

int decode(const Args& a);  // decode.cpp
int load(const Args& a);    // load.cpp
int pool(const Args& a);     // pool.cpp: decode over a KvPool
int prefill(const Args& a);  // pool.cpp: chunked prefill beside decoding streams
int memory(const Args& a);   // pool.cpp: the pool's bytes
int cascade(const Args& a);  // cascade.cpp: the cascade rule's measurements

}  // namespace serve
