// No heap allocation on the hot path: after a first call of a given size, MultiHeadAttention's
// forward (self, cross) and a KV-cache decode step allocate nothing, on the native and reference
// backends. Counted with replaced global operator new/delete (every variant), in a test binary
// of its own so the replacement touches no other test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "simdattn/simdattn.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};

void* allocate(std::size_t n, std::size_t align) {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (std::getenv("SIMDATTN_ALLOC_ABORT")) std::abort();  // debugging: where did it come from?
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
