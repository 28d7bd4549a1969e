// The published families' layouts (families.cpp): each family's entry reads config.json into a
// LayerPlan, the layer's MhaConfig and where each of its weights is in the checkpoint
// (dtype-free); loaders/pretrained.cpp then reads the weights in the layer's dtype.
// docs/models.md lists what each family's sub-layer includes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "loaders/checkpoint.hpp"
#include "loaders/config_json.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// One of the layer's weights from a checkpoint tensor.
struct Part {
  enum class Take : std::uint8_t {
    whole,        // the tensor as it is: nn.Linear's [out, in], or a bias [out]
    conv1d,       // GPT-2's Conv1D: weight [in, blocks * out] (x W + b), bias [blocks * out];
                  // block `index` of the columns (c_attn: q | k | v; c_proj: one)
    fused_heads,  // BLOOM's query_key_value: [H * 3 * hd, in], per head q, k, v; `index` of them
    gated_heads,  // Qwen3-Next's q_proj: [H * 2 * hd, in], per head the query then the gate; `index` of them
  };
  std::string tensor;  // empty: absent (a bias the family does not have)
  Take take = Take::whole;
  int index = 0;
  int blocks = 3;  // conv1d
};

// A layer as a family lays it out: its configuration and where its weights are.
struct LayerPlan {
  MhaConfig cfg;
  Part wq, wk, wv, wo, bq, bk, bv, bo;
  Part wg, bg;                 // the output gate's (cfg.output_gate: Qwen3-Next)
  std::string q_norm, k_norm;  // QK-norm weights [head_dim] (qwen3, qwen3_next)
  bool norm_plus_one = false;  // the QK-norm multiplies by 1 + weight (Qwen3NextRMSNorm)
  std::string t5_table;        // T5's relative attention bias [num_buckets, heads]
  std::string sinks;           // one sink logit per head [heads] (gpt-oss)
  // Multi-head Latent Attention (cfg.mla; DeepSeek-V2/V3): the tensors' names (wq empty with a
  // q_lora_rank; biases empty when absent), read into MlaWeights
  struct Mla {
    std::string wq, wq_a, bq_a, q_a_norm, wq_b, wkv_a, bkv_a, kv_a_norm, wkv_b, wo, bo;
    std::string defaulted;  // the MLA size keys config.json lacks (their class defaults taken), for errors
  } mla;
  std::string t5_max_distance_key;  // the config that set its max distance (for errors)
  bool cross = false;          // kdim / vdim from the key and value weights' widths
};

inline Part whole(std::string name) { return Part{std::move(name), Part::Take::whole, 0}; }

// What a family reads a layer from.
struct FamilyContext {
  const ConfigJson& c;
  const Checkpoint& ck;
  const std::string& dir;
  std::int64_t layer;
  const PretrainedOptions& opt;
};

struct Family {
  const char* model_type;
  LayerPlan (*plan)(const FamilyContext&);
};

// A sliding window of W keys ending at the query, its own included (`q - W < j <= q`), as the
// causal sliding-window masks of Hugging Face's models (and llama.cpp's) keep them.
inline Window sliding_window(std::int64_t w) { return Window{w - 1, 0}; }

// Every family, by config.json's model_type.
std::span<const Family> families();

// Helpers the families share (families.cpp).
// Where `suffix` sits in the checkpoint: the prefix before it; exactly one tensor may end with it.
std::string find_prefix(const Checkpoint& ck, const std::string& dir, const std::string& suffix);
// 0 <= layer < n (n read from config key `key`), else Error("layer").
void check_layer(const ConfigJson& c, const char* key, std::int64_t n, std::int64_t layer);
// Error("attention" / "stack") unless the options ask for a self-attention layer of one stack.
void only_self(const FamilyContext& x, const char* family);
// RoPE from rope_theta, rope_scaling and partial_rotary_factor, or from rope_parameters; the
// arguments are the family's configuration class's defaults.
RopeConfig rope_of(const ConfigJson& c, std::int64_t head_dim, std::int64_t max_positions = 2048, double theta = 10000.0,
                   double partial_rotary_factor = 1.0);

// Qwen3-Next (loaders/qwen3_next.cpp): a full-attention layer's plan; its layer kinds.
LayerPlan qwen3_next(const FamilyContext& x);
// Whether layer `layer` of a qwen3_next config is a full-attention one (layer_types, or every
// full_attention_interval-th layer, default 4); Error(config path) for another kind.
bool qwen3_next_full_layer(const ConfigJson& c, std::int64_t layer);

// A model directory's config.json, parsed (Error(path) when it is not a JSON object with a
// string model_type; loaders/pretrained.cpp).
ConfigJson read_model_config(const std::string& dir);

}  // namespace simdattn::detail
