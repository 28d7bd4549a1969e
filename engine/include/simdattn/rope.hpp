// Rotary position embeddings (RoPE), as the MHA layer applies them to q and k after projection
// and as callers who project themselves can apply them.
//
// For a head vector x at position p (rotary dimensions r = rotary_dim, frequencies
// inv_freq[i] = theta^(-2i / r), i < r / 2, after the scaling below), angle a_i = p * inv_freq[i]:
//   half (rotate_half: Llama, GPT-NeoX, Qwen, Mistral, Gemma in Hugging Face): pairs
//        (x[i], x[i + r/2]) -> (x[i] cos a_i - x[i + r/2] sin a_i, x[i + r/2] cos a_i + x[i] sin a_i)
//   interleaved (GPT-J, the original paper): pairs (x[2i], x[2i + 1]) rotated by a_i the same way
// Dimensions r .. head_dim - 1 pass through unchanged (partial rotary).
// Scaling: linear divides every frequency by `factor`; llama3 (Llama 3.1) divides the low
// frequencies (wavelength 2 pi / inv_freq above original_max_positions / low_freq_factor) by
// `factor`, keeps the high ones (wavelength below original_max_positions / high_freq_factor) and
// blends the band between; factors divides frequency i by frequency_factors[i] (llama.cpp's
// per-frequency factors, a GGUF file's rope_freqs tensor: how it stores Llama 3.1's scaling);
// yarn (YaRN, Peng et al. 2023, Hugging Face's rope_type "yarn": gpt-oss, DeepSeek-V2/V3) blends
// each frequency between itself (extrapolation) and itself / factor (interpolation) by a linear
// ramp over the frequency index from low to high, the dimensions where a wavelength makes
// beta_fast and beta_slow turns over original_max_positions: d(b) = r ln(original_max_positions /
// (2 pi b)) / (2 ln theta), low = max(d(beta_fast), 0) and high = min(d(beta_slow), r - 1),
// floored and ceiled when truncate (high += 0.001 if they meet); frequency i keeps the weight
// 1 - clamp((i - low) / (high - low), 0, 1) of its extrapolation; and cos and sin are multiplied by
// attention_factor (0: 0.1 ln(factor) + 1, or 1 for factor <= 1).
// Frequencies, angles, cos and sin are computed in f32 as Hugging Face
// computes them for f32 models (f64 layers: in f64); the rotation in the tensor's dtype's
// arithmetic (f32 for bf16 and f16, rounded once).
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <span>
#include <vector>

#include "simdattn/tensor.hpp"

namespace simdattn {

enum class RopeStyle : std::uint8_t { half, interleaved };
enum class RopeScaling : std::uint8_t { none, linear, llama3, factors, yarn };

struct RopeConfig {
  double theta = 10000.0;             // the base, > 0
  std::int64_t rotary_dim = 0;        // dimensions rotated: even, <= head_dim (0: head_dim)
  RopeStyle style = RopeStyle::half;
  RopeScaling scaling = RopeScaling::none;
  double factor = 1.0;                // linear, llama3 and yarn: > 0
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3: > low_freq_factor
  std::int64_t original_max_positions = 8192;  // llama3 and yarn: > 0
  std::vector<double> frequency_factors = {};  // factors: rotary_dim / 2 of them, each finite and > 0
  double beta_fast = 32.0, beta_slow = 1.0;    // yarn: > 0
  double attention_factor = 0.0;               // yarn: >= 0 (0: the default above)
  bool truncate = true;                        // yarn
};

// Rotates x [B, H, S, head_dim] (f32, f64, bf16 or f16, any strides) in place: the vectors of
// batch b and sequence index s sit at position positions[b * S + s] ([B, S], each >= 0); empty
// positions: s. Throws Error naming the argument (config.rotary_dim, config.theta, positions,
// x, ...) before changing anything.
SIMDATTN_API void apply_rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeConfig& config);

}  // namespace simdattn
