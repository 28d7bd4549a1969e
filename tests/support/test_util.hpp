// Shared helpers for the tests: the backends to run, random tensors, owning 4-D buffers with any
// layout, random Q/K/V, one attention call into a new buffer, and an error measure with
// docs/design.md's tolerances; random float vectors and their largest difference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "core/element.hpp"
#include "simdattn/simdattn.hpp"

// CAPTURE of a copy: doctest's CAPTURE takes its argument by reference in a lambda, which clang 14
// refuses for a structured binding (and clang builds the OpenMP ThreadSanitizer run).
#define SIMDATTN_CAPTURE_CAT2(a, b) a##b
#define SIMDATTN_CAPTURE_CAT(a, b) SIMDATTN_CAPTURE_CAT2(a, b)
#define CAPTURE_VALUE(x)                                                 \
  const auto SIMDATTN_CAPTURE_CAT(captured_value_, __LINE__) = (x);      \
  INFO(#x " := " << SIMDATTN_CAPTURE_CAT(captured_value_, __LINE__))

namespace simdattn::test {

// Seed of all randomized tests: SIMDATTN_TEST_SEED or a fixed default, printed by main.
inline std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    const char* env = std::getenv("SIMDATTN_TEST_SEED");
    return env ? std::strtoull(env, nullptr, 10) : 20261130ULL;
  }();
  return seed;
}

// The doctest suite that tests/CMakeLists.txt runs again with SIMDATTN_ISA forced to each lower
// ISA (attention_on_avx2, attention_on_sse2): TEST_CASE("..." * doctest::test_suite(every_isa)).
inline constexpr char every_isa[] = "attention on every ISA";

// The backends this build has: reference, native and, where built, onednn. With f64 = true, only
// those that take f64 inputs (onednn has no f64).
inline std::vector<Backend> backends(bool f64 = false) {
  std::vector<Backend> out;
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn})
    if (backend_available(b) && !(f64 && b == Backend::onednn)) out.push_back(b);
  return out;
}

// The same without the reference: the backends checked against it.
inline std::vector<Backend> fast_backends(bool f64 = false) {
  std::vector<Backend> out;
  for (Backend b : backends(f64))
    if (b != Backend::reference) out.push_back(b);
  return out;
}

// An element as a double (exact), and a double as an element of T (rounded to nearest even):
// the engine's own conversions (element.hpp).
template <class T>
double as_double(T x) {
  return detail::widen(x);
}
template <class T>
T value(double d) {
  return detail::narrow<T>(d);
}

// An owning 4-D buffer that can be laid out as [B,H,S,D] or [B,S,H,D], with optional padding
// between rows (odd strides).
template <class T>
struct Buffer {
  Shape4 shape{};
  Shape4 strides{};
  std::vector<T> data;

  Buffer() = default;
  // bshd = false: [B,H,S,D]; true: stored as [B,S,H,D]. row_pad adds unused elements after
  // each row of D.
  explicit Buffer(Shape4 s, bool bshd = false, std::int64_t row_pad = 0) : shape(s) {
    const std::int64_t row = s[3] + row_pad;
    if (!bshd) strides = {s[1] * s[2] * row, s[2] * row, row, 1};
    else strides = {s[2] * s[1] * row, row, s[1] * row, 1};
    data.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, s[0] * s[1] * s[2] * row)), T{});
  }
  T& at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
    return data[static_cast<std::size_t>(a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3])];
  }
  const T& at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    return data[static_cast<std::size_t>(a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3])];
  }
  template <class F> void for_each(F&& f) {
    for (std::int64_t a = 0; a < shape[0]; ++a)
      for (std::int64_t b = 0; b < shape[1]; ++b)
        for (std::int64_t c = 0; c < shape[2]; ++c)
          for (std::int64_t d = 0; d < shape[3]; ++d) f(at(a, b, c, d), a, b, c, d);
  }
  void fill_normal(std::mt19937_64& rng, double sd = 1.0) {
    std::normal_distribution<double> n(0.0, sd);
    for_each([&](T& x, auto...) { x = value<T>(n(rng)); });
  }
  ConstTensorView cview() const { return ConstTensorView(data.data(), shape, strides); }
  TensorView view() { return TensorView(data.data(), shape, strides); }
};

// Q [B, H, Sq, D], K [B, Hkv, Sk, D] and V [B, Hkv, Sk, Dv], dense [B, H, S, D], drawn from N(0, 1)
// in that order (the same draws as filling three such buffers one after the other).
template <class T>
struct Qkv {
  Buffer<T> q, k, v;
};

template <class T>
Qkv<T> random_qkv(std::mt19937_64& rng, std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t Sq,
                  std::int64_t Sk, std::int64_t D, std::int64_t Dv) {
  Qkv<T> t{Buffer<T>({B, H, Sq, D}), Buffer<T>({B, Hkv, Sk, D}), Buffer<T>({B, Hkv, Sk, Dv})};
  t.q.fill_normal(rng);
  t.k.fill_normal(rng);
  t.v.fill_normal(rng);
  return t;
}

template <class T>
Qkv<T> random_qkv(std::mt19937_64& rng, std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t Sq,
                  std::int64_t Sk, std::int64_t D) {
  return random_qkv<T>(rng, B, H, Hkv, Sq, Sk, D, D);
}

// attention() on `backend` into a new dense [B, H, Sq, Dv] buffer (opt.backend is overridden).
template <class T>
Buffer<T> run_attention(Backend backend, const Buffer<T>& q, const Buffer<T>& k, const Buffer<T>& v,
                        AttentionOptions opt = {}) {
  opt.backend = backend;
  Buffer<T> out({q.shape[0], q.shape[1], q.shape[2], v.shape[3]});
  attention(q.cview(), k.cview(), v.cview(), out.view(), opt);
  return out;
}

// The same tensor in another dtype, with the same layout.
template <class To, class From>
Buffer<To> cast(const Buffer<From>& a) {
  Buffer<To> out;
  out.shape = a.shape;
  out.strides = a.strides;
  out.data.assign(a.data.begin(), a.data.end());
  return out;
}

// max |a - b| over all elements; NaN positions must match (a NaN in only one counts as +inf).
// a and b may differ in dtype (an f32 result against an f64 oracle).
template <class T, class U>
double max_abs_diff(const Buffer<T>& a, const Buffer<U>& b) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.shape[0]; ++i)
    for (std::int64_t j = 0; j < a.shape[1]; ++j)
      for (std::int64_t k = 0; k < a.shape[2]; ++k)
        for (std::int64_t l = 0; l < a.shape[3]; ++l) {
          const double x = as_double(a.at(i, j, k, l)), y = as_double(b.at(i, j, k, l));
          if (std::isnan(x) || std::isnan(y)) {
            if (std::isnan(x) != std::isnan(y)) return INFINITY;
            continue;
          }
          m = std::max(m, std::abs(x - y));
        }
  return m;
}

template <class T>
double max_abs(const Buffer<T>& a) {
  double m = 0.0;
  for (T x : a.data)
    if (!std::isnan(as_double(x))) m = std::max(m, std::abs(as_double(x)));
  return m;
}

// docs/design.md: f32 <= 1e-5 * max(1, max|V|); f64 <= 1e-12; bf16 <= 1e-2; f16 <= 2e-3.
template <class T>
double tolerance(double max_abs_v) {
  double t = 1e-5;
  if constexpr (std::is_same_v<T, double>) t = 1e-12;
  else if constexpr (std::is_same_v<T, bfloat16>) t = 1e-2;
  else if constexpr (std::is_same_v<T, float16>) t = 2e-3;
  return t * std::max(1.0, max_abs_v);
}

// n floats drawn from N(0, sd^2).
inline std::vector<float> normal(std::mt19937_64& rng, std::size_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> x(n);
  for (auto& e : x) e = d(rng);
  return x;
}

// The largest |a - b| over two equal-sized buffers.
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

// A path in /tmp for a test's file, unique to this process.
inline std::string temp_path(const std::string& name) {
  return "/tmp/simdattn_test_" + std::to_string(::getpid()) + "_" + name + ".safetensors";
}

}  // namespace simdattn::test
