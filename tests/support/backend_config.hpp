// One attention configuration (sizes, layout and every option) and the check that runs it on every
// fast backend against the reference, within docs/design.md's tolerances. Shared by the random
// sweep (attention/test_backends_random.cpp) and the edge cases (attention/test_backends_edge_cases.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include "support/test_util.hpp"

namespace simdattn::test {

// The mask a configuration draws: its dtype makes it boolean (u8) or additive (f32).
enum class MaskType { none, boolean, additive };

// One attention configuration; random_config (attention/test_backends_random.cpp) draws every option.
struct Config {
  std::int64_t B = 1, H = 1, Hkv = 1, Sq = 1, Sk = 1, D = 1, Dv = 1;
  bool bshd = false;          // [B,S,H,D] storage for q, k, v and out
  std::int64_t row_pad = 0;   // odd strides: padding after every row
  Causal causal = Causal::none;
  MaskType mask_type = MaskType::none;
  Shape4 mask_shape{1, 1, 1, 1};
  bool key_lengths = false;
  std::optional<Window> window;
  std::optional<double> scale;

  // A configuration of the given sizes with every option off.
  static Config sized(std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t Sq, std::int64_t Sk,
                      std::int64_t D, std::int64_t Dv) {
    Config c;
    c.B = B, c.H = H, c.Hkv = Hkv, c.Sq = Sq, c.Sk = Sk, c.D = D, c.Dv = Dv;
    return c;
  }

  std::string describe() const {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "B=%lld H=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld bshd=%d pad=%lld causal=%d "
                  "mask=%d [%lld,%lld,%lld,%lld] L=%d window=%lld,%lld",
                  (long long)B, (long long)H, (long long)Hkv, (long long)Sq, (long long)Sk, (long long)D,
                  (long long)Dv, int(bshd), (long long)row_pad, int(causal), int(mask_type),
                  (long long)mask_shape[0], (long long)mask_shape[1], (long long)mask_shape[2],
                  (long long)mask_shape[3], int(key_lengths), window ? (long long)window->left : -2LL,
                  window ? (long long)window->right : -2LL);
    return buf;
  }
};

// Draws Q, K and V (V with standard deviation 2), the mask and the key lengths the configuration
// asks for, and checks every fast backend that takes T here against the reference on them. Rows
// padded by row_pad must keep their padding untouched.
template <class T>
void check_config(const Config& c, std::mt19937_64& rng) {
  Buffer<T> q({c.B, c.H, c.Sq, c.D}, c.bshd, c.row_pad);
  Buffer<T> k({c.B, c.Hkv, c.Sk, c.D}, c.bshd, c.row_pad);
  Buffer<T> v({c.B, c.Hkv, c.Sk, c.Dv}, c.bshd, c.row_pad);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng, 2.0);

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window = c.window;
  opt.scale = c.scale;
  Buffer<std::uint8_t> bmask;
  Buffer<float> amask;
  if (c.mask_type == MaskType::boolean) {
    bmask = Buffer<std::uint8_t>(c.mask_shape);
    std::bernoulli_distribution attend(0.7);
    bmask.for_each([&](std::uint8_t& x, auto...) { x = attend(rng) ? 1 : 0; });
    opt.mask = bmask.cview();
  } else if (c.mask_type == MaskType::additive) {
    amask = Buffer<float>(c.mask_shape);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    std::bernoulli_distribution hide(0.2);
    amask.for_each([&](float& x, auto...) { x = hide(rng) ? -INFINITY : u(rng); });
    opt.mask = amask.cview();
  }
  std::vector<std::int64_t> lengths;
  if (c.key_lengths) {
    for (std::int64_t b = 0; b < c.B; ++b)
      lengths.push_back(std::uniform_int_distribution<std::int64_t>(0, c.Sk)(rng));
    opt.key_lengths = lengths;
  }

  Buffer<T> ref({c.B, c.H, c.Sq, c.Dv}, c.bshd, c.row_pad);
  opt.backend = Backend::reference;
  attention(q.cview(), k.cview(), v.cview(), ref.view(), opt);
  for (Backend be : fast_backends(std::is_same_v<T, double>)) {
    if (!backend_takes(be, dtype_of<T>())) continue;  // onednn: f32, and bf16 where oneDNN has it
    Buffer<T> out({c.B, c.H, c.Sq, c.Dv}, c.bshd, c.row_pad);
    const T pad = value<T>(12345.0);
    std::fill(out.data.begin(), out.data.end(), pad);  // padding must stay untouched
    opt.backend = be;
    attention(q.cview(), k.cview(), v.cview(), out.view(), opt);
    CAPTURE(backend_name(be));
    CAPTURE(c.describe());
    CHECK(max_abs_diff(out, ref) <= tolerance<T>(max_abs(v)));
    if (c.row_pad > 0) CHECK(as_double(out.data.back()) == as_double(pad));
  }
}

}  // namespace simdattn::test
