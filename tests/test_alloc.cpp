// No heap allocation on the hot path: after a first call of a given size, MultiHeadAttention's
// forward (self, cross) and a KV-cache decode step allocate nothing, on the native and reference
// backends. And every allocation of a layer's construction, a forward and a decode step may
// fail (injected, one at a time): an Error or std::bad_alloc, the output untouched, the cache as
// it was. Counted with replaced global operator new/delete (every variant), in a test binary of
// its own so the replacement touches no other test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <thread>
#include <vector>

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

MhaWeights<float> random_weights(std::int64_t d, std::int64_t nq, std::int64_t nkv) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.f, 0.2f);
  auto v = [&](std::int64_t k) {
    std::vector<float> x(static_cast<std::size_t>(k));
    for (float& e : x) e = n(rng);
    return x;
  };
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

