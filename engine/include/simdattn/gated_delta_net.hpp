// Gated DeltaNet, the linear-attention layer of Qwen3-Next (transformers' Qwen3NextGatedDeltaNet,
// flash-linear-attention's GatedDeltaNet layer). Per token x [hidden], with H key heads, Hv value
// heads (a multiple of H), key / value head dims Dk / Dv, conv_dim = 2 H Dk + Hv Dv:
//
//   q | k | v | z | b | a = x W_qkvz^T, x W_ba^T            (q, k [H Dk]; v, z [Hv Dv]; b, a [Hv])
//   q | k | v = SiLU(causal depthwise conv1d over time)     (kernel K per channel, no bias)
//   beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)      (per value head, f32)
//   o = gated_delta_rule(q, k, v, g, beta, use_qk_l2norm)   (simdattn/linear.hpp; value head h
//                                                            reads key head h / (Hv / H))
//   o = norm_weight * RMSNorm(o) * SiLU(z)                  (per value head over Dv, eps norm_eps)
//   y = o W_out^T
//
// The weights are transformers' tensors as published: in_proj_qkvz's rows grouped per key head
// [q (Dk) | k (Dk) | v (Hv/H x Dv) | z (Hv/H x Dv)], in_proj_ba's [b (Hv/H) | a (Hv/H)], the
// conv's channels q | k | v in head order. The layer is f32, bf16 or f16: projections sum in f32
// and round once to the layer's dtype, the conv, the gates, the rule and the norm run in f32 (the
// conv's output and the norm's steps rounded to the dtype where transformers' code rounds them).
//
// A continuation carries what the next tokens need (GatedDeltaNetState): the last K - 1
// pre-conv inputs of each channel and the Dk x Dv f32 state of each value head. The state is a
// fixed size per sequence whatever its length, so it lives in an object of its own (one per batch
// of sequences, as a KvCache), not in the KV pool's blocks: the pool pages what grows.
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "simdattn/half.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/tensor.hpp"

namespace simdattn {

struct GatedDeltaNetConfig {
  std::int64_t hidden_size = 0;     // >= 1
  std::int64_t key_heads = 0;       // H (linear_num_key_heads), >= 1
  std::int64_t value_heads = 0;     // Hv (linear_num_value_heads), a multiple of H
  std::int64_t key_head_dim = 0;    // Dk (linear_key_head_dim), >= 1
  std::int64_t value_head_dim = 0;  // Dv (linear_value_head_dim), >= 1
  std::int64_t conv_kernel = 4;     // K (linear_conv_kernel_dim), >= 1
  double norm_eps = 1e-6;           // the gated RMSNorm's (rms_norm_eps), finite, >= 0
};

// The layer's weights in its dtype (the f32 ones: f32 whatever the dtype, as transformers keeps
// them or converts them).
template <class T>
struct GatedDeltaNetWeights {
  std::vector<T> in_proj_qkvz;       // [2 H Dk + 2 Hv Dv, hidden]
  std::vector<T> in_proj_ba;         // [2 Hv, hidden]
  std::vector<T> conv;               // [conv_dim, K] (conv1d.weight [conv_dim, 1, K])
  std::vector<float> dt_bias, A_log; // [Hv] each
  std::vector<float> norm;           // [Dv]
  std::vector<T> out_proj;           // [hidden, Hv Dv]
};

class GatedDeltaNetState;

class SIMDATTN_API GatedDeltaNet {
 public:
  // Validates the configuration (Error naming "config.<field>") and each weight's size (Error
  // naming "weights.<name>").
  GatedDeltaNet(const GatedDeltaNetConfig& config, GatedDeltaNetWeights<float> weights);
  GatedDeltaNet(const GatedDeltaNetConfig& config, GatedDeltaNetWeights<bfloat16> weights);
  GatedDeltaNet(const GatedDeltaNetConfig& config, GatedDeltaNetWeights<float16> weights);

  // Layer `layer` of a Hugging Face qwen3_next model directory (config.json's layer_types[layer]
  // must be "linear_attention"; absent, transformers' default: every fourth layer full); the
  // tensors under model.layers.<layer>.linear_attn. dtype: f32, bf16 or f16 (absent: the
  // checkpoint's, f64 taken as f32).
  static GatedDeltaNet from_pretrained(const std::string& dir, std::int64_t layer,
                                       const std::optional<DType>& dtype = {});

  ~GatedDeltaNet();
  GatedDeltaNet(GatedDeltaNet&&) noexcept;
  GatedDeltaNet& operator=(GatedDeltaNet&&) noexcept;

  const GatedDeltaNetConfig& config() const noexcept;
  DType dtype() const noexcept;

  // x [B, S, hidden] -> out [B, S, hidden], the layer's dtype. Without a state: from an empty
  // one (zeros), nothing kept. With one (state->batch() == B, made for a layer of this one's
  // shapes and dtype): continued from it, and it holds the state after the S tokens when the call
  // returns (unchanged if the call throws). Every
  // argument is checked before anything is written (Error naming "x", "out", "state"); x must be
  // finite. threads as AttentionOptions::threads; the result is the same at any count.
  void forward(const ConstSeqView& x, const SeqView& out, GatedDeltaNetState* state = nullptr, int threads = 0) const;

  struct Storage;  // the built layer, opaque (engine/src/layer/gated_delta/gated_delta_net.cpp)

 private:
  std::unique_ptr<Storage> storage_;
};

// The state of a batch of sequences through one GatedDeltaNet layer: per sequence the conv
// window (the last K - 1 pre-conv inputs of each channel, [B, K - 1, conv_dim] in the layer's
// dtype, oldest first; zeros before any token) and the recurrent state ([B, Hv, Dk, Dv] f32).
class SIMDATTN_API GatedDeltaNetState {
 public:
  GatedDeltaNetState(const GatedDeltaNet& layer, std::int64_t batch);

  std::int64_t batch() const noexcept { return batch_; }
  std::int64_t tokens() const noexcept { return tokens_; }  // tokens seen since construction or reset
  // The conv window's and the recurrent state's bytes: B (Hv Dk Dv x 4 + (K - 1) conv_dim x the
  // dtype's size).
  std::int64_t bytes() const noexcept;
  void reset() noexcept;  // back to the empty state

  ConstTensorView conv_window() const noexcept;  // [B, 1, K - 1, conv_dim]
  ConstTensorView recurrent() const noexcept;    // [B, Hv, Dk, Dv] f32

 private:
  friend class GatedDeltaNet;
  DType dtype_ = DType::f32;
  std::int64_t batch_ = 0, tokens_ = 0, window_ = 0, channels_ = 0;  // window_ = K - 1, channels_ = conv_dim
  std::int64_t value_heads_ = 0, key_dim_ = 0, value_dim_ = 0;
  std::vector<std::uint16_t> window16_;  // 16-bit layers' window
  std::vector<float> window32_;          // f32 layers' window
  std::vector<float> recurrent_;
};

}  // namespace simdattn
