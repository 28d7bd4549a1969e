// Qwen3-Next (transformers' Qwen3NextConfig, Qwen3NextAttention and Qwen3NextGatedDeltaNet): its
// full-attention layers through MultiHeadAttention::from_pretrained (the family entry below), its
// linear-attention layers through GatedDeltaNet::from_pretrained.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "loaders/checkpoint.hpp"
#include "loaders/config_json.hpp"
#include "loaders/families.hpp"
#include "simdattn/error.hpp"
#include "simdattn/gated_delta_net.hpp"

namespace simdattn {
namespace detail {

bool qwen3_next_full_layer(const ConfigJson& c, std::int64_t layer) {
  const std::int64_t n = c.integer_or("num_hidden_layers", 48);
  check_layer(c, "num_hidden_layers", n, layer);
  if (!c.has("layer_types")) {  // the configuration class's pattern
    const std::int64_t every = c.integer_or("full_attention_interval", 4);
    return (layer + 1) % every == 0;
  }
  const JsonValue& t = c.at("layer_types");
  if (!t.is_array() || static_cast<std::int64_t>(t.size()) <= layer || !t[static_cast<std::size_t>(layer)].is_string())
    throw Error(c.path(), "\"layer_types\" must list a string for layer " + std::to_string(layer));
  const std::string kind = t[static_cast<std::size_t>(layer)].string();
  // (and the legacy names transformers' configurations remap: attention, mamba)
  if (kind == "full_attention" || kind == "attention") return true;
  if (kind == "linear_attention" || kind == "mamba") return false;
  throw Error(c.path(), "\"layer_types\"[" + std::to_string(layer) + "] is '" + kind.substr(0, 100) +
                            "' (expected full_attention or linear_attention)");
}

// A full-attention layer: q_proj's rows per head [query | gate] (the gate applied as
// sigmoid(gate) * o before o_proj), q_norm / k_norm as (1 + weight) RMSNorms at rms_norm_eps,
// partial rotary (partial_rotary_factor, default 0.25) in rotate_half pairs, GQA, scores at
// head_dim^-1/2, biases on all four projections with attention_bias (default false).
LayerPlan qwen3_next(const FamilyContext& x) {
  only_self(x, "qwen3_next");
  const ConfigJson& c = x.c;
  if (!qwen3_next_full_layer(c, x.layer))
    throw Error("layer", "layer " + std::to_string(x.layer) + " of " + c.path() +
                             " is a linear_attention layer: load it with GatedDeltaNet::from_pretrained");
  LayerPlan p;
  p.cfg.d_model = c.integer_or("hidden_size", 2048);
  p.cfg.heads = c.integer_or("num_attention_heads", 16);
  p.cfg.kv_heads = c.integer_or("num_key_value_heads", 2);
  c.divides("num_attention_heads", p.cfg.heads, "num_key_value_heads", p.cfg.kv_heads);
  p.cfg.head_dim = c.integer_or("head_dim", 256);
  p.cfg.causal = true;
  p.cfg.output_gate = true;
  p.cfg.rope = rope_of(c, p.cfg.head_dim, 32768, 10000.0, 0.25);
  p.cfg.qk_norm_eps = c.number_or("rms_norm_eps", 1e-6);
  if (p.cfg.qk_norm_eps < 0.0) throw Error(c.path(), "\"rms_norm_eps\" must be >= 0, got " + std::to_string(p.cfg.qk_norm_eps));
  const std::string base = "layers." + std::to_string(x.layer) + ".self_attn.";
  const std::string s = find_prefix(x.ck, x.dir, base + "q_proj.weight") + base;
  p.wq = Part{s + "q_proj.weight", Part::Take::gated_heads, 0};
  p.wg = Part{s + "q_proj.weight", Part::Take::gated_heads, 1};
  p.wk = whole(s + "k_proj.weight"), p.wv = whole(s + "v_proj.weight"), p.wo = whole(s + "o_proj.weight");
  if (c.boolean_or("attention_bias", false)) {
    p.bq = Part{s + "q_proj.bias", Part::Take::gated_heads, 0};
    p.bg = Part{s + "q_proj.bias", Part::Take::gated_heads, 1};
    p.bk = whole(s + "k_proj.bias"), p.bv = whole(s + "v_proj.bias"), p.bo = whole(s + "o_proj.bias");
  }
  p.q_norm = s + "q_norm.weight", p.k_norm = s + "k_norm.weight";
  p.norm_plus_one = true;
  return p;
}

}  // namespace detail

namespace {

using namespace detail;

template <class T>
GatedDeltaNet read_gated_deltanet(const Checkpoint& ck, const std::string& s, const GatedDeltaNetConfig& g) {
  const std::int64_t d = g.hidden_size, H = g.key_heads, Hv = g.value_heads, Dk = g.key_head_dim, Dv = g.value_head_dim;
  const std::int64_t conv_dim = 2 * H * Dk + Hv * Dv;
  GatedDeltaNetWeights<T> w;
  w.in_proj_qkvz = ck.read<T>(s + "in_proj_qkvz.weight", {2 * H * Dk + 2 * Hv * Dv, d});
  w.in_proj_ba = ck.read<T>(s + "in_proj_ba.weight", {2 * Hv, d});
  w.conv = ck.read<T>(s + "conv1d.weight", {conv_dim, 1, g.conv_kernel});
  w.dt_bias = ck.read<float>(s + "dt_bias", {Hv});
  w.A_log = ck.read<float>(s + "A_log", {Hv});
  w.norm = ck.read<float>(s + "norm.weight", {Dv});
  w.out_proj = ck.read<T>(s + "out_proj.weight", {d, Hv * Dv});
  return GatedDeltaNet(g, std::move(w));
}

}  // namespace

GatedDeltaNet GatedDeltaNet::from_pretrained(const std::string& dir, std::int64_t layer, const std::optional<DType>& dtype) {
  const ConfigJson c = read_model_config(dir);
  const std::string type = c.at("model_type").string();
  if (type != "qwen3_next")
    throw Error(c.path(), "model_type '" + type.substr(0, 100) + "' has no gated delta rule layers (qwen3_next has)");
  if (qwen3_next_full_layer(c, layer))
    throw Error("layer", "layer " + std::to_string(layer) + " of " + c.path() +
                             " is a full_attention layer: load it with MultiHeadAttention::from_pretrained");
  if (c.has("hidden_act") && (!c.at("hidden_act").is_string() || c.at("hidden_act").string() != "silu"))
    throw Error(c.path(), "\"hidden_act\" " + c.at("hidden_act").brief() + " is not supported (the conv's activation: silu)");
  GatedDeltaNetConfig g;
  g.hidden_size = c.integer_or("hidden_size", 2048);
  g.key_heads = c.integer_or("linear_num_key_heads", 16);
  g.value_heads = c.integer_or("linear_num_value_heads", 32);
  g.key_head_dim = c.integer_or("linear_key_head_dim", 128);
  g.value_head_dim = c.integer_or("linear_value_head_dim", 128);
  g.conv_kernel = c.integer_or("linear_conv_kernel_dim", 4);
  g.norm_eps = c.number_or("rms_norm_eps", 1e-6);
  c.divides("linear_num_value_heads", g.value_heads, "linear_num_key_heads", g.key_heads);
  const Checkpoint ck(dir);
  const std::string base = "layers." + std::to_string(layer) + ".linear_attn.";
  const std::string s = find_prefix(ck, dir, base + "in_proj_qkvz.weight") + base;
  DType dt = DType::f32;
  if (dtype) {
    dt = *dtype;
  } else {
    const std::string& stored = ck.entry(s + "in_proj_qkvz.weight").dtype;
    dt = stored == "BF16" ? DType::bf16 : stored == "F16" ? DType::f16 : DType::f32;
  }
  switch (dt) {
    case DType::f32: return read_gated_deltanet<float>(ck, s, g);
    case DType::bf16: return read_gated_deltanet<bfloat16>(ck, s, g);
    case DType::f16: return read_gated_deltanet<float16>(ck, s, g);
    default: throw Error("dtype", "expected f32, bf16 or f16, got " + std::string(dtype_name(dt)));
  }
}

}  // namespace simdattn
