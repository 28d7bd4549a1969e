// MultiHeadAttention::from_gguf: one attention sub-layer of a llama.cpp GGUF file (io/gguf.hpp),
// built to equal the layer from_pretrained loads from the Hugging Face directory the file was
// converted from (docs/models.md, "GGUF").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "io/gguf.hpp"
#include "loaders/families.hpp"
#include "simdattn/error.hpp"
#include "simdattn/half.hpp"
#include "simdattn/mha.hpp"

namespace simdattn {
namespace {

using namespace detail;

// The architectures read, and how llama.cpp lays out their q and k. Its converter
// (convert_hf_to_gguf.py, LlamaModel.permute) reorders llama's q and k rows within each head
// from Hugging Face's halves (x[i], x[i + hd/2]) to adjacent pairs (x[2i], x[2i + 1]), which
// llama.cpp's "normal" RoPE rotates; Mistral is converted as llama. Qwen2 and Qwen3 run its
// NEOX RoPE (halves) on the rows as Hugging Face has them.
struct Arch {
  const char* name;
  bool permuted;
};
constexpr Arch kArchs[] = {{"llama", true}, {"qwen2", false}, {"qwen3", false}};

// Sizes and counts: bounded far above any model's, as ConfigJson::kMax.
constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;

// The metadata as the layer reads it, each key named in its errors.
struct Meta {
  const GgufFile& f;
  std::string arch;
  std::int64_t layer;

  std::string key(const std::string& k) const { return arch + "." + k; }
  const GgufValue* find(const std::string& k) const { return f.find(key(k)); }
  [[noreturn]] void fail(const std::string& k, const std::string& what) const {
    throw Error(f.path(), "metadata '" + key(k) + "' " + what);
  }
  // An integer in [lo, hi]: a scalar, or an array with one per layer (llama.cpp's per-layer
  // head counts).
  std::optional<std::int64_t> integer(const std::string& k, std::int64_t lo, std::int64_t hi) const {
    const GgufValue* v = find(k);
    if (v == nullptr) return std::nullopt;
    if (v->ints.empty() || v->type == GgufValueType::boolean || (v->is_array && !v->kept))
      fail(k, std::string("must be an integer (or one per layer), got ") + (v->is_array ? "an array of " : "") +
                  gguf_value_type_name(v->type));
    if (v->is_array && static_cast<std::int64_t>(v->ints.size()) <= layer)
      fail(k, "lists " + std::to_string(v->ints.size()) + " layers, not layer " + std::to_string(layer));
    const std::int64_t x = v->ints[v->is_array ? static_cast<std::size_t>(layer) : 0];
    if (x < lo || x > hi)
      fail(k, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
    return x;
  }
  std::int64_t required(const std::string& k, std::int64_t lo = 1, std::int64_t hi = kMaxSize) const {
    const std::optional<std::int64_t> x = integer(k, lo, hi);
    if (!x) throw Error(f.path(), "needs metadata '" + key(k) + "'");
    return *x;
  }
  double number(const std::string& k, double fallback) const {
    const GgufValue* v = find(k);
    if (v == nullptr) return fallback;
    if (v->is_array || (v->floats.empty() && v->ints.empty()) || v->type == GgufValueType::boolean)
      fail(k, std::string("must be a number, got ") + (v->is_array ? "an array of " : "") + gguf_value_type_name(v->type));
    const double x = v->floats.empty() ? static_cast<double>(v->ints[0]) : v->floats[0];
    if (!std::isfinite(x)) fail(k, "must be finite");
    return x;
  }
};

// Where the layer's weights are and how they are laid out.
struct GgufPlan {
  MhaConfig cfg;
  bool permuted = false;
  std::string q, k, v, o, bq, bk, bv, bo, q_norm, k_norm;  // tensor names; empty: absent
  const GgufTensor* rope_freqs = nullptr;
};

RopeConfig rope_of(const Meta& m, std::int64_t head_dim, bool permuted) {
  RopeConfig r;
  r.theta = m.number("rope.freq_base", 10000.0);
  if (!(r.theta > 0.0)) m.fail("rope.freq_base", "must be > 0, got " + std::to_string(r.theta));
  r.rotary_dim = m.integer("rope.dimension_count", 2, head_dim).value_or(head_dim);
  if (r.rotary_dim % 2 != 0) m.fail("rope.dimension_count", "must be even, got " + std::to_string(r.rotary_dim));
  // llama's permutation pairs rows across the whole head: a partial rotation is not a rotate_half
  if (permuted && r.rotary_dim != head_dim)
    m.fail("rope.dimension_count", std::to_string(r.rotary_dim) + " != head_dim " + std::to_string(head_dim) +
                                      ": a partial rotation of llama's permuted q and k is not supported");
  std::string type = "none";
  if (const GgufValue* t = m.find("rope.scaling.type")) {
    if (t->type != GgufValueType::string || t->is_array) m.fail("rope.scaling.type", "must be a string");
    type = t->text;
  }
  const double legacy = m.number("rope.scale_linear", 1.0);  // older files' linear factor
  if (type == "linear" || (type == "none" && legacy != 1.0)) {
    r.scaling = RopeScaling::linear;
    r.factor = type == "linear" ? m.number("rope.scaling.factor", 0.0) : legacy;
    if (!(r.factor > 0.0)) m.fail(type == "linear" ? "rope.scaling.factor" : "rope.scale_linear", "must be > 0");
  } else if (type != "none") {
    m.fail("rope.scaling.type", "'" + type.substr(0, 100) + "' is not supported (none or linear; llama3 as rope_freqs.weight)");
  }
  if (const GgufTensor* t = m.f.tensor("rope_freqs.weight")) {  // Llama 3.1's scaling, per frequency
    if (r.scaling != RopeScaling::none) throw Error(m.f.path(), "has both rope_freqs.weight and a linear rope scaling");
    if (t->dims != std::vector<std::int64_t>{r.rotary_dim / 2})
      throw Error(m.f.path(), "tensor 'rope_freqs.weight' has dims " + shape_str(t->dims) + ", expected [" +
                                  std::to_string(r.rotary_dim / 2) + "] (rotary dimensions / 2)");
    r.scaling = RopeScaling::factors;
    r.frequency_factors = m.f.read<double>(*t);
    for (double x : r.frequency_factors)
      if (!(std::isfinite(x) && x > 0.0))
        throw Error(m.f.path(), "tensor 'rope_freqs.weight' holds " + std::to_string(x) + " (factors must be finite and > 0)");
  }
  return r;
}

// The sliding window: attention.sliding_window W on every layer, or on the layers
// attention.sliding_window_pattern marks true (one bool per layer).
std::optional<Window> window_of(const Meta& m) {
  const std::optional<std::int64_t> w = m.integer("attention.sliding_window", 0, std::int64_t{1} << 40);
  if (!w || *w == 0) return std::nullopt;
  if (const GgufValue* p = m.find("attention.sliding_window_pattern")) {
    if (!p->is_array || p->type != GgufValueType::boolean || !p->kept)
      m.fail("attention.sliding_window_pattern", "must be an array of bool (one per layer)");
    if (static_cast<std::int64_t>(p->ints.size()) <= m.layer)
      m.fail("attention.sliding_window_pattern", "lists " + std::to_string(p->ints.size()) + " layers, not layer " +
                                                    std::to_string(m.layer));
    if (p->ints[static_cast<std::size_t>(m.layer)] == 0) return std::nullopt;
  }
  return sliding_window(*w);
}

GgufPlan plan_gguf(const GgufFile& f, std::int64_t layer) {
  const GgufValue* a = f.find("general.architecture");
  if (a == nullptr || a->type != GgufValueType::string || a->is_array)
    throw Error(f.path(), "needs a string metadata 'general.architecture'");
  const Arch* arch = nullptr;
  for (const Arch& x : kArchs)
    if (a->text == x.name) arch = &x;
  if (arch == nullptr)
    throw Error(f.path(), "architecture '" + a->text.substr(0, 100) + "' is not supported (llama, qwen2, qwen3)");
  const Meta m{f, a->text, layer};
  const std::int64_t blocks = m.required("block_count");
  if (layer < 0 || layer >= blocks)
    throw Error("layer", "expected 0 <= layer < " + m.key("block_count") + " = " + std::to_string(blocks) + " (" +
                             f.path() + "), got " + std::to_string(layer));
  GgufPlan p;
  p.permuted = arch->permuted;
  MhaConfig& c = p.cfg;
  c.d_model = m.required("embedding_length");
  c.heads = m.required("attention.head_count");
  c.kv_heads = m.integer("attention.head_count_kv", 1, kMaxSize).value_or(c.heads);
  if (c.heads % c.kv_heads != 0)
    m.fail("attention.head_count_kv", std::to_string(c.kv_heads) + " does not divide head_count " + std::to_string(c.heads));
  const std::optional<std::int64_t> key_length = m.integer("attention.key_length", 1, kMaxSize);
  if (!key_length && c.d_model % c.heads != 0)
    m.fail("embedding_length", std::to_string(c.d_model) + " is not a multiple of head_count " + std::to_string(c.heads));
  c.head_dim = key_length.value_or(c.d_model / c.heads);
  if (const std::optional<std::int64_t> vl = m.integer("attention.value_length", 1, kMaxSize); vl && *vl != c.head_dim)
    m.fail("attention.value_length", std::to_string(*vl) + " != key_length " + std::to_string(c.head_dim) +
                                         " (one head_dim for q, k and v)");
  if (p.permuted && c.head_dim % 2 != 0)
    m.fail("attention.key_length", "head_dim " + std::to_string(c.head_dim) + " is odd (llama's rows come in pairs)");
  c.causal = true;
  c.rope = rope_of(m, c.head_dim, p.permuted);
  c.window = window_of(m);
  const std::string b = "blk." + std::to_string(layer) + ".";
  p.q = b + "attn_q.weight", p.k = b + "attn_k.weight", p.v = b + "attn_v.weight", p.o = b + "attn_output.weight";
  auto optional = [&](const std::string& name) { return f.tensor(name) != nullptr ? name : std::string(); };
  p.bq = optional(b + "attn_q.bias"), p.bk = optional(b + "attn_k.bias"), p.bv = optional(b + "attn_v.bias");
  p.bo = optional(b + "attn_output.bias");
  p.q_norm = optional(b + "attn_q_norm.weight"), p.k_norm = optional(b + "attn_k_norm.weight");
  if (p.q_norm.empty() != p.k_norm.empty())
    throw Error(f.path(), "has '" + (p.q_norm.empty() ? p.k_norm : p.q_norm) + "' without its q/k counterpart");
  if (!p.q_norm.empty()) {
    if (p.permuted) throw Error(f.path(), "tensor '" + p.q_norm + "': QK-norm in llama's permuted layout is not supported");
    c.qk_norm_eps = m.number("attention.layer_norm_rms_epsilon", 1e-6);
    if (!(c.qk_norm_eps >= 0.0)) m.fail("attention.layer_norm_rms_epsilon", "must be >= 0");
  }
  return p;
}

// The layer's dtype as the file stores it: the query weight's (Q8_0 dequantizes to f32).
DType stored_dtype(const GgufFile& f, const GgufPlan& p) {
  const GgufTensor* q = f.tensor(p.q);
  if (q == nullptr) throw Error(f.path(), "no tensor '" + p.q + "'");
  switch (q->type.id) {
    case kGgmlF32: case kGgmlQ8_0: return DType::f32;
    case kGgmlF16: return DType::f16;
    case kGgmlBF16: return DType::bf16;
    default:
      throw Error(f.path(), "tensor '" + p.q + "' has type " + q->type.name + "; F32, F16, BF16 and Q8_0 can be read");
  }
}

// Tensor `name` checked to have ggml dims `dims`, read as T; with `heads`, llama's q / k row
// permutation undone (rows of `width` elements; heads of hd rows: row h*hd + 2i + j of the
// file is row h*hd + j*hd/2 + i of Hugging Face's).
template <class T>
std::vector<T> take(const GgufFile& f, const std::string& name, const std::vector<std::int64_t>& dims,
                    std::int64_t heads = 0) {
  const GgufTensor* t = f.tensor(name);
  if (t == nullptr) throw Error(f.path(), "no tensor '" + name + "'");
  if (t->dims != dims)
    throw Error(f.path(), "tensor '" + name + "' has dims " + shape_str(t->dims) + " (ggml order, innermost first), expected " +
                              shape_str(dims));
  std::vector<T> x = f.read<T>(*t);
  if (heads == 0) return x;
  const std::int64_t width = dims.size() == 2 ? dims[0] : 1, rows = dims.back(), hd = rows / heads, half = hd / 2;
  std::vector<T> out(x.size());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < half; ++i)
      for (std::int64_t j = 0; j < 2; ++j) {
        const std::int64_t src = h * hd + 2 * i + j, dst = h * hd + j * half + i;
        std::copy_n(x.begin() + src * width, width, out.begin() + dst * width);
      }
  return out;
}

template <class T>
MultiHeadAttention load(const GgufFile& f, GgufPlan p) {
  MhaConfig& c = p.cfg;
  const std::int64_t d = c.d_model, nq = c.heads * c.head_dim, nkv = c.kv_heads * c.head_dim;
  const std::int64_t qh = p.permuted ? c.heads : 0, kh = p.permuted ? c.kv_heads : 0;
  MhaWeights<T> w;
  w.wq = take<T>(f, p.q, {d, nq}, qh);
  w.wk = take<T>(f, p.k, {d, nkv}, kh);
  w.wv = take<T>(f, p.v, {d, nkv});
  w.wo = take<T>(f, p.o, {nq, d});
  if (!p.bq.empty()) w.bq = take<T>(f, p.bq, {nq}, qh);
  if (!p.bk.empty()) w.bk = take<T>(f, p.bk, {nkv}, kh);
  if (!p.bv.empty()) w.bv = take<T>(f, p.bv, {nkv});
  if (!p.bo.empty()) w.bo = take<T>(f, p.bo, {d});
  if (!p.q_norm.empty()) {
    c.q_norm = take<float>(f, p.q_norm, {c.head_dim});
    c.k_norm = take<float>(f, p.k_norm, {c.head_dim});
  }
  return MultiHeadAttention(c, std::move(w));
}

}  // namespace

MultiHeadAttention MultiHeadAttention::from_gguf(const std::string& path, std::int64_t layer,
                                                 std::optional<DType> dtype) {
  const GgufFile f(path);
  GgufPlan p = plan_gguf(f, layer);
  const DType dt = dtype ? *dtype : stored_dtype(f, p);
  return visit_float_dtype(dt, "dtype", [&](auto t) { return load<decltype(t)>(f, std::move(p)); });
}

DType MultiHeadAttention::gguf_dtype(const std::string& path, std::int64_t layer) {
  const GgufFile f(path);
  return stored_dtype(f, plan_gguf(f, layer));
}

}  // namespace simdattn
