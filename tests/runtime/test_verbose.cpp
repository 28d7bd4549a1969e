// Verbose mode (engine/src/runtime/verbose.hpp, docs/design.md "Verbose mode"): with it on, every
// public call writes one whole `simdattn: key=value ...` line on the real stderr (fd 2, redirected
// here to a file), also when threads call at once; path= is the path the native path table
// chooses; a layer's call writes one line naming its attention core's path (the core's own
// attention() writes none); with it off nothing is written.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention/native/native.hpp"
#include "core/validate/validate.hpp"
#include "layer/cache/pool_core.hpp"
#include "simdattn/simdattn.hpp"
#include "support/test_util.hpp"

using namespace simdattn;

namespace {

// Runs fn with fd 2 on a scratch file; returns what was written there.
template <class Fn>
std::string captured_stderr(Fn&& fn) {
  const std::string path = test::temp_path("verbose_stderr.txt");
  const int file = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  REQUIRE(file >= 0);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(::dup2(file, STDERR_FILENO) == STDERR_FILENO);
  ::close(file);
  try {
    fn();
  } catch (...) {
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  return text.str();
}

using Fields = std::map<std::string, std::string>;

// One line's fields; fails the test if the line is not "simdattn:" then key=value fields.
Fields parse_line(const std::string& line) {
  std::istringstream words(line);
  std::string word;
  words >> word;
  CHECK_MESSAGE(word == "simdattn:", line);
  Fields f;
  while (words >> word) {
    const std::size_t eq = word.find('=');
    CHECK_MESSAGE((eq != std::string::npos && eq > 0 && eq + 1 < word.size()), "field '" << word << "' in: " << line);
    if (eq == std::string::npos) continue;
    CHECK_MESSAGE(f.count(word.substr(0, eq)) == 0, "key twice in: " << line);
    f[word.substr(0, eq)] = word.substr(eq + 1);
  }
  for (const char* key : {"op", "backend", "path", "not", "isa", "dtype", "kv_dtype", "opts", "threads", "runtime", "time_us"})
    CHECK_MESSAGE(f.count(key) == 1, "no " << key << "= in: " << line);
  return f;
}

std::vector<Fields> parse_lines(const std::string& text) {
  std::vector<Fields> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) out.push_back(parse_line(line));
  CHECK((text.empty() || text.back() == '\n'));
  return out;
}

// The path the native backend takes for these tensors, from its path table.
template <class T>
std::string native_path(const test::Qkv<T>& t, test::Buffer<T>& out) {
  const detail::Problem p = detail::make_problem(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), {});
  return std::string(detail::choose_native_path(p).path->name);
}

// Turns verbose mode on for a scope, and off again after.
struct VerboseOn {
  VerboseOn() { set_verbose(true); }
  ~VerboseOn() { set_verbose(false); }
};

}  // namespace

TEST_CASE("verbose mode: one whole line per call from concurrent threads, path= the path taken") {
  std::mt19937_64 rng(test::base_seed() + 71);
  // a prefill (fused), a decode step (decode) and a bf16 decode step (decode16)
  const auto prefill = test::random_qkv<float>(rng, 1, 4, 4, 128, 128, 64);
  const auto decode = test::random_qkv<float>(rng, 1, 4, 2, 1, 200, 64);
  const auto decode16 = test::random_qkv<bfloat16>(rng, 2, 4, 4, 1, 77, 32);
  test::Buffer<float> out_prefill({1, 4, 128, 64}), out_decode({1, 4, 1, 64});
  test::Buffer<bfloat16> out_decode16({2, 4, 1, 32});
  const std::map<std::string, std::string> path_of_q = {
      {"1x4x128x64", native_path(prefill, out_prefill)},
      {"1x4x1x64", native_path(decode, out_decode)},
      {"2x4x1x32", native_path(decode16, out_decode16)}};
  CHECK(path_of_q.at("1x4x128x64") == "fused");
  CHECK(path_of_q.at("1x4x1x64") == "decode");
  CHECK(path_of_q.at("2x4x1x32") == "decode16");

  constexpr int kThreads = 4, kCallsEach = 30;
  const std::string text = captured_stderr([&] {
    const VerboseOn on;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        // each thread its own outputs; every call computes (the same inputs each time)
        test::Buffer<float> o1({1, 4, 128, 64}), o2({1, 4, 1, 64});
        test::Buffer<bfloat16> o3({2, 4, 1, 32});
        AttentionOptions causal;
        causal.causal = Causal::top_left;
        causal.threads = 1 + t % 2;
        for (int i = 0; i < kCallsEach; ++i) {
          if (i % 3 == 0) attention(prefill.q.cview(), prefill.k.cview(), prefill.v.cview(), o1.view(), causal);
          if (i % 3 == 1) attention(decode.q.cview(), decode.k.cview(), decode.v.cview(), o2.view());
          if (i % 3 == 2) attention(decode16.q.cview(), decode16.k.cview(), decode16.v.cview(), o3.view());
        }
      });
    for (auto& th : threads) th.join();
  });
  const std::vector<Fields> lines = parse_lines(text);
  CHECK(lines.size() == std::size_t(kThreads * kCallsEach));
  std::map<std::string, int> per_path;
  for (const Fields& f : lines) {
    CHECK(f.at("op") == "attention");
    CHECK(f.at("backend") == "native");
    CHECK(f.at("isa") == runtime_info().isa);
    REQUIRE(path_of_q.count(f.at("q")) == 1);
    CHECK_MESSAGE(f.at("path") == path_of_q.at(f.at("q")), f.at("q"));
    ++per_path[f.at("path")];
    CHECK(std::stod(f.at("time_us")) > 0.0);
    CHECK(std::stoi(f.at("threads")) >= 1);
    CHECK(f.at("runtime") == thread_runtime_name(thread_runtime()));
    if (f.at("path") == "fused") {
      CHECK(f.at("opts").find("causal:top-left") != std::string::npos);
      CHECK(f.at("k") == "1x4x128x64");
      // every faster path declined, each as name:reason
      CHECK(f.at("not").find("decode16:") == 0);
      CHECK(f.at("not").find("short_keys:") != std::string::npos);
    }
    if (f.at("path") == "decode16") CHECK(f.at("dtype") == "bf16");
    if (f.at("path") == "decode") CHECK(f.at("kv_dtype") == "f32");
  }
  CHECK(per_path["fused"] == kThreads * kCallsEach / 3);
  CHECK(per_path["decode"] == kThreads * kCallsEach / 3);
  CHECK(per_path["decode16"] == kThreads * kCallsEach / 3);
}

TEST_CASE("verbose mode: off, nothing is written, set_verbose and verbose() agree") {
  std::mt19937_64 rng(test::base_seed() + 72);
  const auto t = test::random_qkv<float>(rng, 1, 2, 2, 16, 16, 8);
  set_verbose(false);
  CHECK_FALSE(verbose());
  const std::string text = captured_stderr([&] {
    for (int i = 0; i < 5; ++i) test::run_attention(Backend::native, t.q, t.k, t.v);
  });
  CHECK(text.empty());
  set_verbose(true);
  CHECK(verbose());
  set_verbose(false);
}

TEST_CASE("verbose mode: a layer's call is one line naming its attention core's path") {
  std::mt19937_64 rng(test::base_seed() + 73);
  const std::int64_t d = 32, H = 4, hd = 8, B = 2, S = 24;
  MhaWeights<float> w;
  for (auto* m : {&w.wq, &w.wk, &w.wv, &w.wo}) *m = test::normal(rng, std::size_t(d * d), 0.2f);
  const MultiHeadAttention layer(MhaConfig{d, H, H, hd}, w);
  const std::vector<float> x = test::normal(rng, std::size_t(B * S * d), 1.f);
  std::vector<float> y(x.size());
  KvCache c1(layer, 1, 64), c2(layer, 1, 64);
  std::vector<float> step_out(2 * d);
  const std::string text = captured_stderr([&] {
    const VerboseOn on;
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d));
    // a prompt into one cache and one token into the other, side by side
    const std::vector<DecodeStep> steps = {{ConstSeqView(x.data(), 1, S, d), &c1, SeqView(y.data(), 1, S, d)},
                                           {ConstSeqView(x.data(), 1, 1, d), &c2, SeqView(step_out.data(), 1, 1, d)}};
    layer.forward_batch(steps);
    layer.forward(ConstSeqView(x.data(), 1, 1, d), c2, SeqView(step_out.data(), 1, 1, d));
  });
  const std::vector<Fields> lines = parse_lines(text);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].at("op") == "mha_forward");
  CHECK(lines[0].at("path") == "fused");
  CHECK(lines[0].at("x") == "2x24x32");
  CHECK(lines[0].at("heads") == "4");
  CHECK(lines[1].at("op") == "mha_forward_batch");
  CHECK(lines[1].at("steps") == "2");
  CHECK(lines[1].at("tokens") == "25");
  // both steps' cores report to the batch's line, in either order
  CHECK((lines[1].at("path") == "fused+decode" || lines[1].at("path") == "decode+fused"));
  CHECK(lines[2].at("op") == "mha_forward_cached");
  CHECK(lines[2].at("path") == "decode");
  CHECK(lines[2].at("not").find("decode16:") == 0);
}

TEST_CASE("verbose mode: linear_attention and attention_paged have lines of their own") {
  std::mt19937_64 rng(test::base_seed() + 74);
  const auto t = test::random_qkv<float>(rng, 1, 2, 2, 16, 16, 8);
  test::Buffer<float> out({1, 2, 16, 8});
  // one block of 16 tokens for one sequence: q [1, 1, H, D], caches [blocks, 16, Hkv, D]
  test::Buffer<float> q({1, 1, 2, 8}), kc({1, 16, 2, 8}), vc({1, 16, 2, 8}), po({1, 1, 2, 8});
  q.fill_normal(rng), kc.fill_normal(rng), vc.fill_normal(rng);
  const std::int32_t table[1] = {0};
  const std::int64_t lens[1] = {16};
  const std::string text = captured_stderr([&] {
    const VerboseOn on;
    LinearAttentionOptions lo;
    lo.causal = true;
    linear_attention(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), lo);
    attention_paged(q.cview(), kc.cview(), vc.cview(), BlockTable{table, 1, 1, 1}, lens, po.view());
  });
  const std::vector<Fields> lines = parse_lines(text);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].at("op") == "linear_attention");
  CHECK(lines[0].at("path") == "native");
  CHECK(lines[0].at("opts").find("causal") == 0);
  CHECK(lines[1].at("op") == "attention_paged");
  CHECK(lines[1].at("path") == "decode");  // a decode step over the blocks: the decode path
  CHECK(lines[1].at("seqs") == "1");
  CHECK(lines[1].at("kv_cache") == "1x16x2x8");
}

TEST_CASE("verbose mode: one sequence's decode step splits its keys over the threads, a paged batch names each part's path") {
  std::mt19937_64 rng(test::base_seed() + 75);
  // multi-query: one (sequence, kv head) unit, so only a split of its keys gives a second thread work
  const auto t = test::random_qkv<float>(rng, 1, 32, 1, 1, 8192, 64);
  test::Buffer<float> out({1, 32, 1, 64});
  // decode steps of two sequences beside a 40-token chunk of a third, in blocks of 16
  test::Buffer<float> q({1, 42, 2, 8}), kc({8, 16, 2, 8}), vc({8, 16, 2, 8}), po({1, 42, 2, 8});
  q.fill_normal(rng), kc.fill_normal(rng), vc.fill_normal(rng);
  const std::int32_t table[3][3] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 0}};
  const std::int64_t lens[3] = {40, 33, 45}, starts[4] = {0, 1, 2, 42};
  PagedAttentionOptions popt;
  popt.query_start = starts;
  const std::string text = captured_stderr([&] {
    const VerboseOn on;
    for (int threads : {1, 2}) {
      AttentionOptions opt;
      opt.threads = threads;
      attention(t.q.cview(), t.k.cview(), t.v.cview(), out.view(), opt);
    }
    attention_paged(q.cview(), kc.cview(), vc.cview(), BlockTable{&table[0][0], 3, 3, 3}, lens, po.view(), popt);
  });
  const std::vector<Fields> lines = parse_lines(text);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].at("path") == "decode");
  CHECK(lines[0].at("threads") == "1");
  CHECK(lines[1].at("path") == "decode");
  CHECK(lines[1].at("threads") == "2");
  CHECK(lines[2].at("op") == "attention_paged");
  CHECK(lines[2].at("path") == "decode+fused");
}

TEST_CASE("verbose mode: a pool batch that takes the cascade says so (cascade=<sequences>x<shared keys>)") {
  std::mt19937_64 rng(test::base_seed() + 79);
  const std::int64_t d = 32, H = 4, hd = 8, bs = 16, prompt = 40;
  MhaWeights<float> w;
  for (auto* m : {&w.wq, &w.wk, &w.wv, &w.wo}) *m = test::normal(rng, std::size_t(d * d), 0.2f);
  const MultiHeadAttention layer(MhaConfig{d, H, H, hd}, w);
  const std::vector<float> x = test::normal(rng, std::size_t(prompt * d), 1.f);
  std::vector<float> y(x.size());
  KvPool pool(layer, 64, bs);
  const KvPool::Sequence p = pool.add();
  const PoolStep fill{ConstSeqView(x.data(), 1, prompt, d), p, SeqView(y.data(), 1, prompt, d)};
  layer.forward_pool({&fill, 1}, pool);
  const KvPool::Sequence a = pool.fork(p), b = pool.fork(p), c = pool.fork(p), lone = pool.add();
  std::vector<PoolStep> steps;
  for (const KvPool::Sequence s : {a, b, c, lone})
    steps.push_back({ConstSeqView(x.data(), 1, 1, d), s, SeqView(y.data() + steps.size() * d, 1, 1, d)});
  std::string text;
  for (const detail::CascadeMode mode : {detail::CascadeMode::always, detail::CascadeMode::never}) {
    detail::set_cascade_mode(mode);
    text += captured_stderr([&] {
      const VerboseOn on;
      layer.forward_pool(steps, pool);
    });
  }
  detail::set_cascade_mode(std::nullopt);
  const std::vector<Fields> lines = parse_lines(text);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].at("op") == "mha_forward_pool");
  CHECK(lines[0].at("cascade") == "3x32");  // the three forks over the prompt's 2 whole blocks
  CHECK(lines[1].count("cascade") == 0);
}
