// The Python module's MultiHeadAttention and KvCache classes (module.cpp binds them).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convert.hpp"
#include "module.hpp"
#include "simdattn/simdattn.hpp"

namespace simdattn::python {
namespace {

// A layer of dtype t from float arrays (NumPy or DLPack) in torch's layout.
template <class T>
MultiHeadAttention make_layer(const MhaConfig& c, const py::dict& w) {
  const auto get = [&](const char* key, bool required) -> std::vector<T> {
    const std::string name = std::string(key);
    if (!w.contains(key) || w[key].is_none()) {
      if (required) throw Error(name, "expected an array");
      return {};
    }
    const Converted x = converted(array_of(w[key], name), dtype_of<T>(), name);
    const auto* p = static_cast<const T*>(x.array.data);
    return std::vector<T>(p, p + x.array.size());
  };
  MhaWeights<T> m{get("wq", true), get("wk", true), get("wv", true), get("wo", true),
                  get("bq", false), get("bk", false), get("bv", false), get("bo", false)};
  return MultiHeadAttention(c, std::move(m));
}

std::int64_t dim_of(const Array& a, int axis, const char* name) {
  if (a.ndim() != 2) throw Error(name, "expected a 2-D weight [out_features, in_features], got " +
                                           std::to_string(a.ndim()) + "-D");
  return a.shape[static_cast<std::size_t>(axis)];
}

std::optional<RopeConfig> rope_of(const py::object& r) {
  if (r.is_none()) return std::nullopt;
  if (!py::isinstance<py::dict>(r)) throw Error("rope", "expected a dict (theta, rotary_dim, style, scaling, ...)");
  RopeConfig c;
  for (const auto& [key, value] : r.cast<py::dict>()) {
    const std::string k = key.cast<std::string>();
    if (k == "theta") c.theta = value.cast<double>();
    else if (k == "rotary_dim") c.rotary_dim = value.cast<std::int64_t>();
    else if (k == "style") {
      const std::string s = value.cast<std::string>();
      if (s == "half") c.style = RopeStyle::half;
      else if (s == "interleaved") c.style = RopeStyle::interleaved;
      else throw Error("rope.style", "expected 'half' or 'interleaved', got '" + s + "'");
    } else if (k == "scaling") {
      const std::string s = value.cast<std::string>();
      if (s == "none") c.scaling = RopeScaling::none;
      else if (s == "linear") c.scaling = RopeScaling::linear;
      else if (s == "llama3") c.scaling = RopeScaling::llama3;
      else if (s == "yarn") c.scaling = RopeScaling::yarn;
      else throw Error("rope.scaling", "expected 'none', 'linear', 'llama3' or 'yarn', got '" + s + "'");
    } else if (k == "factor") c.factor = value.cast<double>();
    else if (k == "beta_fast") c.beta_fast = value.cast<double>();
    else if (k == "beta_slow") c.beta_slow = value.cast<double>();
    else if (k == "attention_factor") c.attention_factor = value.cast<double>();
    else if (k == "truncate") c.truncate = value.cast<bool>();
    else if (k == "low_freq_factor") c.low_freq_factor = value.cast<double>();
    else if (k == "high_freq_factor") c.high_freq_factor = value.cast<double>();
    else if (k == "original_max_positions") c.original_max_positions = value.cast<std::int64_t>();
    else throw Error("rope", "unknown key '" + k + "'");
  }
  return c;
}

MultiHeadAttention layer_from_arrays(const py::object& wq_in, const py::object& wk_in, const py::object& wv_in,
                                     const py::object& wo, std::int64_t heads, const py::object& bq,
                                     const py::object& bk, const py::object& bv, const py::object& bo,
                                     std::int64_t kv_heads, std::int64_t head_dim, const py::object& rope,
                                     const py::object& q_norm, const py::object& k_norm, double qk_norm_eps,
                                     const py::object& scale, const py::object& softcap, const py::object& window,
                                     const py::object& alibi_slopes, const py::object& sinks,
                                     const py::object& t5_table, bool t5_bidirectional, std::int64_t t5_max_distance,
                                     bool causal, const py::object& dtype) {
  const Array wq = array_of(wq_in, "wq"), wk = array_of(wk_in, "wk"), wv = array_of(wv_in, "wv");
  MhaConfig c;
  c.d_model = dim_of(wq, 1, "wq");
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.kdim = dim_of(wk, 1, "wk");
  c.vdim = dim_of(wv, 1, "wv");
  if (c.head_dim == 0 && heads > 0) c.head_dim = dim_of(wq, 0, "wq") / heads;
  c.rope = rope_of(rope);
  c.q_norm = vector_of<float>(q_norm, "q_norm");
  c.k_norm = vector_of<float>(k_norm, "k_norm");
  c.qk_norm_eps = qk_norm_eps;
  if (!scale.is_none()) c.scale = scale.cast<double>();
  if (!softcap.is_none()) c.softcap = softcap.cast<double>();
  c.window = window_of(window);
  c.alibi_slopes = vector_of<float>(alibi_slopes, "alibi_slopes");
  c.sinks = vector_of<float>(sinks, "sinks");
  if (!t5_table.is_none()) {
    const py::array_t<float, py::array::c_style | py::array::forcecast> t(t5_table);
    c.t5_table.assign(t.data(), t.data() + t.size());
  }
  c.t5_bidirectional = t5_bidirectional;
  c.t5_max_distance = t5_max_distance;
  c.causal = causal;
  py::dict w;
  w["wq"] = wq_in, w["wk"] = wk_in, w["wv"] = wv_in, w["wo"] = wo, w["bq"] = bq, w["bk"] = bk, w["bv"] = bv, w["bo"] = bo;
  const DType t = optional_dtype(dtype, "dtype").value_or(wq.dtype);
  switch (t) {
    case DType::f32: return make_layer<float>(c, w);
    case DType::f64: return make_layer<double>(c, w);
    case DType::bf16: return make_layer<bfloat16>(c, w);
    case DType::f16: return make_layer<float16>(c, w);
    default: throw Error("dtype", "expected f32, f64, bf16 or f16");
  }
}

py::object forward_py(const MultiHeadAttention& layer, const py::object& query_in, const py::object& key,
                      const py::object& value, KvCache* cache, const py::object& causal,
                      const py::object& key_padding_mask, const py::object& attn_mask, const py::object& positions,
                      bool need_weights, bool average_attn_weights, int threads, const std::string& backend,
                      const py::object& out) {
  const DType t = layer.dtype();
  const MhaConfig& c = layer.config();
  MhaOptions o;
  o.causal = causal_of(causal);
  std::vector<std::uint8_t> kpm;
  if (!key_padding_mask.is_none()) {
    kpm = vector_of<std::uint8_t>(py::array(key_padding_mask).attr("reshape")(-1), "key_padding_mask");
    o.key_padding_mask = kpm;
  }
  Array mask;
  if (!attn_mask.is_none()) mask = array_of(attn_mask, "attn_mask"), o.attn_mask = const_view(mask, "attn_mask", 2);
  std::vector<std::int64_t> pos;
  if (!positions.is_none()) {
    pos = vector_of<std::int64_t>(py::array(positions).attr("reshape")(-1), "positions");
    o.positions = pos;
  }
  o.threads = threads;
  o.backend = backend_of(backend);
  if (key.is_none() != value.is_none()) throw Error(key.is_none() ? "key" : "value", "key and value go together");
  if (cache != nullptr && !key.is_none()) throw Error("cache", "a KV cache is for self-attention (no key/value)");

  const Array query = array_of(query_in, "query");
  const SeqInput q = seq_input(query, t, "query");
  SeqInput k, v;
  if (!key.is_none()) k = seq_input(array_of(key, "key"), t, "key"), v = seq_input(array_of(value, "value"), t, "value");
  const std::int64_t B = q.view.B, Sq = q.view.S;
  const std::int64_t Sk = cache != nullptr ? cache->capacity() : (key.is_none() ? Sq : k.view.S);
  const Output result = output_of(out, query, layer_output_dtype(t, query), t, {B, Sq, c.d_model}, true);
  SeqView ov;
  ov.data = result.view.data, ov.dtype = t, ov.B = B, ov.S = Sq, ov.E = c.d_model;
  py::object weights = py::none();
  Array wa;
  if (need_weights) {
    const DType wt = t == DType::f64 ? DType::f64 : DType::f32;
    weights = new_array(query, wt, {B, average_attn_weights ? 1 : c.heads, Sq, Sk});
    wa = array_of(weights, "attn_weights");
    o.attn_weights = mutable_view(wa, "attn_weights");
  }
  {
    py::gil_scoped_release release;
    if (cache != nullptr) layer.forward(q.view, *cache, ov, o);
    else if (key.is_none()) layer.forward(q.view, ov, o);
    else layer.forward(q.view, k.view, v.view, ov, o);
    result.finish();
  }
  if (need_weights) return py::make_tuple(result.object, average_attn_weights ? weights.attr("reshape")(B, Sq, Sk) : weights);
  return result.object;
}

PretrainedOptions pretrained_options(const std::string& stack, const std::string& attention_kind,
                                     const py::object& dtype) {
  PretrainedOptions p;
  p.stack = stack;
  p.attention = attention_kind;
  p.dtype = optional_dtype(dtype, "dtype");
  return p;
}

}  // namespace

void bind_layer(py::module_& m) {
  py::class_<MultiHeadAttention>(m, "MultiHeadAttention", R"doc(A multi-head attention layer (torch.nn.MultiheadAttention, batch_first).

  q = x_q Wq^T + bq, k = x_k Wk^T + bk, v = x_v Wv^T + bv; heads attend; y = o Wo^T + bo
Weights in torch's layout: W [out_features, in_features]. Immutable; forward() may run
from many threads at once.)doc")
      .def(py::init(&layer_from_arrays), py::arg("wq"), py::arg("wk"), py::arg("wv"), py::arg("wo"), py::kw_only(),
           py::arg("heads"), py::arg("bq") = py::none(), py::arg("bk") = py::none(), py::arg("bv") = py::none(),
           py::arg("bo") = py::none(), py::arg("kv_heads") = 0, py::arg("head_dim") = 0,
           py::arg("rope") = py::none(), py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none(),
           py::arg("qk_norm_eps") = 1e-6, py::arg("scale") = py::none(), py::arg("softcap") = py::none(),
           py::arg("window") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
           py::arg("t5_table") = py::none(), py::arg("t5_bidirectional") = true, py::arg("t5_max_distance") = 128,
           py::arg("causal") = false, py::arg("dtype") = py::none(),
           R"doc(A layer from weight arrays (copied).

wq [H*hd, d_model], wk [Hkv*hd, kdim], wv [Hkv*hd, vdim], wo [d_model, H*hd]; biases
optional. heads: H; kv_heads: Hkv (0: H); head_dim (0: wq rows / heads). dtype: the
layer's ('f32', 'f64', 'bf16', 'f16'; default: wq's). rope: a dict of RoPE's settings
(theta, rotary_dim, style 'half'/'interleaved', scaling 'none'/'linear'/'llama3'/'yarn', factor,
low_freq_factor, high_freq_factor, original_max_positions; yarn: beta_fast, beta_slow,
attention_factor, truncate). q_norm/k_norm: [head_dim]
RMSNorm weights. scale, softcap, window (left, right), alibi_slopes, sinks, T5's table
[num_buckets, heads] as attention(). causal: a decoder's self-attention.)doc")
      .def_static("from_safetensors",
                  [](const py::object& path, std::int64_t heads, std::int64_t kv_heads, const std::string& prefix,
                     const std::string& dtype) {
                    return MultiHeadAttention::from_safetensors(path_arg(path, "path"), heads, kv_heads, prefix,
                                                                dtype_named(dtype, "dtype"));
                  },
                  py::arg("path"), py::arg("heads"), py::arg("kv_heads") = 0, py::arg("prefix") = "",
                  py::arg("dtype") = "f32",
                  "A layer from a safetensors file: torch's in_proj_weight/out_proj names or Hugging Face's\n"
                  "q_proj/k_proj/v_proj/o_proj, looked up under `prefix`.")
      .def_static("from_pretrained",
                  [](const py::object& model_dir, std::int64_t layer_index, const py::object& dtype, const std::string& stack,
                     const std::string& attention_kind) {
                    return MultiHeadAttention::from_pretrained(path_arg(model_dir, "model_dir"), layer_index,
                                                               pretrained_options(stack, attention_kind, dtype));
                  },
                  py::arg("model_dir"), py::arg("layer_index"), py::arg("dtype") = py::none(), py::kw_only(),
                  py::arg("stack") = "", py::arg("attention") = "self",
                  "One attention sub-layer of a Hugging Face model directory (config.json + model.safetensors\n"
                  "or its sharded index; a str or os.PathLike): bert, roberta, vit, deit, gpt2, t5 (stack\n"
                  "'encoder'/'decoder', attention 'self'/'cross'), bloom, llama, mistral, qwen2, qwen3, gemma2,\n"
                  "gpt_oss, deepseek_v2, deepseek_v3, qwen3_next (docs/models.md).")
      .def_static("from_pretrained",  // (the earlier keyword names: dir, layer)
                  [](const py::object& dir, std::int64_t layer, const std::string& stack, const std::string& attention_kind,
                     const py::object& dtype) {
                    return MultiHeadAttention::from_pretrained(path_arg(dir, "dir"), layer,
                                                               pretrained_options(stack, attention_kind, dtype));
                  },
                  py::kw_only(), py::arg("dir"), py::arg("layer"), py::arg("stack") = "", py::arg("attention") = "self",
                  py::arg("dtype") = py::none())
      .def_static("from_diffusers",
                  [](const py::object& path, const std::string& prefix, std::int64_t heads,
                     const std::string& attention_kind, const py::object& dtype) {
                    return MultiHeadAttention::from_diffusers(path_arg(path, "path"), prefix, heads,
                                                              pretrained_options("", attention_kind, dtype));
                  },
                  py::arg("path"), py::arg("prefix"), py::arg("heads"), py::arg("attention") = "",
                  py::arg("dtype") = py::none(),
                  "A diffusers transformer block's attn1 ('self') or attn2 ('cross') under `prefix`.")
      .def_static("from_gguf",
                  [](const py::object& path, std::int64_t layer, const py::object& dtype) {
                    return MultiHeadAttention::from_gguf(path_arg(path, "path"), layer, optional_dtype(dtype, "dtype"));
                  },
                  py::arg("path"), py::arg("layer"), py::arg("dtype") = py::none(),
                  "One attention sub-layer of a llama.cpp GGUF file (llama, mistral, qwen2, qwen3; F32, F16,\n"
                  "BF16 or Q8_0), equal to from_pretrained's on the directory it was converted from\n"
                  "(docs/models.md). dtype: None (the query weight's; f32 for Q8_0) or a dtype.")
      .def("forward", &forward_py, py::arg("query"), py::arg("key") = py::none(), py::arg("value") = py::none(),
           py::kw_only(), py::arg("cache") = nullptr, py::arg("causal") = py::none(),
           py::arg("key_padding_mask") = py::none(), py::arg("attn_mask") = py::none(),
           py::arg("positions") = py::none(), py::arg("need_weights") = false,
           py::arg("average_attn_weights") = true, py::arg("threads") = 0, py::arg("backend") = "native",
           py::arg("out") = py::none(),
           R"doc(The layer on query [B, Sq, d_model] (key [B, Sk, kdim], value [B, Sk, vdim] for
cross-attention; omitted: self-attention), arrays of the layer's dtype (bf16 layers take
float arrays and return float32). Non-contiguous inputs are copied.

cache         a KvCache: append the new tokens' keys/values and attend over the cache
              (incremental decoding; causal None or 'bottom_right').
causal        None, True/'top_left', 'bottom_right'.
key_padding_mask  [B, Sk] bool: True = padding (ignored), as torch's.
attn_mask     additive float mask broadcastable to [B, H, Sq, Sk].
positions     [B, S] token positions for RoPE.
need_weights  also return the attention weights: [B, Sq, Sk] averaged over heads
              (average_attn_weights, default) or [B, H, Sq, Sk].
out           C-contiguous array to write. Returns out (or (out, weights)).)doc")
      .def_property_readonly("d_model", [](const MultiHeadAttention& l) { return l.config().d_model; })
      .def_property_readonly("heads", [](const MultiHeadAttention& l) { return l.config().heads; })
      .def_property_readonly("kv_heads", [](const MultiHeadAttention& l) { return l.config().kv_heads; })
      .def_property_readonly("head_dim", [](const MultiHeadAttention& l) { return l.config().head_dim; })
      .def_property_readonly("kdim", [](const MultiHeadAttention& l) { return l.config().kdim; })
      .def_property_readonly("vdim", [](const MultiHeadAttention& l) { return l.config().vdim; })
      .def_property_readonly("causal", [](const MultiHeadAttention& l) { return l.config().causal; })
      .def_property_readonly("dtype", [](const MultiHeadAttention& l) { return std::string(dtype_name(l.dtype())); });

  py::class_<KvCache>(m, "KvCache", "Keys and values of one layer for a batch of sequences, each with its own length.")
      .def(py::init([](const MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity,
                       const py::object& dtype) {
             const std::optional<DType> t = cache_dtype_of(dtype, "dtype");
             return t ? KvCache(layer, batch, capacity, *t) : KvCache(layer, batch, capacity);
           }),
           py::arg("layer"), py::arg("batch"), py::arg("capacity"), py::arg("dtype") = py::none(),
           py::keep_alive<1, 2>(),
           "A cache of `capacity` tokens for `batch` sequences, in the layer's dtype or `dtype` ('f32', 'f64',\n"
           "'bf16', 'f16', or the 8-bit 'int8', 'fp8_e4m3', 'fp8_e5m2': codes and a float32 scale per row).")
      .def("reset", &KvCache::reset, "Every sequence back to length 0.")
      .def("truncate", &KvCache::truncate, py::arg("sequence"), py::arg("length"),
           "Keep the first `length` tokens of sequence `sequence`.")
      .def_property_readonly("lengths", [](const KvCache& c) {
        return std::vector<std::int64_t>(c.lengths().begin(), c.lengths().end());
      })
      .def_property_readonly("batch", &KvCache::batch)
      .def_property_readonly("capacity", &KvCache::capacity)
      .def_property_readonly("bytes_per_token", &KvCache::bytes_per_token,
                             "Bytes one token occupies in this cache (per layer): an MLA layer's latent row")
      .def_property_readonly("dtype", [](const KvCache& c) { return std::string(dtype_name(c.dtype())); });
}

}  // namespace simdattn::python
