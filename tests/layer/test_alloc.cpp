// No heap allocation on the hot path: after a first call of a given size, MultiHeadAttention's
// forward (self, cross) and a KV-cache decode step allocate nothing, on the native and reference
// backends. And every allocation of a layer's construction, a forward, a decode step, loading a
// checkpoint (safetensors, config.json, a shard index) and a CLI run may fail (injected, one at
// a time): an Error or std::bad_alloc (the CLI: exit 2 with one line), the output untouched or
// not written, the cache as it was; under LeakSanitizer (CI's ASan run), nothing leaked. Counted with replaced global operator new/delete (every variant), in a test binary of
// its own so the replacement touches no other test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if SIMDATTN_ALLOC_CLI
#include "commands.hpp"  // simdattn::cli::run (tools/cli)
#endif
#include "simdattn/simdattn.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
std::atomic<long> fail_at{0};  // while counting: the allocation with this number (from 1) fails

void* allocate(std::size_t n, std::size_t align) {
  if (counting.load(std::memory_order_relaxed)) {
    const long k = allocations.fetch_add(1, std::memory_order_relaxed) + 1;
    if (std::getenv("SIMDATTN_ALLOC_ABORT")) std::abort();  // debugging: where did it come from?
    if (k == fail_at.load(std::memory_order_relaxed)) return nullptr;
  }
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n);
  return p;
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = allocate(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

using namespace simdattn;

namespace {

// Allocations made by fn().
template <class Fn>
long count(Fn&& fn) {
  allocations = 0;
  counting = true;
  fn();
  counting = false;
  return allocations.load();
}

// k values drawn from N(0, sd).
std::vector<float> random_values(std::mt19937& rng, std::int64_t k, float sd) {
  std::normal_distribution<float> n(0.f, sd);
  std::vector<float> x(static_cast<std::size_t>(k));
  for (float& e : x) e = n(rng);
  return x;
}

MhaWeights<float> random_weights(std::int64_t d, std::int64_t nq, std::int64_t nkv) {
  std::mt19937 rng(5);
  auto v = [&](std::int64_t k) { return random_values(rng, k, 0.2f); };
  return {v(nq * d), v(nkv * d), v(nkv * d), v(d * nq), v(nq), v(nkv), v(nkv), v(d)};
}

// Runs op() once for each allocation it makes, the N-th failing (N = 1, 2, ...), on a thread of
// its own each time (so per-thread scratch starts empty), until a run makes fewer than N
// allocations. check(failed) follows every run: failed when op() threw std::bad_alloc or
// simdattn::Error. Returns the allocations of the run that completed.
template <class Op, class Check>
long fail_each_allocation(Op op, Check check) {
  for (long n = 1;; ++n) {
    bool failed = false;
    long made = 0;
    std::thread([&] {
      allocations = 0;
      fail_at = n;
      counting = true;
      try {
        op();
      } catch (const std::bad_alloc&) {
        failed = true;
      } catch (const Error&) {
        failed = true;
      }
      counting = false;
      fail_at = 0;
      made = allocations.load();
    }).join();
    check(failed);
    if (made < n) {
      CHECK_FALSE(failed);  // no allocation failed: the operation must have succeeded
      return made;
    }
  }
}

}  // namespace

TEST_CASE("the counter sees allocations (so zero below means zero)") {
  CHECK(count([] { std::vector<int> v(100); }) >= 1);
}

TEST_CASE("MHA forward and KV-cache decode allocate nothing after the first call") {
  const std::int64_t B = 2, S = 40, d = 64, H = 8, Hkv = 2, hd = 8;
  const MultiHeadAttention layer(MhaConfig{d, H, Hkv, hd}, random_weights(d, H * hd, Hkv * hd));
  std::vector<float> x(static_cast<std::size_t>(B * S * d), 0.5f), y(x.size());
  std::vector<std::uint8_t> padding(static_cast<std::size_t>(B * S), 0);
  padding[7] = 1;
  for (Backend be : {Backend::native, Backend::reference}) {
    for (int threads : {1, 2}) {
      CAPTURE(backend_name(be));
      CAPTURE(threads);
      MhaOptions opt;
      opt.backend = be;
      opt.threads = threads;
      opt.causal = Causal::top_left;
      opt.key_padding_mask = padding;
      auto self = [&] { layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), opt); };
      auto cross = [&] {
        layer.forward(ConstSeqView(x.data(), B, S / 2, d), ConstSeqView(x.data(), B, S, d),
                      ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S / 2, d), opt);
      };
      self();
      CHECK(count(self) == 0);
      cross();
      CHECK(count(cross) == 0);

      // Decode: a prefill, then one token per step; every step after the first allocates nothing
      // (the cache grows within its capacity).
      KvCache cache(layer, B, 256);
      MhaOptions dec;
      dec.backend = be;
      dec.threads = threads;
      layer.forward(ConstSeqView(x.data(), B, 8, d), cache, SeqView(y.data(), B, 8, d), dec);
      auto step = [&] { layer.forward(ConstSeqView(x.data(), B, 1, d), cache, SeqView(y.data(), B, 1, d), dec); };
      step();
      long total = 0;
      for (int t = 0; t < 100; ++t) total += count(step);
      CHECK(total == 0);
      CHECK(cache.lengths()[0] == 8 + 101);
    }
  }
}

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

TEST_CASE("every allocation of a forward, a decode step and a layer's construction may fail: an error, nothing half-written") {
  // S = 12: the small paths on the calling thread; S = 160: the GEMM driver and the fused kernel
  // on two threads (their scratch allocated on the worker too).
  for (const std::int64_t S : {12, 160}) {
  CAPTURE(S);
  const std::int64_t B = 2, d = 32, H = 4, Hkv = 2, hd = 8;
  const MhaWeights<float> w = random_weights(d, H * hd, Hkv * hd);
  const MhaConfig cfg{d, H, Hkv, hd};
  // Construction: an error or a layer.
  const long built = fail_each_allocation([&] { MultiHeadAttention layer(cfg, w); }, [](bool) {});
  CHECK(built > 0);
  MESSAGE("layer construction: ", built, " allocation sites");
  const MultiHeadAttention layer(cfg, w);
  std::vector<float> x(static_cast<std::size_t>(B * S * d), 0.25f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.05f;
  std::vector<float> want(x.size()), y(x.size());
  layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(want.data(), B, S, d));
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    MhaOptions opt;
    opt.threads = threads;
    // Forward: on failure the output is untouched; on success it is the result.
    const long fwd = fail_each_allocation(
        [&] {
          std::fill(y.begin(), y.end(), -7.f);
          layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
        },
        [&](bool failed) {
          if (failed) CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.f; }));
          else CHECK(y == want);
        });
    MESSAGE("forward: ", fwd, " allocation sites");
    // A decode step: on failure the cache is as it was and the output untouched.
    KvCache cache(layer, B, 32);
    layer.forward(ConstSeqView(x.data(), B, 4, d), cache, SeqView(y.data(), B, 4, d), opt);
    const long dec = fail_each_allocation(
        [&] {
          std::fill(y.begin(), y.end(), -7.f);
          layer.forward(ConstSeqView(x.data(), B, 1, d), cache, SeqView(y.data(), B, 1, d), opt);
        },
        [&](bool failed) {
          if (failed) {
            CHECK(cache.lengths()[0] == 4);
            CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.f; }));
          } else {
            CHECK(cache.lengths()[0] == 5);
          }
        });
    MESSAGE("decode step: ", dec, " allocation sites");
  }
  }
}


namespace {

// A scratch directory with a small llama checkpoint (config.json, two shards and their index)
// and .npy inputs for the CLI's run and mha commands.
struct Files {
  std::string dir = "/tmp/simdattn_alloc_" + std::to_string(::getpid());
  std::string model = dir + "/model";
  Files() {
    std::filesystem::create_directories(model);
    std::mt19937 rng(11);
    auto values = [&](std::int64_t k) { return random_values(rng, k, 0.3f); };
    // two layers, d 16, 4 heads of 8, 2 kv heads; layer 0 in shard 1, layer 1 in shard 2
    std::vector<std::vector<float>> keep;
    std::map<std::string, SafetensorsTensor> shard[2];
    std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      for (auto [name, rows, cols] : {std::tuple{"q_proj", 32, 16}, {"k_proj", 16, 16}, {"v_proj", 16, 16}, {"o_proj", 16, 32}}) {
        keep.push_back(values(rows * cols));
        shard[l][p + name + ".weight"] = {DType::f32, {rows, cols}, keep.back().data()};
        index += std::string(index.back() == '{' ? "" : ", ") + "\"" + p + name + ".weight\": \"model-0000" +
                 std::to_string(l + 1) + "-of-00002.safetensors\"";
      }
    }
    for (int l = 0; l < 2; ++l)
      write_safetensors(model + "/model-0000" + std::to_string(l + 1) + "-of-00002.safetensors", shard[l]);
    write_text(model + "/model.safetensors.index.json", index + "}}");
    write_text(model + "/config.json", R"({"model_type": "llama", "hidden_size": 16, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2, "rope_theta": 10000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8}})");
    auto npy = [&](const std::string& name, std::vector<std::int64_t> shape) {
      NpyArray a;
      a.shape = shape;
      const std::vector<float> v = values(a.numel());
      a.data.resize(v.size() * sizeof(float));
      std::memcpy(a.data.data(), v.data(), a.data.size());
      write_npy(dir + "/" + name, a);
    };
    npy("q.npy", {1, 2, 20, 8}), npy("k.npy", {1, 2, 24, 8}), npy("v.npy", {1, 2, 24, 8});
    npy("x.npy", {1, 6, 16});
  }
  ~Files() { std::filesystem::remove_all(dir); }
  static void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

#if SIMDATTN_ALLOC_CLI
// simdattn::cli::run(args) with its stderr captured in a file: {exit status, stderr}.
std::pair<int, std::string> run_cli(const std::vector<std::string>& args, const std::string& err_path) {
  std::vector<char*> argv;
  static char name[] = "simdattn";
  argv.push_back(name);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  const int status = simdattn::cli::run(static_cast<int>(argv.size()), argv.data());
  counting = false;  // the run is over: what the test reads below is not its allocations
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  return {status, read_file(err_path)};
}
#endif

}  // namespace

TEST_CASE("every allocation of loading a checkpoint may fail: an error, no leak") {
  const Files files;
  const std::string shard = files.model + "/model-00001-of-00002.safetensors";
  const std::vector<float> whole = SafetensorsFile(shard).read<float>("model.layers.0.self_attn.q_proj.weight", {32, 16});
  // A safetensors file opened (header parsed and checked) and a tensor read.
  std::vector<float> got;
  const long st = fail_each_allocation(
      [&] {
        got.clear();
        const SafetensorsFile f(shard);
        got = f.read<float>("model.layers.0.self_attn.q_proj.weight", {32, 16});
      },
      [&](bool failed) {
        if (!failed) CHECK(got == whole);
      });
  CHECK(st > 0);
  MESSAGE("safetensors open and read: ", st, " allocation sites");
  // A model directory: config.json, the shard index, the shards, the layer.
  std::vector<float> x(6 * 16), want(x.size()), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.1f - 0.3f;
  MultiHeadAttention::from_pretrained(files.model, 1).forward(ConstSeqView(x.data(), 1, 6, 16), SeqView(want.data(), 1, 6, 16));
  const long pre = fail_each_allocation(
      [&] {
        std::fill(y.begin(), y.end(), -7.f);
        const MultiHeadAttention layer = MultiHeadAttention::from_pretrained(files.model, 1);
        layer.forward(ConstSeqView(x.data(), 1, 6, 16), SeqView(y.data(), 1, 6, 16));
      },
      [&](bool failed) {
        if (failed) CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.f; }));
        else CHECK(y == want);
      });
  CHECK(pre > st);
  MESSAGE("from_pretrained (config.json, index, two shards) and a forward: ", pre, " allocation sites");
}

#if SIMDATTN_ALLOC_CLI
TEST_CASE("every allocation of a CLI run may fail: exit 2 or 1, one line on stderr, no output file") {
  const Files files;
  const std::string out = files.dir + "/out.npy", err = files.dir + "/stderr.txt";
  const std::vector<std::vector<std::string>> commands = {
      {"run", "--q", files.dir + "/q.npy", "--k", files.dir + "/k.npy", "--v", files.dir + "/v.npy", "--out", out,
       "--causal", "bottom-right", "--window", "6,0", "--threads", "2"},
      {"mha", "--model", files.model, "--layer", "1", "--query", files.dir + "/x.npy", "--out", out},
  };
  for (const auto& args : commands) {
    CAPTURE(args[0]);
    std::filesystem::remove(out);
    const auto [ok_status, ok_err] = run_cli(args, err);
    REQUIRE(ok_status == 0);
    const std::string want = read_file(out);
    REQUIRE(!want.empty());
    int exit1 = 0, exit2 = 0;
    const long sites = fail_each_allocation(
        [&] {
          std::filesystem::remove(out);
          const auto [status, text] = run_cli(args, err);
          if (status == 0) {
            CHECK(text.empty());
            CHECK(read_file(out) == want);
            return;
          }
          // a failure: exit 2 (out of memory, or an error naming what) or 1, one line, no file
          CHECK((status == 1 || status == 2));
          (status == 1 ? exit1 : exit2) += 1;
          CHECK(std::count(text.begin(), text.end(), '\n') == 1);
          CHECK(text.back() == '\n');
          CHECK(text.rfind("simdattn: ", 0) == 0);
          CHECK(!std::filesystem::exists(out));
          throw std::bad_alloc();  // counted as failed by fail_each_allocation
        },
        [](bool) {});
    CHECK(sites > 100);
    CHECK(exit1 == 0);  // an allocation failure is reported as out of memory or an error, not an internal one
    MESSAGE(args[0], ": ", sites, " allocation sites (", exit2, " failed runs, each exit 2)");
  }
}
#endif
