// RoPE's frequencies and one vector's rotation (simdattn/rope.hpp): the one home of the rule,
// used by apply_rope and the MHA layer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "simdattn/error.hpp"
#include "simdattn/rope.hpp"

namespace simdattn::detail {

// The frequencies of a configuration for head_dim, validated; in f32 as Hugging Face computes
// them for f32 models (inv_freq = 1 / theta^(arange(0, r, 2) / r), then the scaling), or in f64.
struct RopeTable {
  RopeStyle style = RopeStyle::half;
  std::int64_t rotary_dim = 0;
  bool f64 = false;
  std::vector<double> inv_freq;  // r / 2 of them (f32 values when !f64)
  double attention = 1.0;        // cos and sin scaled by it (YaRN's attention factor)
};

// YaRN's frequencies and attention factor (simdattn/rope.hpp) for r rotated dimensions, in f32
// as Hugging Face computes them (the correction range in double, as Python does), or in f64.
inline void yarn_frequencies(const RopeConfig& c, std::int64_t r, RopeTable& t) {
  const double two_pi = 2.0 * std::numbers::pi, dim = static_cast<double>(r);
  const double omp = static_cast<double>(c.original_max_positions);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(omp / (rotations * two_pi)) / (2.0 * std::log(c.theta));
  };
  double low = correction_dim(c.beta_fast), high = correction_dim(c.beta_slow);
  if (c.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // (as the reference keeps the ramp finite)
  for (std::int64_t i = 0; i < r / 2; ++i) {
    double inv;
    if (t.f64) {
      const double pos = std::pow(c.theta, static_cast<double>(2 * i) / dim);
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0), extra = 1.0 - ramp;
      inv = (1.0 / (c.factor * pos)) * (1.0 - extra) + (1.0 / pos) * extra;
    } else {  // float32 throughout, the scalars rounded to f32 as torch rounds them
      const float pos = std::pow(static_cast<float>(c.theta), static_cast<float>(2 * i) / static_cast<float>(r));
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
      const float extra = 1.0f - ramp;
      const float interpolated = 1.0f / (static_cast<float>(c.factor) * pos), extrapolated = 1.0f / pos;
      inv = static_cast<double>(interpolated * (1.0f - extra) + extrapolated * extra);
    }
    t.inv_freq.push_back(inv);
  }
  t.attention = c.attention_factor > 0.0 ? c.attention_factor : c.factor <= 1.0 ? 1.0 : 0.1 * std::log(c.factor) + 1.0;
}

inline RopeTable rope_table(const RopeConfig& c, std::int64_t head_dim, bool f64) {
  if (!(std::isfinite(c.theta) && c.theta > 0.0))
    throw Error("config.theta", "must be finite and > 0, got " + std::to_string(c.theta));
  const std::int64_t r = c.rotary_dim == 0 ? head_dim : c.rotary_dim;
  if (r < 0 || r % 2 != 0 || r > head_dim)
    throw Error("config.rotary_dim", "must be even and <= head_dim " + std::to_string(head_dim) + " (0: head_dim), got " +
                                         std::to_string(c.rotary_dim));
  if (c.style != RopeStyle::half && c.style != RopeStyle::interleaved)
    throw Error("config.style", "unknown value " + std::to_string(int(c.style)));
  if ((c.scaling == RopeScaling::linear || c.scaling == RopeScaling::llama3 || c.scaling == RopeScaling::yarn) &&
      !(std::isfinite(c.factor) && c.factor > 0.0))
    throw Error("config.factor", "must be finite and > 0, got " + std::to_string(c.factor));
  if (c.scaling == RopeScaling::llama3) {
    if (!(c.high_freq_factor > c.low_freq_factor && c.low_freq_factor > 0.0 && std::isfinite(c.high_freq_factor)))
      throw Error("config.high_freq_factor", "must exceed low_freq_factor > 0");
    if (c.original_max_positions < 1)
      throw Error("config.original_max_positions", "must be >= 1, got " + std::to_string(c.original_max_positions));
  } else if (c.scaling == RopeScaling::factors) {
    if (static_cast<std::int64_t>(c.frequency_factors.size()) != r / 2)
      throw Error("config.frequency_factors", "expected rotary_dim / 2 = " + std::to_string(r / 2) + " factors, got " +
                                                  std::to_string(c.frequency_factors.size()));
    for (double f : c.frequency_factors)
      if (!(std::isfinite(f) && f > 0.0))
        throw Error("config.frequency_factors", "must be finite and > 0, got " + std::to_string(f));
  } else if (c.scaling == RopeScaling::yarn) {
    if (c.theta == 1.0) throw Error("config.theta", "must not be 1 with yarn scaling (its correction range divides by ln theta)");
    if (c.original_max_positions < 1)
      throw Error("config.original_max_positions", "must be >= 1, got " + std::to_string(c.original_max_positions));
    if (!(std::isfinite(c.beta_fast) && c.beta_fast > 0.0))
      throw Error("config.beta_fast", "must be finite and > 0, got " + std::to_string(c.beta_fast));
    if (!(std::isfinite(c.beta_slow) && c.beta_slow > 0.0))
      throw Error("config.beta_slow", "must be finite and > 0, got " + std::to_string(c.beta_slow));
    if (!(std::isfinite(c.attention_factor) && c.attention_factor >= 0.0))
      throw Error("config.attention_factor", "must be finite and >= 0 (0: the default), got " + std::to_string(c.attention_factor));
  } else if (c.scaling != RopeScaling::none && c.scaling != RopeScaling::linear) {
    throw Error("config.scaling", "unknown value " + std::to_string(int(c.scaling)));
  }
  RopeTable t;
  t.style = c.style;
  t.rotary_dim = r;
  t.f64 = f64;
  auto round = [f64](double v) { return f64 ? v : static_cast<double>(static_cast<float>(v)); };
  if (c.scaling == RopeScaling::yarn) {
    yarn_frequencies(c, r, t);
    return t;
  }
  for (std::int64_t i = 0; i < r / 2; ++i) {
    double inv;
    if (f64) {
      inv = 1.0 / std::pow(c.theta, static_cast<double>(2 * i) / static_cast<double>(r));
    } else {  // float32 throughout: exponent, power, reciprocal
      const float e = static_cast<float>(2 * i) / static_cast<float>(r);
      inv = static_cast<double>(1.0f / std::pow(static_cast<float>(c.theta), e));
    }
    if (c.scaling == RopeScaling::linear) inv = round(inv / c.factor);
    if (c.scaling == RopeScaling::factors) inv = round(inv / c.frequency_factors[static_cast<std::size_t>(i)]);
    if (c.scaling == RopeScaling::llama3) {
      const double old = static_cast<double>(c.original_max_positions);
      const double low_wave = old / c.low_freq_factor, high_wave = old / c.high_freq_factor;
      const double wave = 2.0 * std::numbers::pi / inv;
      if (wave > low_wave) {
        inv = round(inv / c.factor);
      } else if (!(wave < high_wave)) {  // the band between: blended
        const double smooth = (old / wave - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
        inv = round((1.0 - smooth) * inv / c.factor + smooth * inv);
      }
    }
    t.inv_freq.push_back(inv);
  }
  return t;
}

// The cosines and sines of position pos, cs[2 i] = cos a_i and cs[2 i + 1] = sin a_i (a_i = pos
// inv_freq[i], in f32 unless the table is f64): computed once per position, shared by every head.
inline void rope_angles(const RopeTable& t, std::int64_t pos, double* cs) {
  for (std::size_t i = 0; i < t.inv_freq.size(); ++i) {
    if (t.f64) {
      const double a = static_cast<double>(pos) * t.inv_freq[i];
      cs[2 * i] = std::cos(a) * t.attention, cs[2 * i + 1] = std::sin(a) * t.attention;
    } else {
      const float a = static_cast<float>(pos) * static_cast<float>(t.inv_freq[i]), f = static_cast<float>(t.attention);
      cs[2 * i] = std::cos(a) * f, cs[2 * i + 1] = std::sin(a) * f;
    }
  }
}

// Rotates one head vector x (element stride `step`) by rope_angles' cs: f64 tables in double,
// others in f32 (as the f32 model computes it), rounded once to T.
template <class T>
void rope_rotate(const RopeTable& t, const double* cs, T* x, std::int64_t step) {
  const std::int64_t half = t.rotary_dim / 2;
  const bool halves = t.style == RopeStyle::half;
  for (std::int64_t i = 0; i < half; ++i) {
    T* p0 = x + (halves ? i : 2 * i) * step;
    T* p1 = x + (halves ? i + half : 2 * i + 1) * step;
    if (t.f64) {
      const double c = cs[2 * i], s = cs[2 * i + 1], x0 = widen(*p0), x1 = widen(*p1);
      *p0 = narrow<T>(x0 * c - x1 * s);
      *p1 = narrow<T>(x1 * c + x0 * s);
    } else {
      const auto c = static_cast<float>(cs[2 * i]), s = static_cast<float>(cs[2 * i + 1]);
      const auto x0 = static_cast<float>(widen(*p0)), x1 = static_cast<float>(widen(*p1));
      *p0 = narrow<T>(static_cast<double>(x0 * c - x1 * s));
      *p1 = narrow<T>(static_cast<double>(x1 * c + x0 * s));
    }
  }
}

}  // namespace simdattn::detail
