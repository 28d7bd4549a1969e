// MultiHeadAttention::from_pretrained and from_diffusers: one attention sub-layer of a published
// checkpoint. The family's entry (families.hpp) reads config.json into a LayerPlan; load_plan
// then reads the weights in the layer's dtype.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "io/file_io.hpp"
#include "io/json.hpp"
#include "loaders/checkpoint.hpp"
#include "loaders/config_json.hpp"
#include "loaders/families.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"

namespace simdattn {
namespace {

using namespace detail;

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
      case Part::Take::gated_heads: {
        const std::int64_t hd = rows / heads, width = bias ? 1 : cols;
        const std::vector<T>& w =
            bias ? fused_tensor(part.tensor, {2 * rows}) : fused_tensor(part.tensor, {2 * rows, cols});
        std::vector<T> out(static_cast<std::size_t>(rows * width));
        for (std::int64_t h = 0; h < heads; ++h)
          std::copy_n(w.begin() + (h * 2 * hd + part.index * hd) * width, hd * width, out.begin() + h * hd * width);
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
MultiHeadAttention read_mla(const Checkpoint& ck, const LayerPlan& p);

// An MLA layer's weights (DeepSeek), each read at its shape; a shape that disagrees when
// config.json lacks size keys says which defaults were taken.
template <class T>
MultiHeadAttention load_mla(const Checkpoint& ck, const LayerPlan& p) {
  try {
    return read_mla<T>(ck, p);
  } catch (const Error& e) {
    if (p.mla.defaulted.empty()) throw;
    const std::string what = e.what(), arg = e.argument();
    const std::string message = what.rfind(arg + ": ", 0) == 0 ? what.substr(arg.size() + 2) : what;
    throw Error(arg, message + " (config.json lacks " + p.mla.defaulted +
                         ": the configuration class's defaults were taken, 1536, 512, 128, 64, 128)");
  }
}

template <class T>
MultiHeadAttention read_mla(const Checkpoint& ck, const LayerPlan& p) {
  const MhaConfig& c = p.cfg;
  const MlaConfig& m = *c.mla;
  const std::int64_t H = c.heads, d = c.d_model, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const LayerPlan::Mla& t = p.mla;
  MlaWeights<T> w;
  if (m.q_lora_rank > 0) {
    w.wq_a = ck.read<T>(t.wq_a, {m.q_lora_rank, d});
    if (!t.bq_a.empty()) w.bq_a = ck.read<T>(t.bq_a, {m.q_lora_rank});
    w.q_a_norm = ck.read<float>(t.q_a_norm, {m.q_lora_rank});
    w.wq_b = ck.read<T>(t.wq_b, {H * qk, m.q_lora_rank});
  } else {
    w.wq = ck.read<T>(t.wq, {H * qk, d});
  }
  w.wkv_a = ck.read<T>(t.wkv_a, {m.kv_lora_rank + m.qk_rope_head_dim, d});
  if (!t.bkv_a.empty()) w.bkv_a = ck.read<T>(t.bkv_a, {m.kv_lora_rank + m.qk_rope_head_dim});
  w.kv_a_norm = ck.read<float>(t.kv_a_norm, {m.kv_lora_rank});
  w.wkv_b = ck.read<T>(t.wkv_b, {H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
  w.wo = ck.read<T>(t.wo, {d, H * m.v_head_dim});
  if (!t.bo.empty()) w.bo = ck.read<T>(t.bo, {d});
  return MultiHeadAttention(c, std::move(w));
}

template <class T>
MultiHeadAttention load_plan(const Checkpoint& ck, LayerPlan p) {
  if (p.cfg.mla) return load_mla<T>(ck, p);
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
    if (!p.wg.tensor.empty()) w.wg = r.take(p.wg, nq, c.d_model, c.heads);
    if (!p.bg.tensor.empty()) w.bg = r.take(p.bg, nq, 0, c.heads);
  }
  if (!p.q_norm.empty()) {
    c.q_norm = ck.read<float>(p.q_norm, {hd});
    c.k_norm = ck.read<float>(p.k_norm, {hd});
    if (p.norm_plus_one)  // (1 + weight), in f32 as Qwen3NextRMSNorm computes it
      for (auto* v : {&c.q_norm, &c.k_norm})
        for (float& x : *v) x = 1.0f + x;
  }
  if (!p.sinks.empty()) c.sinks = ck.read<float>(p.sinks, {c.heads});
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
  return visit_float_dtype(dt, "dtype", [&](auto t) { return load_plan<decltype(t)>(ck, std::move(p)); });
}

// Limits for config.json: far above any published one.
constexpr std::size_t kMaxConfig = 16u << 20;

// A model directory's layer: its checkpoint and its plan (nothing read but headers and config).
struct Planned {
  Checkpoint ck;
  LayerPlan plan;
};

Planned plan_pretrained(const std::string& dir, std::int64_t layer, const PretrainedOptions& options) {
  const ConfigJson config = read_model_config(dir);
  const std::string type = config.at("model_type").string();
  const Family* family = nullptr;
  for (const Family& f : families())
    if (type == f.model_type) family = &f;
  if (family == nullptr) {
    std::string known;
    for (const Family& f : families()) known += std::string(known.empty() ? "" : ", ") + f.model_type;
    throw Error(config.path(), "model_type '" + type.substr(0, 100) + "' is not supported (" + known + ")");
  }
  Planned out{Checkpoint(dir), {}};
  out.plan = family->plan(FamilyContext{config, out.ck, dir, layer, options});
  return out;
}

// Where a diffusers sub-layer's tensors are: the block's prefix ("" or ending in '.') and
// whether it is attn2. The prefix may name the sub-layer itself ("...transformer_blocks.0.attn2",
// with or without a final '.'); `attention` then must be empty or agree with it.
struct DiffusersBlock {
  std::string base;
  bool cross = false;
};
DiffusersBlock diffusers_block(const std::string& prefix, const std::string& attention) {
  if (!attention.empty() && attention != "self" && attention != "cross")
    throw Error("attention", "expected self (attn1) or cross (attn2), got '" + attention + "'");
  std::string base = prefix;
  if (!base.empty() && base.back() == '.') base.pop_back();
  const std::size_t dot = base.rfind('.');
  const std::string last = dot == std::string::npos ? base : base.substr(dot + 1);
  if (last != "attn1" && last != "attn2") return {base.empty() ? base : base + ".", attention == "cross"};
  const bool cross = last == "attn2";
  if (!attention.empty() && (attention == "cross") != cross)
    throw Error("attention", "'" + attention + "' contradicts the prefix '" + prefix + "', which names " + last + " (" +
                                 (cross ? "cross" : "self") + "-attention)");
  return {dot == std::string::npos ? std::string() : base.substr(0, dot + 1), cross};
}

Planned plan_diffusers(const std::string& path, const std::string& prefix, std::int64_t heads,
                       const PretrainedOptions& options) {
  if (heads < 1) throw Error("heads", "expected >= 1, got " + std::to_string(heads));
  if (!options.stack.empty()) throw Error("stack", "a diffusers block has one stack, got '" + options.stack + "'");
  const DiffusersBlock block = diffusers_block(prefix, options.attention);
  Planned out{Checkpoint::single(path), {}};
  const Checkpoint& ck = out.ck;
  LayerPlan& p = out.plan;
  const std::string s = block.base + (block.cross ? "attn2." : "attn1.");
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

namespace detail {

ConfigJson read_model_config(const std::string& dir) {
  const std::string path = dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "config.json";
  JsonValue j;
  try {
    j = parse_json(read_text_file(path, kMaxConfig));
  } catch (const JsonError& e) {
    throw Error(path, std::string("is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(path, "is not a JSON object");
  const JsonValue* model_type = j.find("model_type");
  if (model_type == nullptr || !model_type->is_string()) throw Error(path, "needs a string \"model_type\"");
  return ConfigJson(path, std::move(j));
}

}  // namespace detail

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
