// MultiHeadAttention::from_pretrained and from_diffusers: one attention sub-layer of a published
// checkpoint. Each family's entry in kFamilies reads config.json into a LayerPlan (the layer's
// MhaConfig and where each weight comes from, dtype-free); load_plan then reads the weights in
// the layer's dtype. docs/models.md lists what each family's sub-layer includes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>


#include "core/text.hpp"
#include "io/file_io.hpp"
#include "io/json.hpp"
#include "loaders/checkpoint.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"

namespace simdattn {
namespace {

using detail::Checkpoint;
using detail::shape_str;
using Json = detail::JsonValue;

// config.json, its values read with the key named in every error.
class Config {
 public:
  Config(std::string path, Json j) : path_(std::move(path)), j_(std::move(j)) {}
  const std::string& path() const { return path_; }
  bool has(const std::string& key) const {
    const Json* v = j_.find(key);
    return v != nullptr && !v->is_null();
  }
  // Written in the file, null included (null: "none" where the family's default is a value).
  bool present(const std::string& key) const { return j_.find(key) != nullptr; }
  // size % count == 0, else an error naming both keys.
  void divides(const char* size_key, std::int64_t size, const char* count_key, std::int64_t count) const {
    if (size % count != 0)
      throw Error(path_, "\"" + std::string(size_key) + "\" " + std::to_string(size) + " is not a multiple of \"" +
                             count_key + "\" " + std::to_string(count));
  }
  const Json& at(const std::string& key) const {
    if (!has(key)) throw Error(path_, "needs \"" + key + "\" for this model_type");
    return *j_.find(key);
  }
  // Sizes, counts and positions: bounded far above any model's, so that no product of them
  // overflows before the tensors' own shapes are compared.
  static constexpr std::int64_t kMax = std::int64_t{1} << 24;
  std::int64_t integer(const std::string& key, std::int64_t lo = 1, std::int64_t hi = kMax) const {
    const Json& v = at(key);
    const std::optional<std::int64_t> x = v.as_int64();
    if (!x || *x < lo || *x > hi)
      throw Error(path_, "\"" + key + "\" must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], got " + v.brief());
    return *x;
  }
  std::int64_t integer_or(const std::string& key, std::int64_t fallback, std::int64_t lo = 1,
                          std::int64_t hi = kMax) const {
    return has(key) ? integer(key, lo, hi) : fallback;
  }
  double positive(const std::string& key) const {
    const double x = number(key);
    if (!(x > 0.0)) throw Error(path_, "\"" + key + "\" must be > 0, got " + at(key).brief());
    return x;
  }
  double number(const std::string& key) const {
    const Json& v = at(key);
    const std::optional<double> x = v.as_double();
    if (!x || !std::isfinite(*x)) throw Error(path_, "\"" + key + "\" must be a finite number, got " + v.brief());
    return *x;
  }
  double number_or(const std::string& key, double fallback) const { return has(key) ? number(key) : fallback; }
  bool boolean_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& v = *j_.find(key);
    if (!v.is_boolean()) throw Error(path_, "\"" + key + "\" must be true or false, got " + v.brief());
    return v.boolean();
  }
  // The first of `keys` present (legacy names), else an error naming the first.
  std::int64_t integer_of(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return integer(k);
    return integer(*keys.begin());
  }

 private:
  std::string path_;
  Json j_;
};

// One of the layer's weights from a checkpoint tensor.
struct Part {
  enum class Take : std::uint8_t {
    whole,        // the tensor as it is: nn.Linear's [out, in], or a bias [out]
    conv1d,       // GPT-2's Conv1D: weight [in, blocks * out] (x W + b), bias [blocks * out];
                  // block `index` of the columns (c_attn: q | k | v; c_proj: one)
    fused_heads,  // BLOOM's query_key_value: [H * 3 * hd, in], per head q, k, v; `index` of them
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
  std::string q_norm, k_norm;  // QK-norm weights [head_dim] (qwen3)
  std::string t5_table;        // T5's relative attention bias [num_buckets, heads]
  std::string t5_max_distance_key;  // the config that set its max distance (for errors)
  bool cross = false;          // kdim / vdim from the key and value weights' widths
};

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

void check_layer(const Config& c, const char* key, std::int64_t n, std::int64_t layer) {
  if (layer < 0 || layer >= n)
    throw Error("layer", "expected 0 <= layer < " + std::string(key) + " = " + std::to_string(n) + " (" + c.path() +
                             "), got " + std::to_string(layer));
}

Part whole(std::string name) { return Part{std::move(name), Part::Take::whole, 0}; }

// ---- the families ---------------------------------------------------------------------------

struct Ctx {
  const Config& c;
  const Checkpoint& ck;
  const std::string& dir;
  std::int64_t layer;
  const PretrainedOptions& opt;
};

void only_self(const Ctx& x, const char* family) {
  if (x.opt.attention != "self")
    throw Error("attention", std::string(family) + " has self-attention only, got '" + x.opt.attention + "'");
  if (!x.opt.stack.empty()) throw Error("stack", std::string(family) + " has one stack, got '" + x.opt.stack + "'");
}

// BERT, RoBERTa (attention.self.*) and ViT, DeiT (attention.attention.*): encoder
// self-attention, nn.Linear projections with biases, output through attention.output.dense.
LayerPlan encoder_layer(const Ctx& x, const char* family, const char* inner) {
  only_self(x, family);
  LayerPlan p;
  p.cfg.d_model = x.c.integer("hidden_size");
  p.cfg.heads = x.c.integer("num_attention_heads");
  x.c.divides("hidden_size", p.cfg.d_model, "num_attention_heads", p.cfg.heads);
  check_layer(x.c, "num_hidden_layers", x.c.integer("num_hidden_layers"), x.layer);
  // BERT's relative_key(_query) position scores are not this layer's; a decoder BERT is causal
  if (x.c.has("position_embedding_type")) {
    const Json& t = x.c.at("position_embedding_type");
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
  // ViT's qkv_bias (default true) may drop the input biases; the output's is always there
  const bool qkv_bias = x.c.boolean_or("qkv_bias", true);
  if (qkv_bias) p.bq = whole(s + "query.bias"), p.bk = whole(s + "key.bias"), p.bv = whole(s + "value.bias");
  p.bo = whole(pre + "output.dense.bias");
  return p;
}
LayerPlan bert(const Ctx& x) { return encoder_layer(x, "bert", "self"); }
LayerPlan vit(const Ctx& x) { return encoder_layer(x, "vit", "attention"); }

// GPT-2: causal self-attention; c_attn is a Conv1D [d, 3d] (q | k | v columns), c_proj [d, d].
// Scores scaled by 1/sqrt(hd) (scale_attn_weights), and by 1/(layer + 1) more with
// scale_attn_by_inverse_layer_idx.
LayerPlan gpt2(const Ctx& x) {
  only_self(x, "gpt2");
  LayerPlan p;
  p.cfg.d_model = x.c.integer("n_embd");
  p.cfg.heads = x.c.integer("n_head");
  check_layer(x.c, "n_layer", x.c.integer("n_layer"), x.layer);
  p.cfg.causal = true;
  x.c.divides("n_embd", p.cfg.d_model, "n_head", p.cfg.heads);
  double scale = x.c.boolean_or("scale_attn_weights", true)
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
LayerPlan t5(const Ctx& x) {
  LayerPlan p;
  const std::string& stack = x.opt.stack.empty() ? std::string("encoder") : x.opt.stack;
  if (stack != "encoder" && stack != "decoder")
    throw Error("stack", "t5 has an encoder and a decoder stack, got '" + stack + "'");
  const bool decoder = stack == "decoder", cross = x.opt.attention == "cross";
  if (x.opt.attention != "self" && !cross)
    throw Error("attention", "expected self or cross, got '" + x.opt.attention + "'");
  if (cross && !decoder) throw Error("attention", "t5's cross-attention is in the decoder stack (stack decoder)");
  p.cfg.d_model = x.c.integer("d_model");
  p.cfg.heads = x.c.integer("num_heads");
  p.cfg.head_dim = x.c.integer("d_kv");
  const std::int64_t layers = x.c.integer("num_layers");
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
LayerPlan bloom(const Ctx& x) {
  only_self(x, "bloom");
  LayerPlan p;
  p.cfg.d_model = x.c.integer_of({"hidden_size", "n_embed"});
  p.cfg.heads = x.c.integer_of({"n_head", "num_attention_heads"});
  x.c.divides(x.c.has("hidden_size") ? "hidden_size" : "n_embed", p.cfg.d_model,
              x.c.has("n_head") ? "n_head" : "num_attention_heads", p.cfg.heads);
  check_layer(x.c, "n_layer", x.c.integer_of({"n_layer", "num_hidden_layers"}), x.layer);
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

// RoPE from rope_theta, rope_scaling and partial_rotary_factor, or from rope_parameters (the
// same keys in one object, as newer configs write them).
RopeConfig rope_of(const Config& c, std::int64_t head_dim) {
  RopeConfig r;
  const bool params = c.has("rope_parameters");
  const char* key = params ? "rope_parameters" : "rope_scaling";
  const Json* s = nullptr;
  if (c.has(key)) {
    s = &c.at(key);
    if (!s->is_object()) throw Error(c.path(), "\"" + std::string(key) + "\" must be an object or null, got " + s->brief());
  }
  auto num = [&](const char* name, const std::string& type) {
    const Json* v = s->find(name);
    const std::optional<double> x = v != nullptr ? v->as_double() : std::nullopt;
    if (!x || !std::isfinite(*x))
      throw Error(c.path(), "\"" + std::string(key) + "\" of type " + type + " needs a number \"" + name + "\"");
    return *x;
  };
  r.theta = params && s != nullptr && s->find("rope_theta") != nullptr ? num("rope_theta", "any") : c.number_or("rope_theta", 10000.0);
  const double partial = params && s != nullptr && s->find("partial_rotary_factor") != nullptr
                             ? num("partial_rotary_factor", "any")
                             : c.number_or("partial_rotary_factor", 1.0);
  if (!(partial > 0.0 && partial <= 1.0))
    throw Error(c.path(), "\"partial_rotary_factor\" must be in (0, 1], got " + std::to_string(partial));
  if (!(r.theta > 0.0)) throw Error(c.path(), "\"rope_theta\" must be > 0, got " + std::to_string(r.theta));
  r.rotary_dim = static_cast<std::int64_t>(static_cast<double>(head_dim) * partial);
  if (r.rotary_dim < 2 || r.rotary_dim % 2 != 0)
    throw Error(c.path(), "\"partial_rotary_factor\" " + std::to_string(partial) + " of head_dim " +
                              std::to_string(head_dim) + " rotates " + std::to_string(r.rotary_dim) +
                              " dimensions (expected an even number >= 2)");
  if (s == nullptr) return r;
  const Json* type_value = s->find("rope_type");
  if (type_value == nullptr) type_value = s->find("type");
  if (type_value == nullptr || !type_value->is_string())
    throw Error(c.path(), "\"" + std::string(key) + "\" needs a string \"rope_type\"");
  const std::string type = type_value->string();
  if (type == "default") return r;
  if (type == "linear") {
    r.scaling = RopeScaling::linear;
    r.factor = num("factor", type);
  } else if (type == "llama3") {
    r.scaling = RopeScaling::llama3;
    r.factor = num("factor", type);
    r.low_freq_factor = num("low_freq_factor", type);
    r.high_freq_factor = num("high_freq_factor", type);
    const double omp = num("original_max_position_embeddings", type);
    if (!(omp >= 1.0 && omp <= 1e12))
      throw Error(c.path(), "\"original_max_position_embeddings\" must be in [1, 1e12], got " + std::to_string(omp));
    r.original_max_positions = static_cast<std::int64_t>(omp);
  } else {
    throw Error(c.path(), "\"" + std::string(key) + "\" type '" + type + "' is not supported (default, linear or llama3)");
  }
  if (!(r.factor > 0.0)) throw Error(c.path(), "\"" + std::string(key) + "\" \"factor\" must be > 0");
  if (r.scaling == RopeScaling::llama3 && !(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor))
    throw Error(c.path(), "\"" + std::string(key) + "\" needs 0 < \"low_freq_factor\" < \"high_freq_factor\"");
  return r;
}

// Whether layer `layer` of a Qwen2 / Qwen3 / Gemma 2 model uses the sliding window: layer_types
// when the config lists them, else the family's rule.
bool sliding_layer(const Config& c, std::int64_t layer, bool fallback) {
  if (!c.has("layer_types")) return fallback;
  const Json& t = c.at("layer_types");
  if (!t.is_array() || static_cast<std::int64_t>(t.size()) <= layer || !t[static_cast<std::size_t>(layer)].is_string())
    throw Error(c.path(), "\"layer_types\" must list a string for layer " + std::to_string(layer));
  const std::string kind = t[static_cast<std::size_t>(layer)].string();
  if (kind == "sliding_attention") return true;
  if (kind == "full_attention") return false;
  throw Error(c.path(), "\"layer_types\"[" + std::to_string(layer) + "] is '" + kind +
                            "' (expected full_attention or sliding_attention)");
}

// The sliding window the config sets: W keys ending at the query (its own included), as the
// causal sliding-window masks of Hugging Face's models keep them, i.e. Window{W - 1, 0}. Absent:
// the family's default W (`fallback`, as its configuration class fills it in); null: none.
std::optional<Window> window_of(const Config& c, const char* key, std::int64_t fallback) {
  if (c.present(key) && !c.has(key)) return std::nullopt;
  const std::int64_t w = c.has(key) ? c.integer(key, 1, std::int64_t{1} << 40) : fallback;
  return Window{w - 1, 0};
}

// A number the family's configuration class defaults to `fallback` when absent; null: none.
std::optional<double> positive_or(const Config& c, const char* key, double fallback) {
  if (c.present(key) && !c.has(key)) return std::nullopt;
  return c.has(key) ? c.positive(key) : fallback;
}

// Llama, Mistral, Qwen2, Qwen3, Gemma 2: self_attn.{q,k,v,o}_proj, grouped-query heads, RoPE,
// causal.
LayerPlan llama_like(const Ctx& x, const std::string& family) {
  only_self(x, family.c_str());
  LayerPlan p;
  const Config& c = x.c;
  p.cfg.d_model = c.integer("hidden_size");
  p.cfg.heads = c.integer("num_attention_heads");
  p.cfg.kv_heads = c.integer_or("num_key_value_heads", p.cfg.heads);
  c.divides("num_attention_heads", p.cfg.heads, "num_key_value_heads", p.cfg.kv_heads);
  // head_dim: the config's; else Gemma 2's default 256, the others' hidden_size / heads
  if (!c.has("head_dim") && family != "gemma2") c.divides("hidden_size", p.cfg.d_model, "num_attention_heads", p.cfg.heads);
  p.cfg.head_dim = c.integer_or("head_dim", family == "gemma2" ? 256 : p.cfg.d_model / p.cfg.heads);
  check_layer(c, "num_hidden_layers", c.integer("num_hidden_layers"), x.layer);
  p.cfg.causal = true;
  p.cfg.rope = rope_of(c, p.cfg.head_dim);
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
        sliding_layer(c, x.layer, x.layer >= c.integer_or("max_window_layers", 28, 0, Config::kMax)))
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

struct Family {
  const char* model_type;
  LayerPlan (*plan)(const Ctx&);
};
constexpr Family kFamilies[] = {
    {"bert", bert},
    {"roberta", bert},
    {"vit", vit},
    {"deit", vit},
    {"gpt2", gpt2},
    {"t5", t5},
    {"bloom", bloom},
    {"llama", [](const Ctx& x) { return llama_like(x, "llama"); }},
    {"mistral", [](const Ctx& x) { return llama_like(x, "mistral"); }},
    {"qwen2", [](const Ctx& x) { return llama_like(x, "qwen2"); }},
    {"qwen3", [](const Ctx& x) { return llama_like(x, "qwen3"); }},
    {"gemma2", [](const Ctx& x) { return llama_like(x, "gemma2"); }},
};

// ---- reading the weights --------------------------------------------------------------------

// The layer's weights read as T: whole tensors as they are; a fused one (GPT-2's c_attn, BLOOM's
// query_key_value) read once and sliced for q, k and v.
template <class T>
struct Reader {
  const Checkpoint& ck;
  std::map<std::string, std::vector<T>> fused;
  const std::vector<T>& fused_tensor(const std::string& name, const std::vector<std::int64_t>& shape) {
    auto it = fused.find(name);
    if (it == fused.end()) it = fused.emplace(name, ck.read<T>(name, shape)).first;
    return it->second;
  }

  // The weight `part` as a [rows, cols] nn.Linear matrix (cols 0: a bias of `rows`); `heads`
  // serves BLOOM's layout.
  std::vector<T> take(const Part& part, std::int64_t rows, std::int64_t cols, std::int64_t heads) {
    const bool bias = cols == 0;
    switch (part.take) {
      case Part::Take::whole:
        return bias ? ck.read<T>(part.tensor, {rows}) : ck.read<T>(part.tensor, {rows, cols});
      case Part::Take::conv1d: {
        const std::int64_t n = part.blocks * rows, c0 = part.index * rows;
        if (bias) {
          const std::vector<T>& b = fused_tensor(part.tensor, {n});
          return std::vector<T>(b.begin() + c0, b.begin() + c0 + rows);
        }
        const std::vector<T>& w = fused_tensor(part.tensor, {cols, n});
        std::vector<T> out(static_cast<std::size_t>(rows * cols));
        for (std::int64_t i = 0; i < cols; ++i)
          for (std::int64_t o = 0; o < rows; ++o)
            out[static_cast<std::size_t>(o * cols + i)] = w[static_cast<std::size_t>(i * n + c0 + o)];
        return out;
      }
      case Part::Take::fused_heads: {
        const std::int64_t hd = rows / heads, width = bias ? 1 : cols;
        const std::vector<T>& w =
            bias ? fused_tensor(part.tensor, {3 * rows}) : fused_tensor(part.tensor, {3 * rows, cols});
        std::vector<T> out(static_cast<std::size_t>(rows * width));
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t e = 0; e < hd; ++e) {
            const std::int64_t src = h * 3 * hd + part.index * hd + e, dst = h * hd + e;
            std::copy_n(w.begin() + src * width, width, out.begin() + dst * width);
          }
        return out;
      }
    }
    return {};
  }
};

DType dtype_of_entry(const std::string& file, const std::string& name, const SafetensorsEntry& e) {
  if (e.dtype == "F32") return DType::f32;
  if (e.dtype == "F64") return DType::f64;
  if (e.dtype == "BF16") return DType::bf16;
  if (e.dtype == "F16") return DType::f16;
  throw Error(file, "tensor '" + name + "' has dtype " + e.dtype + ", expected F32, F64, BF16 or F16");
}

template <class T>
MultiHeadAttention load_plan(const Checkpoint& ck, LayerPlan p) {
  MhaConfig& c = p.cfg;
  const std::int64_t hd = c.head_dim != 0 ? c.head_dim : c.d_model / c.heads;
  const std::int64_t kvh = c.kv_heads != 0 ? c.kv_heads : c.heads;
  const std::int64_t nq = c.heads * hd, nkv = kvh * hd;
  if (p.cross) {  // the key and value inputs' widths: the weights' (T5: d_model of the encoder)
    for (auto [part, dim] : {std::pair{&p.wk, &c.kdim}, std::pair{&p.wv, &c.vdim}}) {
      const std::vector<std::int64_t>& shape = ck.entry(part->tensor).shape;
      if (shape.size() != 2 || shape[0] != nkv)
        throw Error(ck.file(part->tensor), "tensor '" + part->tensor + "' has shape " + shape_str(shape) +
                                               ", expected [" + std::to_string(nkv) + ", kdim]");
      *dim = shape[1];
    }
  }
  const std::int64_t kd = c.kdim != 0 ? c.kdim : c.d_model, vd = c.vdim != 0 ? c.vdim : c.d_model;
  MhaWeights<T> w;
  {
    Reader<T> r{ck, {}};
    w.wq = r.take(p.wq, nq, c.d_model, c.heads);
    w.wk = r.take(p.wk, nkv, kd, kvh);
    w.wv = r.take(p.wv, nkv, vd, kvh);
    w.wo = r.take(p.wo, c.d_model, nq, c.heads);
    if (!p.bq.tensor.empty()) w.bq = r.take(p.bq, nq, 0, c.heads);
    if (!p.bk.tensor.empty()) w.bk = r.take(p.bk, nkv, 0, kvh);
    if (!p.bv.tensor.empty()) w.bv = r.take(p.bv, nkv, 0, kvh);
    if (!p.bo.tensor.empty()) w.bo = r.take(p.bo, c.d_model, 0, c.heads);
  }
  if (!p.q_norm.empty()) {
    c.q_norm = ck.read<float>(p.q_norm, {hd});
    c.k_norm = ck.read<float>(p.k_norm, {hd});
  }
  if (!p.t5_table.empty()) {
    const std::vector<std::int64_t>& shape = ck.entry(p.t5_table).shape;
    const std::int64_t min_buckets = c.t5_bidirectional ? 4 : 2;
    if (shape.size() != 2 || shape[1] != c.heads || shape[0] < min_buckets)
      throw Error(ck.file(p.t5_table), "tensor '" + p.t5_table + "' has shape " + shape_str(shape) +
                                           ", expected [num_buckets >= " + std::to_string(min_buckets) +
                                           ", heads=" + std::to_string(c.heads) + "]");
    const std::int64_t exact = shape[0] / (c.t5_bidirectional ? 4 : 2);  // (as attention() checks it)
    if (c.t5_max_distance <= exact)
      throw Error(p.t5_max_distance_key, "\"relative_attention_max_distance\" " + std::to_string(c.t5_max_distance) +
                                             " must exceed the exact buckets (" + std::to_string(exact) + ") of '" +
                                             p.t5_table + "'");
    c.t5_table = ck.read<float>(p.t5_table, shape);
  }
  return MultiHeadAttention(c, std::move(w));
}

// The dtype of the layer's weights as the checkpoint stores them (its query weight's).
DType stored_dtype(const Checkpoint& ck, const LayerPlan& p) {
  return dtype_of_entry(ck.file(p.wq.tensor), p.wq.tensor, ck.entry(p.wq.tensor));
}

MultiHeadAttention load(const Checkpoint& ck, LayerPlan p, const std::optional<DType>& dtype) {
  const DType dt = dtype ? *dtype : stored_dtype(ck, p);
  switch (dt) {
    case DType::f32: return load_plan<float>(ck, std::move(p));
    case DType::f64: return load_plan<double>(ck, std::move(p));
    case DType::bf16: return load_plan<bfloat16>(ck, std::move(p));
    case DType::f16: return load_plan<float16>(ck, std::move(p));
    default: throw Error("dtype", "expected f32, f64, bf16 or f16, got " + std::string(dtype_name(dt)));
  }
}

// Limits for config.json: far above any published one.
constexpr std::size_t kMaxConfig = 16u << 20;

// A model directory's layer: its checkpoint and its plan (nothing read but headers and config).
struct Planned {
  Checkpoint ck;
  LayerPlan plan;
};

Planned plan_pretrained(const std::string& dir, std::int64_t layer, const PretrainedOptions& options) {
  const std::string path = dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "config.json";
  Json j;
  try {
    j = detail::parse_json(detail::read_text_file(path, kMaxConfig));
  } catch (const detail::JsonError& e) {
    throw Error(path, std::string("is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(path, "is not a JSON object");
  const Json* model_type = j.find("model_type");
  if (model_type == nullptr || !model_type->is_string()) throw Error(path, "needs a string \"model_type\"");
  const std::string type = model_type->string();
  const Family* family = nullptr;
  for (const Family& f : kFamilies)
    if (type == f.model_type) family = &f;
  if (family == nullptr) {
    std::string known;
    for (const Family& f : kFamilies) known += std::string(known.empty() ? "" : ", ") + f.model_type;
    throw Error(path, "model_type '" + type.substr(0, 100) + "' is not supported (" + known + ")");
  }
  const Config config(path, std::move(j));
  Planned out{Checkpoint(dir), {}};
  out.plan = family->plan(Ctx{config, out.ck, dir, layer, options});
  return out;
}

Planned plan_diffusers(const std::string& path, const std::string& prefix, std::int64_t heads,
                       const PretrainedOptions& options) {
  if (heads < 1) throw Error("heads", "expected >= 1, got " + std::to_string(heads));
  if (options.attention != "self" && options.attention != "cross")
    throw Error("attention", "expected self (attn1) or cross (attn2), got '" + options.attention + "'");
  if (!options.stack.empty()) throw Error("stack", "a diffusers block has one stack, got '" + options.stack + "'");
  Planned out{Checkpoint::single(path), {}};
  const Checkpoint& ck = out.ck;
  LayerPlan& p = out.plan;
  const std::string s =
      prefix + (prefix.empty() || prefix.back() == '.' ? "" : ".") + (options.attention == "self" ? "attn1." : "attn2.");
  const SafetensorsEntry& q = ck.entry(s + "to_q.weight");
  if (q.shape.size() != 2 || q.shape[0] < heads || q.shape[0] % heads != 0)
    throw Error(path, "tensor '" + s + "to_q.weight' has shape " + shape_str(q.shape) + ", expected [heads*head_dim, " +
                          "query_dim] with heads = " + std::to_string(heads));
  p.cfg.d_model = q.shape[1];
  p.cfg.heads = heads;
  p.cfg.head_dim = q.shape[0] / heads;
  p.cross = true;  // (self-attention's k and v widths are d_model: the same read)
  p.wq = whole(s + "to_q.weight"), p.wk = whole(s + "to_k.weight"), p.wv = whole(s + "to_v.weight");
  p.wo = whole(s + "to_out.0.weight"), p.bo = whole(s + "to_out.0.bias");
  // blocks built with attention_bias carry input biases too
  if (ck.has(s + "to_q.bias")) p.bq = whole(s + "to_q.bias");
  if (ck.has(s + "to_k.bias")) p.bk = whole(s + "to_k.bias");
  if (ck.has(s + "to_v.bias")) p.bv = whole(s + "to_v.bias");
  return out;
}

}  // namespace

MultiHeadAttention MultiHeadAttention::from_pretrained(const std::string& dir, std::int64_t layer,
                                                       const PretrainedOptions& options) {
  Planned p = plan_pretrained(dir, layer, options);
  return load(p.ck, std::move(p.plan), options.dtype);
}

DType MultiHeadAttention::pretrained_dtype(const std::string& dir, std::int64_t layer, const PretrainedOptions& options) {
  const Planned p = plan_pretrained(dir, layer, options);
  return stored_dtype(p.ck, p.plan);
}

MultiHeadAttention MultiHeadAttention::from_diffusers(const std::string& path, const std::string& prefix,
                                                      std::int64_t heads, const PretrainedOptions& options) {
  Planned p = plan_diffusers(path, prefix, heads, options);
  return load(p.ck, std::move(p.plan), options.dtype);
}

DType MultiHeadAttention::diffusers_dtype(const std::string& path, const std::string& prefix, std::int64_t heads,
                                          const PretrainedOptions& options) {
  const Planned p = plan_diffusers(path, prefix, heads, options);
  return stored_dtype(p.ck, p.plan);
}

}  // namespace simdattn
