// MultiHeadAttention::from_safetensors: one layer's weights read from a safetensors file, in
// Hugging Face's names (q_proj.weight ..) or torch.nn.MultiheadAttention's (in_proj_weight ..).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "simdattn/error.hpp"
#include "simdattn/half.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/safetensors.hpp"

namespace simdattn {

namespace {

// One layer's tensors in a file, under a prefix.
template <class T>
struct LayerTensors {
  const SafetensorsFile& f;
  const std::string& prefix;
  // The shape of a tensor that must exist (2-D unless a bias).
  const std::vector<std::int64_t>& shape_of(const std::string& name) const {
    const auto it = f.tensors().find(prefix + name);
    if (it == f.tensors().end()) throw Error(f.path(), "no tensor named '" + prefix + name + "'");
    if (it->second.shape.size() != 2 && name.find("bias") == std::string::npos)
      throw Error(f.path(), "tensor '" + prefix + name + "' must be 2-D [out, in], has " +
                                std::to_string(it->second.shape.size()) + " dimensions");
    return it->second.shape;
  }
  bool has(const std::string& name) const { return f.tensors().count(prefix + name) != 0; }
  std::vector<T> read(const std::string& name, std::vector<std::int64_t> shape) const {
    return f.read<T>(prefix + name, shape);
  }
};

// Hugging Face names: q_proj/k_proj/v_proj/o_proj .weight, each with an optional .bias.
template <class T>
void load_hf(const LayerTensors<T>& t, std::int64_t kv_heads, MhaConfig& cfg, MhaWeights<T>& w) {
  const auto qs = t.shape_of("q_proj.weight");
  const auto ks = t.shape_of("k_proj.weight");
  const auto vs = t.shape_of("v_proj.weight");
  t.shape_of("o_proj.weight");  // present and 2-D, before anything is read
  const std::int64_t heads = cfg.heads;
  cfg.d_model = qs[1];
  if (qs[0] < heads || qs[0] % heads != 0)
    throw Error(t.f.path(), "q_proj.weight has " + std::to_string(qs[0]) + " rows, not a positive multiple of heads " +
                                std::to_string(heads));
  cfg.head_dim = qs[0] / heads;
  if (kv_heads == 0) {
    if (ks[0] % cfg.head_dim != 0)
      throw Error(t.f.path(), "k_proj.weight has " + std::to_string(ks[0]) + " rows, not a multiple of head_dim " +
                                  std::to_string(cfg.head_dim));
    kv_heads = ks[0] / cfg.head_dim;
  }
  cfg.kv_heads = kv_heads;
  cfg.kdim = ks[1];
  cfg.vdim = vs[1];
  const std::int64_t nq = heads * cfg.head_dim, nkv = kv_heads * cfg.head_dim;
  w.wq = t.read("q_proj.weight", {nq, cfg.d_model});
  w.wk = t.read("k_proj.weight", {nkv, cfg.kdim});
  w.wv = t.read("v_proj.weight", {nkv, cfg.vdim});
  w.wo = t.read("o_proj.weight", {cfg.d_model, nq});
  if (t.has("q_proj.bias")) w.bq = t.read("q_proj.bias", {nq});
  if (t.has("k_proj.bias")) w.bk = t.read("k_proj.bias", {nkv});
  if (t.has("v_proj.bias")) w.bv = t.read("v_proj.bias", {nkv});
  if (t.has("o_proj.bias")) w.bo = t.read("o_proj.bias", {cfg.d_model});
}

// torch.nn.MultiheadAttention's state_dict: in_proj_weight (or q/k/v_proj_weight), in_proj_bias,
// out_proj.weight, out_proj.bias.
template <class T>
void load_torch(const LayerTensors<T>& t, std::int64_t kv_heads, MhaConfig& cfg, MhaWeights<T>& w) {
  if (kv_heads != 0 && kv_heads != cfg.heads)
    throw Error("kv_heads", "torch.nn.MultiheadAttention weights have kv_heads == heads; got " +
                                std::to_string(kv_heads));
  cfg.kv_heads = cfg.heads;
  const std::int64_t d = t.shape_of("out_proj.weight")[0];
  cfg.d_model = d;
  if (t.has("in_proj_weight")) {
    const auto in_proj = t.read("in_proj_weight", {3 * d, d});
    w.wq.assign(in_proj.begin(), in_proj.begin() + d * d);
    w.wk.assign(in_proj.begin() + d * d, in_proj.begin() + 2 * d * d);
    w.wv.assign(in_proj.begin() + 2 * d * d, in_proj.end());
  } else {
    cfg.kdim = t.shape_of("k_proj_weight")[1];
    cfg.vdim = t.shape_of("v_proj_weight")[1];
    w.wq = t.read("q_proj_weight", {d, d});
    w.wk = t.read("k_proj_weight", {d, cfg.kdim});
    w.wv = t.read("v_proj_weight", {d, cfg.vdim});
  }
  w.wo = t.read("out_proj.weight", {d, d});
  if (t.has("in_proj_bias")) {
    const auto b = t.read("in_proj_bias", {3 * d});
    w.bq.assign(b.begin(), b.begin() + d);
    w.bk.assign(b.begin() + d, b.begin() + 2 * d);
    w.bv.assign(b.begin() + 2 * d, b.end());
  }
  if (t.has("out_proj.bias")) w.bo = t.read("out_proj.bias", {d});
}

template <class T>
MultiHeadAttention load_layer(const SafetensorsFile& f, std::int64_t heads, std::int64_t kv_heads,
                              const std::string& prefix, const MhaConfig& options) {
  if (heads < 1) throw Error("heads", "expected >= 1, got " + std::to_string(heads));
  const LayerTensors<T> t{f, prefix};
  MhaConfig cfg = options;  // the position and score options; the shapes come from the file
  cfg.d_model = cfg.kv_heads = cfg.head_dim = cfg.kdim = cfg.vdim = 0;
  cfg.heads = heads;
  MhaWeights<T> w;
  if (t.has("q_proj.weight")) load_hf(t, kv_heads, cfg, w);
  else if (t.has("in_proj_weight") || t.has("q_proj_weight")) load_torch(t, kv_heads, cfg, w);
  else
    throw Error(f.path(), "no attention weights under prefix '" + prefix +
                              "' (expected in_proj_weight, q_proj_weight or q_proj.weight)");
  return MultiHeadAttention(cfg, std::move(w));
}

}  // namespace

MultiHeadAttention MultiHeadAttention::from_safetensors(const std::string& path, std::int64_t heads,
                                                        std::int64_t kv_heads, const std::string& prefix,
                                                        DType dtype) {
  return from_safetensors(path, heads, kv_heads, prefix, dtype, MhaConfig{});
}

MultiHeadAttention MultiHeadAttention::from_safetensors(const std::string& path, std::int64_t heads,
                                                        std::int64_t kv_heads, const std::string& prefix, DType dtype,
                                                        const MhaConfig& options) {
  const SafetensorsFile f(path);
  if (dtype == DType::f32) return load_layer<float>(f, heads, kv_heads, prefix, options);
  if (dtype == DType::f64) return load_layer<double>(f, heads, kv_heads, prefix, options);
  if (dtype == DType::bf16) return load_layer<bfloat16>(f, heads, kv_heads, prefix, options);
  if (dtype == DType::f16) return load_layer<float16>(f, heads, kv_heads, prefix, options);
  throw Error("dtype", "expected f32, f64, bf16 or f16, got " + std::string(dtype_name(dtype)));
}

}  // namespace simdattn
