// The published families (families.hpp): BERT and ViT encoders, GPT-2, T5, BLOOM, the
// Llama-like decoders and gpt-oss, each read from its config.json and its checkpoint's tensor
// names.
#include "loaders/families.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "core/text.hpp"
#include "loaders/checkpoint.hpp"
#include "loaders/config_json.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// Where `suffix` (e.g. "encoder.layer.3.attention.self.query.weight") sits in the checkpoint:
// the prefix before it ("", "bert.", "model.", ...). Exactly one tensor may end with it.
std::string find_prefix(const Checkpoint& ck, const std::string& dir, const std::string& suffix) {
  std::optional<std::string> found;
  for (const std::string& name : ck.names()) {
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string prefix = name.substr(0, name.size() - suffix.size());
    if (!prefix.empty() && prefix.back() != '.') continue;
    if (found && *found != prefix)
      throw Error(dir, "two tensors end in '" + suffix + "' ('" + *found + suffix + "' and '" + name + "')");
    found = prefix;
  }
  if (!found) throw Error(dir, "no tensor named '" + suffix + "' (under any prefix)");
  return *found;
}

void check_layer(const ConfigJson& c, const char* key, std::int64_t n, std::int64_t layer) {
  if (layer < 0 || layer >= n)
    throw Error("layer", "expected 0 <= layer < " + std::string(key) + " = " + std::to_string(n) + " (" + c.path() +
                             "), got " + std::to_string(layer));
}

void only_self(const FamilyContext& x, const char* family) {
  if (!x.opt.attention.empty() && x.opt.attention != "self")
    throw Error("attention", std::string(family) + " has self-attention only, got '" + x.opt.attention + "'");
  if (!x.opt.stack.empty()) throw Error("stack", std::string(family) + " has one stack, got '" + x.opt.stack + "'");
}

namespace {

// BERT, RoBERTa (attention.self.*) and ViT, DeiT (attention.attention.*): encoder
// self-attention, nn.Linear projections with biases, output through attention.output.dense.
LayerPlan encoder_layer(const FamilyContext& x, const char* family, const char* inner) {
  only_self(x, family);
  LayerPlan p;
  p.cfg.d_model = x.c.integer("hidden_size");
  p.cfg.heads = x.c.integer("num_attention_heads");
  x.c.divides("hidden_size", p.cfg.d_model, "num_attention_heads", p.cfg.heads);
  check_layer(x.c, "num_hidden_layers", x.c.integer_or("num_hidden_layers", 12), x.layer);  // (absent: the classes' 12)
  // BERT's relative_key(_query) position scores are not this layer's; a decoder BERT is causal
  if (x.c.has("position_embedding_type")) {
    const JsonValue& t = x.c.at("position_embedding_type");
    if (!t.is_string() || t.string() != "absolute")
      throw Error(x.c.path(), "\"position_embedding_type\" " + t.brief() +
                                  " is not supported (absolute: the position embeddings are outside the layer)");
  }
  p.cfg.causal = x.c.boolean_or("is_decoder", false);
  const std::string base = "encoder.layer." + std::to_string(x.layer) + ".attention.";
  const std::string pre = find_prefix(x.ck, x.dir, base + inner + ".query.weight") + base;
  const std::string s = pre + inner + ".";
  p.wq = whole(s + "query.weight"), p.wk = whole(s + "key.weight"), p.wv = whole(s + "value.weight");
  p.wo = whole(pre + "output.dense.weight");
  // ViT's qkv_bias (default true; null: none, as nn.Linear's bias=None) may drop the input
  // biases; the output's is always there
  const bool qkv_bias = x.c.truthy_or("qkv_bias", true);
  if (qkv_bias) p.bq = whole(s + "query.bias"), p.bk = whole(s + "key.bias"), p.bv = whole(s + "value.bias");
  p.bo = whole(pre + "output.dense.bias");
  return p;
}
LayerPlan bert(const FamilyContext& x) { return encoder_layer(x, "bert", "self"); }
LayerPlan vit(const FamilyContext& x) { return encoder_layer(x, "vit", "attention"); }

// GPT-2: causal self-attention; c_attn is a Conv1D [d, 3d] (q | k | v columns), c_proj [d, d].
// Scores scaled by 1/sqrt(hd) (scale_attn_weights), and by 1/(layer + 1) more with
// scale_attn_by_inverse_layer_idx.
LayerPlan gpt2(const FamilyContext& x) {
  only_self(x, "gpt2");
  LayerPlan p;
  // (hidden_size, num_attention_heads, num_hidden_layers: GPT2Config's attribute_map names)
  p.cfg.d_model = x.c.integer_of({"n_embd", "hidden_size"});
  p.cfg.heads = x.c.integer_of({"n_head", "num_attention_heads"});
  check_layer(x.c, "n_layer", x.c.integer_of_or({"n_layer", "num_hidden_layers"}, 12), x.layer);
  p.cfg.causal = true;
  x.c.divides("n_embd", p.cfg.d_model, "n_head", p.cfg.heads);
  double scale = x.c.truthy_or("scale_attn_weights", true)  // (null: GPT2Attention's test is false)
                     ? 1.0 / std::sqrt(static_cast<double>(p.cfg.d_model / p.cfg.heads))
                     : 1.0;
  if (x.c.boolean_or("scale_attn_by_inverse_layer_idx", false)) scale /= static_cast<double>(x.layer + 1);
  p.cfg.scale = scale;
  const std::string base = "h." + std::to_string(x.layer) + ".attn.";
  const std::string s = find_prefix(x.ck, x.dir, base + "c_attn.weight") + base;
  for (int i = 0; i < 3; ++i) {
    (i == 0 ? p.wq : i == 1 ? p.wk : p.wv) = Part{s + "c_attn.weight", Part::Take::conv1d, i};
    (i == 0 ? p.bq : i == 1 ? p.bk : p.bv) = Part{s + "c_attn.bias", Part::Take::conv1d, i};
  }
  p.wo = Part{s + "c_proj.weight", Part::Take::conv1d, 0, 1};  // [d, d]: one block
  p.bo = whole(s + "c_proj.bias");
  return p;
}

// T5: {q, k, v, o} without biases, no score scaling (scale 1); the relative position bias table
// lives in block 0 of each stack and serves every layer: bidirectional in the encoder, one-way
// and causal in the decoder; the decoder's cross-attention (EncDecAttention) has none.
LayerPlan t5(const FamilyContext& x) {
  LayerPlan p;
  const std::string& stack = x.opt.stack.empty() ? std::string("encoder") : x.opt.stack;
  if (stack != "encoder" && stack != "decoder")
    throw Error("stack", "t5 has an encoder and a decoder stack, got '" + stack + "'");
  const bool decoder = stack == "decoder", cross = x.opt.attention == "cross";
  if (!x.opt.attention.empty() && x.opt.attention != "self" && !cross)
    throw Error("attention", "expected self or cross, got '" + x.opt.attention + "'");
  if (cross && !decoder) throw Error("attention", "t5's cross-attention is in the decoder stack (stack decoder)");
  // (hidden_size, num_attention_heads, num_hidden_layers: T5Config's attribute_map names)
  p.cfg.d_model = x.c.integer_of({"d_model", "hidden_size"});
  p.cfg.heads = x.c.integer_of({"num_heads", "num_attention_heads"});
  p.cfg.head_dim = x.c.integer_or("d_kv", 64);  // (absent: T5Config's 64)
  const std::int64_t layers = x.c.integer_of_or({"num_layers", "num_hidden_layers"}, 6);
  if (decoder) check_layer(x.c, "num_decoder_layers", x.c.integer_or("num_decoder_layers", layers), x.layer);
  else check_layer(x.c, "num_layers", layers, x.layer);
  p.cfg.scale = 1.0;
  const std::string block = stack + ".block." + std::to_string(x.layer) + ".";
  const std::string sub = cross ? "layer.1.EncDecAttention." : "layer.0.SelfAttention.";
  const std::string s = find_prefix(x.ck, x.dir, block + sub + "q.weight") + block + sub;
  p.wq = whole(s + "q.weight"), p.wk = whole(s + "k.weight"), p.wv = whole(s + "v.weight"), p.wo = whole(s + "o.weight");
  p.cross = cross;
  if (!cross) {
    const std::string table = stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    p.t5_table = find_prefix(x.ck, x.dir, table) + table;
    p.cfg.t5_bidirectional = !decoder;
    p.cfg.t5_max_distance = x.c.integer_or("relative_attention_max_distance", 128, 1, std::int64_t{1} << 40);
    p.t5_max_distance_key = x.c.path();
    p.cfg.causal = decoder;
  }
  return p;
}

// BLOOM: causal self-attention with ALiBi (the standard slopes); query_key_value [3d, d] holds
// per head its q, k and v rows; dense is the output projection.
LayerPlan bloom(const FamilyContext& x) {
  only_self(x, "bloom");
  LayerPlan p;
  p.cfg.d_model = x.c.integer_of({"hidden_size", "n_embed"});
  p.cfg.heads = x.c.integer_of({"n_head", "num_attention_heads"});
  x.c.divides(x.c.has("hidden_size") ? "hidden_size" : "n_embed", p.cfg.d_model,
              x.c.has("n_head") ? "n_head" : "num_attention_heads", p.cfg.heads);
  check_layer(x.c, "n_layer", x.c.integer_of_or({"n_layer", "num_hidden_layers"}, 2), x.layer);
  p.cfg.causal = true;
  p.cfg.alibi_slopes = standard_alibi_slopes(p.cfg.heads);
  const std::string base = "h." + std::to_string(x.layer) + ".self_attention.";
  const std::string s = find_prefix(x.ck, x.dir, base + "query_key_value.weight") + base;
  for (int i = 0; i < 3; ++i) {
    (i == 0 ? p.wq : i == 1 ? p.wk : p.wv) = Part{s + "query_key_value.weight", Part::Take::fused_heads, i};
    (i == 0 ? p.bq : i == 1 ? p.bk : p.bv) = Part{s + "query_key_value.bias", Part::Take::fused_heads, i};
  }
  p.wo = whole(s + "dense.weight"), p.bo = whole(s + "dense.bias");
  return p;
}

// YaRN's get_mscale (Hugging Face's modeling_rope_utils): 1 for a factor <= 1.
double yarn_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

}  // namespace

// RoPE from rope_theta, rope_scaling and partial_rotary_factor, or from rope_parameters (the
// same keys in one object, as newer configs write them). max_positions: max_position_embeddings'
// default in the family's configuration class (yarn's original_max_position_embeddings when
// absent); theta: rope_theta's default there; partial_rotary_factor: its default there.
RopeConfig rope_of(const ConfigJson& c, std::int64_t head_dim, std::int64_t max_positions, double theta,
                   double partial_rotary_factor) {
  RopeConfig r;
  const bool params = c.has("rope_parameters");
  const char* key = params ? "rope_parameters" : "rope_scaling";
  const JsonValue* s = nullptr;
  if (c.has(key)) {
    s = &c.at(key);
    if (!s->is_object()) throw Error(c.path(), "\"" + std::string(key) + "\" must be an object or null, got " + s->brief());
  }
  auto num = [&](const char* name, const std::string& type) {
    const JsonValue* v = s->find(name);
    const std::optional<double> x = v != nullptr ? v->as_double() : std::nullopt;
    if (!x || !std::isfinite(*x))
      throw Error(c.path(), "\"" + std::string(key) + "\" of type " + type + " needs a number \"" + name + "\"");
    return *x;
  };
  r.theta = params && s != nullptr && s->find("rope_theta") != nullptr ? num("rope_theta", "any") : c.number_or("rope_theta", theta);
  const double partial = params && s != nullptr && s->find("partial_rotary_factor") != nullptr
                             ? num("partial_rotary_factor", "any")
                             : c.present("partial_rotary_factor") ? c.number_or("partial_rotary_factor", 1.0)  // null: whole
                                                                  : partial_rotary_factor;
  if (!(partial > 0.0 && partial <= 1.0))
    throw Error(c.path(), "\"partial_rotary_factor\" must be in (0, 1], got " + std::to_string(partial));
  if (!(r.theta > 0.0)) throw Error(c.path(), "\"rope_theta\" must be > 0, got " + std::to_string(r.theta));
  r.rotary_dim = static_cast<std::int64_t>(static_cast<double>(head_dim) * partial);
  if (r.rotary_dim < 2 || r.rotary_dim % 2 != 0)
    throw Error(c.path(), "\"partial_rotary_factor\" " + std::to_string(partial) + " of head_dim " +
                              std::to_string(head_dim) + " rotates " + std::to_string(r.rotary_dim) +
                              " dimensions (expected an even number >= 2)");
  if (s == nullptr) return r;
  const JsonValue* type_value = s->find("rope_type");
  if (type_value == nullptr) type_value = s->find("type");
  if (type_value == nullptr || !type_value->is_string())
    throw Error(c.path(), "\"" + std::string(key) + "\" needs a string \"rope_type\"");
  const std::string type = type_value->string();
  if (type == "default") return r;
  const double max_pos =
      static_cast<double>(c.integer_or("max_position_embeddings", max_positions, 1, std::int64_t{1} << 40));
  auto given = [&](const char* name) {
    const JsonValue* v = s->find(name);
    return v != nullptr && !v->is_null();
  };
  // llama3's and yarn's original_max_position_embeddings: the config's own key where it has one
  // (transformers' standardize_rope_params puts it over the scaling's), else the scaling's, else
  // max_position_embeddings
  auto original_max = [&]() {
    const double omp = c.has("original_max_position_embeddings") ? c.number("original_max_position_embeddings")
                       : given("original_max_position_embeddings") ? num("original_max_position_embeddings", type)
                                                                  : max_pos;
    if (!(omp >= 1.0 && omp <= 1e12))
      throw Error(c.path(), "\"original_max_position_embeddings\" must be in [1, 1e12], got " + std::to_string(omp));
    return omp;
  };
  if (type == "linear") {
    r.scaling = RopeScaling::linear;
    r.factor = num("factor", type);
  } else if (type == "llama3") {
    r.scaling = RopeScaling::llama3;
    r.factor = num("factor", type);
    r.low_freq_factor = num("low_freq_factor", type);
    r.high_freq_factor = num("high_freq_factor", type);
    r.original_max_positions = static_cast<std::int64_t>(original_max());
  } else if (type == "yarn") {
    // as Hugging Face's _compute_yarn_parameters reads them: beta_fast / beta_slow 32 / 1 when
    // absent or zero; factor absent: max_position_embeddings / original_max_position_embeddings;
    // attention_factor absent: the mscale ratio when mscale and mscale_all_dim are both nonzero,
    // else get_mscale(factor)
    r.scaling = RopeScaling::yarn;
    const double omp = original_max();
    r.original_max_positions = static_cast<std::int64_t>(omp);
    r.factor = given("factor") ? num("factor", type) : max_pos / omp;
    auto or_default = [&](const char* name, double fallback) {
      const double v = given(name) ? num(name, type) : 0.0;
      return v != 0.0 ? v : fallback;
    };
    r.beta_fast = or_default("beta_fast", 32.0);
    r.beta_slow = or_default("beta_slow", 1.0);
    if (!(r.beta_fast > 0.0 && r.beta_slow > 0.0))
      throw Error(c.path(), "\"" + std::string(key) + "\" needs \"beta_fast\" and \"beta_slow\" > 0");
    if (given("attention_factor")) {
      r.attention_factor = num("attention_factor", type);
      if (!(r.attention_factor > 0.0))
        throw Error(c.path(), "\"" + std::string(key) + "\" \"attention_factor\" must be > 0");
    } else {
      const double mscale = given("mscale") ? num("mscale", type) : 0.0;
      const double all = given("mscale_all_dim") ? num("mscale_all_dim", type) : 0.0;
      r.attention_factor = mscale != 0.0 && all != 0.0 ? yarn_mscale(r.factor, mscale) / yarn_mscale(r.factor, all)
                                                       : yarn_mscale(r.factor, 1.0);
    }
    if (const JsonValue* t = s->find("truncate"); t != nullptr && !t->is_null()) {
      if (!t->is_boolean()) throw Error(c.path(), "\"" + std::string(key) + "\" \"truncate\" must be true or false");
      r.truncate = t->boolean();
    }
  } else {
    throw Error(c.path(), "\"" + std::string(key) + "\" type '" + type + "' is not supported (default, linear, llama3 or yarn)");
  }
  if (!(r.factor > 0.0)) throw Error(c.path(), "\"" + std::string(key) + "\" \"factor\" must be > 0");
  if (r.scaling == RopeScaling::llama3 && !(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor))
    throw Error(c.path(), "\"" + std::string(key) + "\" needs 0 < \"low_freq_factor\" < \"high_freq_factor\"");
  return r;
}

namespace {

// Whether layer `layer` of a Qwen2 / Qwen3 / Gemma 2 model uses the sliding window: layer_types
// when the config lists them, else the family's rule.
bool sliding_layer(const ConfigJson& c, std::int64_t layer, bool fallback) {
  if (!c.has("layer_types")) return fallback;
  const JsonValue& t = c.at("layer_types");
  if (!t.is_array() || static_cast<std::int64_t>(t.size()) <= layer || !t[static_cast<std::size_t>(layer)].is_string())
    throw Error(c.path(), "\"layer_types\" must list a string for layer " + std::to_string(layer));
  const std::string kind = t[static_cast<std::size_t>(layer)].string();
  if (kind == "sliding_attention") return true;
  if (kind == "full_attention") return false;
  throw Error(c.path(), "\"layer_types\"[" + std::to_string(layer) + "] is '" + kind +
                            "' (expected full_attention or sliding_attention)");
}

// The sliding window the config sets (sliding_window(W), families.hpp). Absent:
// the family's default W (`fallback`, as its configuration class fills it in); null: none.
std::optional<Window> window_of(const ConfigJson& c, const char* key, std::int64_t fallback) {
  if (c.present(key) && !c.has(key)) return std::nullopt;
  const std::int64_t w = c.has(key) ? c.integer(key, 1, std::int64_t{1} << 40) : fallback;
  return sliding_window(w);
}

// A number the family's configuration class defaults to `fallback` when absent; null: none.
std::optional<double> positive_or(const ConfigJson& c, const char* key, double fallback) {
  if (c.present(key) && !c.has(key)) return std::nullopt;
  return c.has(key) ? c.positive(key) : fallback;
}

// Llama, Mistral, Qwen2, Qwen3, Gemma 2: self_attn.{q,k,v,o}_proj, grouped-query heads, RoPE,
// causal.
LayerPlan llama_like(const FamilyContext& x, const std::string& family) {
  only_self(x, family.c_str());
  LayerPlan p;
  const ConfigJson& c = x.c;
  p.cfg.d_model = c.integer("hidden_size");
  p.cfg.heads = c.integer("num_attention_heads");
  // num_key_value_heads absent: the configuration class's default (Mistral 8, Qwen2 and Qwen3 32,
  // Gemma 2 4, Llama none: as many as heads); null: as many as heads
  const std::int64_t kv_default = family == "mistral" ? 8
                                  : family == "gemma2"  ? 4
                                  : family == "qwen2" || family == "qwen3" ? 32
                                                                           : p.cfg.heads;
  p.cfg.kv_heads = c.integer_or_null("num_key_value_heads", kv_default, p.cfg.heads);
  c.divides("num_attention_heads", p.cfg.heads, "num_key_value_heads", p.cfg.kv_heads);
  // head_dim: the config's; absent, Gemma 2's default 256, Qwen3's 128, the others' hidden_size / heads
  const bool fixed_head_dim = !c.present("head_dim") && (family == "gemma2" || family == "qwen3");
  if (!c.has("head_dim") && !fixed_head_dim) c.divides("hidden_size", p.cfg.d_model, "num_attention_heads", p.cfg.heads);
  p.cfg.head_dim = c.integer_or("head_dim", !fixed_head_dim ? p.cfg.d_model / p.cfg.heads : family == "gemma2" ? 256 : 128);
  check_layer(c, "num_hidden_layers", c.integer_or("num_hidden_layers", family == "gemma2" ? 26 : 32), x.layer);
  p.cfg.causal = true;
  // (max_position_embeddings' defaults: LlamaConfig's 2048, Mistral's 131072, Qwen2's and Qwen3's
  // 32768, Gemma 2's 8192)
  const std::int64_t max_positions = family == "mistral" ? 131072
                                     : family == "gemma2" ? 8192
                                     : family == "qwen2" || family == "qwen3" ? 32768
                                                                              : 2048;
  p.cfg.rope = rope_of(c, p.cfg.head_dim, max_positions);
  const std::string base = "layers." + std::to_string(x.layer) + ".self_attn.";
  const std::string s = find_prefix(x.ck, x.dir, base + "q_proj.weight") + base;
  p.wq = whole(s + "q_proj.weight"), p.wk = whole(s + "k_proj.weight"), p.wv = whole(s + "v_proj.weight");
  p.wo = whole(s + "o_proj.weight");
  // attention_bias: all four projections (Llama, Qwen3, Gemma 2); Qwen2's q, k and v always
  // and o never; Mistral's none
  bool qkv_bias = c.boolean_or("attention_bias", false), o_bias = qkv_bias;
  if (family == "qwen2") qkv_bias = true, o_bias = false;
  if (family == "mistral") qkv_bias = o_bias = false;
  if (qkv_bias) p.bq = whole(s + "q_proj.bias"), p.bk = whole(s + "k_proj.bias"), p.bv = whole(s + "v_proj.bias");
  if (o_bias) p.bo = whole(s + "o_proj.bias");
  if (family == "qwen3") {
    p.q_norm = s + "q_norm.weight", p.k_norm = s + "k_norm.weight";
    p.cfg.qk_norm_eps = c.number_or("rms_norm_eps", 1e-6);
    if (p.cfg.qk_norm_eps < 0.0) throw Error(c.path(), "\"rms_norm_eps\" must be >= 0, got " + std::to_string(p.cfg.qk_norm_eps));
  }
  // Absent keys take the defaults of the family's configuration class (sliding_window 4096,
  // max_window_layers 28, query_pre_attn_scalar 256, attn_logit_softcapping 50); null: none.
  if (family == "mistral") {
    p.cfg.window = window_of(c, "sliding_window", 4096);
  } else if (family == "qwen2" || family == "qwen3") {
    // use_sliding_window: the layers from max_window_layers on (or as layer_types says)
    if (c.boolean_or("use_sliding_window", false) &&
        sliding_layer(c, x.layer, x.layer >= c.integer_or("max_window_layers", 28, 0, ConfigJson::kMax)))
      p.cfg.window = window_of(c, "sliding_window", 4096);
  } else if (family == "gemma2") {
    // every other layer from layer 0 slides (or as layer_types says); scores scaled by
    // query_pre_attn_scalar^-1/2 and capped by attn_logit_softcapping
    if (sliding_layer(c, x.layer, x.layer % 2 == 0)) p.cfg.window = window_of(c, "sliding_window", 4096);
    const std::optional<double> scalar = positive_or(c, "query_pre_attn_scalar", 256.0);
    if (!scalar) throw Error(c.path(), "\"query_pre_attn_scalar\" must be a number > 0, got null");
    p.cfg.scale = 1.0 / std::sqrt(*scalar);
    p.cfg.softcap = positive_or(c, "attn_logit_softcapping", 50.0);
  }
  return p;
}

// gpt-oss (transformers' GptOssAttention): grouped-query heads (num_key_value_heads, default 8)
// of head_dim (default 64; null: hidden_size / heads), biased
// projections (attention_bias, default true), one learned sink logit per head (self_attn.sinks)
// in the softmax's denominator, the sliding window (sliding_window, default 128) on the layers
// layer_types calls sliding_attention (default: the even ones), YaRN RoPE in rotate_half pairs
// (absent: the configuration class's factor 32 over 4096 positions, beta 32 / 1, truncate false;
// rope_theta default 150000), scores at head_dim^-1/2.
LayerPlan gpt_oss(const FamilyContext& x) {
  only_self(x, "gpt_oss");
  LayerPlan p;
  const ConfigJson& c = x.c;
  p.cfg.d_model = c.integer("hidden_size");
  p.cfg.heads = c.integer("num_attention_heads");
  // GptOssConfig: absent, its field defaults (8 kv heads, head_dim 64); null, __post_init__'s
  // (as many kv heads as heads, hidden_size / heads)
  p.cfg.kv_heads = c.integer_or_null("num_key_value_heads", 8, p.cfg.heads);
  c.divides("num_attention_heads", p.cfg.heads, "num_key_value_heads", p.cfg.kv_heads);
  p.cfg.head_dim = c.integer_or_null("head_dim", 64, p.cfg.d_model / p.cfg.heads);
  if (p.cfg.head_dim == 0) throw Error(c.path(), "\"head_dim\" null needs \"hidden_size\" >= \"num_attention_heads\"");
  check_layer(c, "num_hidden_layers", c.integer_or("num_hidden_layers", 36), x.layer);
  p.cfg.causal = true;
  RopeConfig r = rope_of(c, p.cfg.head_dim, 131072, 150000.0);
  if (!c.has("rope_scaling") && !c.has("rope_parameters")) {  // GptOssConfig's default rope_parameters
    r.scaling = RopeScaling::yarn;
    r.factor = 32.0, r.beta_fast = 32.0, r.beta_slow = 1.0, r.truncate = false, r.original_max_positions = 4096;
    r.attention_factor = yarn_mscale(r.factor, 1.0);
  }
  p.cfg.rope = r;
  if (sliding_layer(c, x.layer, x.layer % 2 == 0)) p.cfg.window = window_of(c, "sliding_window", 128);
  const std::string base = "layers." + std::to_string(x.layer) + ".self_attn.";
  const std::string s = find_prefix(x.ck, x.dir, base + "q_proj.weight") + base;
  p.wq = whole(s + "q_proj.weight"), p.wk = whole(s + "k_proj.weight"), p.wv = whole(s + "v_proj.weight");
  p.wo = whole(s + "o_proj.weight");
  if (c.truthy_or("attention_bias", true)) {
    p.bq = whole(s + "q_proj.bias"), p.bk = whole(s + "k_proj.bias"), p.bv = whole(s + "v_proj.bias");
    p.bo = whole(s + "o_proj.bias");
  }
  p.sinks = s + "sinks";
  return p;
}

// DeepSeek-V2 / V3 (transformers' DeepseekV2Attention / DeepseekV3Attention): Multi-head Latent
// Attention (MlaConfig) from q_lora_rank (null: a plain q_proj), kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim, v_head_dim (the configuration classes' defaults 1536, 512, 128, 64, 128 when
// absent); RoPE over the qk_rope_head_dim dimensions in interleaved pairs (V3 with rope_interleave
// false: rotate_half), YaRN as rope_scaling says; scores at (nope + rope)^-1/2 times mscale^2 (=
// get_mscale(factor, mscale_all_dim), when the scaling's type is not default and mscale_all_dim
// is nonzero); the RMSNorms at the class default eps 1e-6; biases on q_a_proj,
// kv_a_proj_with_mqa and o_proj with attention_bias.
LayerPlan deepseek(const FamilyContext& x, const std::string& family) {
  only_self(x, family.c_str());
  LayerPlan p;
  const ConfigJson& c = x.c;
  p.cfg.d_model = c.integer("hidden_size");
  p.cfg.heads = c.integer("num_attention_heads");
  check_layer(c, "num_hidden_layers", c.integer_or("num_hidden_layers", family == "deepseek_v2" ? 30 : 61), x.layer);
  MlaConfig m;
  for (const char* key : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
    if (!c.present(key)) p.mla.defaulted += std::string(p.mla.defaulted.empty() ? "" : ", ") + "\"" + key + "\"";
  m.q_lora_rank = c.present("q_lora_rank") && !c.has("q_lora_rank") ? 0 : c.integer_or("q_lora_rank", 1536);
  m.kv_lora_rank = c.integer_or("kv_lora_rank", 512);
  m.qk_nope_head_dim = c.integer_or("qk_nope_head_dim", 128, 0, ConfigJson::kMax);
  m.qk_rope_head_dim = c.integer_or("qk_rope_head_dim", 64);
  m.v_head_dim = c.integer_or("v_head_dim", 128);
  if (m.qk_rope_head_dim % 2 != 0)
    throw Error(c.path(), "\"qk_rope_head_dim\" must be even, got " + std::to_string(m.qk_rope_head_dim));
  p.cfg.mla = m;
  p.cfg.causal = true;
  RopeConfig r = rope_of(c, m.qk_rope_head_dim, family == "deepseek_v2" ? 2048 : 4096, 10000.0);
  // (absent: the configuration's True; null is falsy where DeepseekV3Attention tests it)
  const bool interleave = c.truthy_or("rope_interleave", true);
  r.style = family == "deepseek_v3" && !interleave ? RopeStyle::half : RopeStyle::interleaved;
  p.cfg.rope = r;
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim));
  const char* key = c.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (r.scaling != RopeScaling::none && c.has(key)) {
    const JsonValue* all = c.at(key).find("mscale_all_dim");
    const std::optional<double> a = all != nullptr ? all->as_double() : std::nullopt;
    if (a && *a != 0.0) {
      const double mscale = yarn_mscale(r.factor, *a);
      scale *= mscale * mscale;
    }
  }
  p.cfg.scale = scale;
  const std::string base = "layers." + std::to_string(x.layer) + ".self_attn.";
  const std::string s = find_prefix(x.ck, x.dir, base + "kv_a_proj_with_mqa.weight") + base;
  LayerPlan::Mla& t = p.mla;
  if (m.q_lora_rank > 0) {
    t.wq_a = s + "q_a_proj.weight", t.q_a_norm = s + "q_a_layernorm.weight", t.wq_b = s + "q_b_proj.weight";
  } else {
    t.wq = s + "q_proj.weight";
  }
  t.wkv_a = s + "kv_a_proj_with_mqa.weight", t.kv_a_norm = s + "kv_a_layernorm.weight", t.wkv_b = s + "kv_b_proj.weight";
  t.wo = s + "o_proj.weight";
  if (c.boolean_or("attention_bias", false)) {
    if (m.q_lora_rank > 0) t.bq_a = s + "q_a_proj.bias";
    t.bkv_a = s + "kv_a_proj_with_mqa.bias", t.bo = s + "o_proj.bias";
  }
  p.wq = whole(t.wq.empty() ? t.wq_a : t.wq);  // the stored dtype's tensor
  return p;
}

constexpr Family kFamilies[] = {
    {"bert", bert},
    {"roberta", bert},
    {"vit", vit},
    {"deit", vit},
    {"gpt2", gpt2},
    {"t5", t5},
    {"bloom", bloom},
    {"llama", [](const FamilyContext& x) { return llama_like(x, "llama"); }},
    {"mistral", [](const FamilyContext& x) { return llama_like(x, "mistral"); }},
    {"qwen2", [](const FamilyContext& x) { return llama_like(x, "qwen2"); }},
    {"qwen3", [](const FamilyContext& x) { return llama_like(x, "qwen3"); }},
    {"gemma2", [](const FamilyContext& x) { return llama_like(x, "gemma2"); }},
    {"gpt_oss", gpt_oss},
    {"deepseek_v2", [](const FamilyContext& x) { return deepseek(x, "deepseek_v2"); }},
    {"deepseek_v3", [](const FamilyContext& x) { return deepseek(x, "deepseek_v3"); }},
    {"qwen3_next", qwen3_next},
};

}  // namespace

std::span<const Family> families() { return kFamilies; }

}  // namespace simdattn::detail
