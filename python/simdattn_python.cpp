// The Python module `simdattn` (pybind11): attention, linear attention, the MHA layer and its KV
// cache over NumPy arrays. Arrays are read and written in place through their strides (no copy)
// wherever the C++ API takes strided views; every call releases the GIL while it computes;
// errors raise simdattn.Error (a ValueError) whose `argument` names the argument at fault.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"

namespace py = pybind11;
using namespace simdattn;

namespace {

// ---- arrays <-> views -------------------------------------------------------------------------

// The dtype of a NumPy array as the library names it; Error(name) for any other.
DType dtype_of_array(const py::array& a, const std::string& name) {
  const py::dtype d = a.dtype();
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'f' && size == 2) return DType::f16;
  if ((kind == 'b' || kind == 'u') && size == 1) return DType::u8;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  throw Error(name, "expected an array of float32, float64, float16 or bool/uint8, got dtype " +
                        d.attr("name").cast<std::string>());
}

// Element strides of `a` (its byte strides divided by the item size): Error(name) for a negative
// or unaligned stride, which a view cannot express without a copy.
std::vector<std::int64_t> element_strides(const py::array& a, const std::string& name) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(a.ndim()));
  const auto item = static_cast<std::int64_t>(a.itemsize());
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    const auto b = static_cast<std::int64_t>(a.strides(i));
    if (b < 0 || b % item != 0)
      throw Error(name, "stride " + std::to_string(b) + " bytes of axis " + std::to_string(i) +
                            " is negative or not a multiple of the item size " + std::to_string(item) +
                            " (a view cannot express it; pass a copy, e.g. numpy.ascontiguousarray)");
    s[static_cast<std::size_t>(i)] = b / item;
  }
  return s;
}

// A 4-D view of `a`; arrays of fewer dimensions (at least min_ndim) are read with leading axes of
// size 1 (broadcast masks: [Sq, Sk] is [1, 1, Sq, Sk]).
template <class View>
View view_of(const py::array& a, const std::string& name, int min_ndim = 4) {
  if (a.ndim() < min_ndim || a.ndim() > 4)
    throw Error(name, "expected a " + (min_ndim == 4 ? std::string("4-D") : std::to_string(min_ndim) + "-D to 4-D") +
                          " array, got " + std::to_string(a.ndim()) + "-D");
  const std::vector<std::int64_t> st = element_strides(a, name);
  View v;
  if constexpr (std::is_same_v<View, TensorView>) {
    if (!a.writeable()) throw Error(name, "expected a writeable array");
    v.data = const_cast<void*>(a.data());
  } else {
    v.data = a.data();
  }
  v.dtype = dtype_of_array(a, name);
  const int pad = 4 - static_cast<int>(a.ndim());
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i < pad ? 1 : static_cast<std::int64_t>(a.shape(i - pad));
    v.strides[i] = i < pad ? 0 : st[static_cast<std::size_t>(i - pad)];
  }
  if (v.data == nullptr) v.data = reinterpret_cast<decltype(v.data)>(&v);  // an empty array: never read
  return v;
}

// bf16 arrays: NumPy has no bfloat16, so `dtype="bf16"` rounds float inputs to a bf16 copy
// (nearest even) and the results come back as float32.
struct Bf16Copy {
  std::vector<bfloat16> data;
  ConstTensorView view;
};

Bf16Copy to_bf16(const py::array& a, const std::string& name) {
  if (a.ndim() != 4) throw Error(name, "expected a 4-D array, got " + std::to_string(a.ndim()) + "-D");
  const DType t = dtype_of_array(a, name);
  if (t != DType::f32 && t != DType::f64 && t != DType::f16)
    throw Error(name, "dtype='bf16' converts float arrays; got " + std::string(dtype_name(t)));
  const py::array_t<float, py::array::c_style | py::array::forcecast> f(a);
  Bf16Copy c;
  c.data.resize(static_cast<std::size_t>(f.size()));
  const float* src = f.data();
  for (std::size_t i = 0; i < c.data.size(); ++i) c.data[i] = to_bfloat16(src[i]);
  const Shape4 shape{a.shape(0), a.shape(1), a.shape(2), a.shape(3)};
  c.view = ConstTensorView(c.data.data(), shape);
  return c;
}

std::string string_arg(const py::handle& h, const std::string& name) {
  if (!py::isinstance<py::str>(h)) throw Error(name, "expected a string");
  return h.cast<std::string>();
}

Backend backend_of(const std::string& s) {
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn})
    if (s == backend_name(b)) return b;
  throw Error("backend", "expected 'reference', 'native' or 'onednn', got '" + s + "'");
}

// causal: None/False (none), True or "top_left", "bottom_right", "none".
Causal causal_of(const py::object& c) {
  if (c.is_none()) return Causal::none;
  if (py::isinstance<py::bool_>(c)) return c.cast<bool>() ? Causal::top_left : Causal::none;
  const std::string s = string_arg(c, "causal");
  if (s == "none") return Causal::none;
  if (s == "top_left" || s == "top-left") return Causal::top_left;
  if (s == "bottom_right" || s == "bottom-right") return Causal::bottom_right;
  throw Error("causal", "expected None, a bool, 'none', 'top_left' or 'bottom_right', got '" + s + "'");
}

template <class T>
std::vector<T> vector_of(const py::object& o, const std::string& name) {
  if (o.is_none()) return {};
  try {
    const py::array_t<T, py::array::c_style | py::array::forcecast> a(o);
    if (a.ndim() != 1) throw Error(name, "expected a sequence (1-D), got " + std::to_string(a.ndim()) + "-D");
    return std::vector<T>(a.data(), a.data() + a.size());
  } catch (const py::error_already_set&) {
    throw Error(name, "expected a sequence of numbers");
  }
}

std::optional<Window> window_of(const py::object& w) {
  if (w.is_none()) return std::nullopt;
  std::vector<std::int64_t> v;
  try {
    v = w.cast<std::vector<std::int64_t>>();
  } catch (const py::cast_error&) {
    throw Error("window", "expected (left, right), -1 for an unbounded side");
  }
  if (v.size() != 2) throw Error("window", "expected (left, right), got " + std::to_string(v.size()) + " values");
  return Window{v[0], v[1]};
}

DType dtype_named(const std::string& s, const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    if (s == dtype_name(t)) return t;
  if (s == "float32") return DType::f32;
  if (s == "float64") return DType::f64;
  if (s == "float16") return DType::f16;
  if (s == "bfloat16") return DType::bf16;
  throw Error(name, "expected 'f32', 'f64', 'bf16' or 'f16', got '" + s + "'");
}

std::optional<DType> optional_dtype(const py::object& o, const std::string& name) {
  if (o.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(o)) return dtype_named(o.cast<std::string>(), name);
  return dtype_named(py::dtype::from_args(o).attr("name").cast<std::string>(), name);
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::f32: return py::dtype("float32");
    case DType::f64: return py::dtype("float64");
    case DType::f16: return py::dtype("float16");
    case DType::u8: return py::dtype("uint8");
    case DType::i32: return py::dtype("int32");
    case DType::i64: return py::dtype("int64");
    case DType::bf16: return py::dtype("float32");  // returned converted
  }
  return py::dtype("float32");
}

// ---- attention ---------------------------------------------------------------------------------

// Everything attention() takes but q, k, v and out, and the storage the options' spans point to.
struct AttentionCall {
  AttentionOptions o;
  std::vector<std::int64_t> key_lengths, query_offsets;
  std::vector<float> slopes, sinks;
  Bf16Copy q16, k16, v16;
};

py::object attention_py(const py::array& q, const py::array& k, const py::array& v, const py::object& mask,
                        const py::object& causal, const py::object& scale, const py::object& window,
                        const py::object& key_lengths, std::int64_t global_tokens, const py::object& block_mask,
                        std::int64_t block_size, const py::object& softcap, const py::object& alibi_slopes,
                        const py::object& relative_bias, bool relative_bias_bidirectional,
                        std::int64_t relative_bias_max_distance, const py::object& sinks,
                        const py::object& query_offsets, const py::object& lse, bool return_lse,
                        const py::object& scores, const std::string& scores_stage, const std::string& backend,
                        int threads, const py::object& out, const py::object& dtype) {
  AttentionCall c;
  AttentionOptions& o = c.o;
  if (!scale.is_none()) o.scale = scale.cast<double>();
  o.causal = causal_of(causal);
  if (!mask.is_none()) o.mask = view_of<ConstTensorView>(mask.cast<py::array>(), "mask", 2);
  c.key_lengths = vector_of<std::int64_t>(key_lengths, "key_lengths");
  if (!key_lengths.is_none()) o.key_lengths = c.key_lengths;
  o.window = window_of(window);
  o.global_tokens = global_tokens;
  if (!block_mask.is_none()) o.block_mask = view_of<ConstTensorView>(block_mask.cast<py::array>(), "block_mask", 2);
  o.block_size = block_size;
  if (!softcap.is_none()) o.softcap = softcap.cast<double>();
  c.slopes = vector_of<float>(alibi_slopes, "alibi_slopes");
  if (!alibi_slopes.is_none()) o.alibi_slopes = c.slopes;
  if (!relative_bias.is_none())
    o.relative_bias = RelativePositionBias{view_of<ConstTensorView>(relative_bias.cast<py::array>(), "relative_bias", 2),
                                           relative_bias_bidirectional, relative_bias_max_distance};
  c.sinks = vector_of<float>(sinks, "sinks");
  if (!sinks.is_none()) o.sinks = c.sinks;
  c.query_offsets = vector_of<std::int64_t>(query_offsets, "query_offsets");
  if (!query_offsets.is_none()) o.query_offsets = c.query_offsets;
  bool stage_found = false;
  for (ScoreStage s : {ScoreStage::scaled, ScoreStage::capped, ScoreStage::biased, ScoreStage::softmax})
    if (scores_stage == score_stage_name(s)) o.scores_stage = s, stage_found = true;
  if (!stage_found)
    throw Error("scores_stage", "expected 'scaled', 'capped', 'biased' or 'softmax', got '" + scores_stage + "'");
  if (!scores.is_none()) o.scores = view_of<TensorView>(scores.cast<py::array>(), "scores");
  o.threads = threads;
  o.backend = backend_of(backend);

  const std::optional<DType> as = optional_dtype(dtype, "dtype");
  const bool bf16 = as == DType::bf16;
  if (as && !bf16 && *as != dtype_of_array(q, "q"))
    throw Error("dtype", "converts to 'bf16' only; the other dtypes are the arrays' own (q is " +
                             std::string(dtype_name(dtype_of_array(q, "q"))) + ")");
  ConstTensorView qv, kv, vv;
  if (bf16) {
    c.q16 = to_bf16(q, "q"), c.k16 = to_bf16(k, "k"), c.v16 = to_bf16(v, "v");
    qv = c.q16.view, kv = c.k16.view, vv = c.v16.view;
  } else {
    qv = view_of<ConstTensorView>(q, "q"), kv = view_of<ConstTensorView>(k, "k"), vv = view_of<ConstTensorView>(v, "v");
  }
  const Shape4 shape = attention_output_shape(qv, kv, vv);
  const std::vector<py::ssize_t> dims(shape.begin(), shape.end());

  py::array result = out.is_none() ? py::array(numpy_dtype(qv.dtype), dims) : out.cast<py::array>();
  py::object lse_array = lse;
  if (lse.is_none() && return_lse)
    lse_array = py::array(py::dtype("float32"), std::vector<py::ssize_t>{shape[0], shape[1], shape[2], 1});
  if (!lse_array.is_none()) o.lse = view_of<TensorView>(lse_array.cast<py::array>(), "lse");

  std::vector<bfloat16> out16;
  TensorView ov;
  if (bf16) {
    TensorView caller = view_of<TensorView>(result, "out");
    if (caller.dtype != DType::f32) throw Error("out", "with dtype='bf16' the output is float32");
    if (caller.shape != shape) throw Error("out", "expected the output's shape");
    out16.resize(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
    ov = TensorView(out16.data(), shape);
  } else {
    ov = view_of<TensorView>(result, "out");
  }
  {
    py::gil_scoped_release release;
    attention(qv, kv, vv, ov, o);
  }
  if (bf16) {
    const TensorView caller = view_of<TensorView>(result, "out");
    auto* dst = static_cast<float*>(caller.data);
    std::size_t n = 0;
    for (std::int64_t a = 0; a < shape[0]; ++a)
      for (std::int64_t b = 0; b < shape[1]; ++b)
        for (std::int64_t i = 0; i < shape[2]; ++i)
          for (std::int64_t d = 0; d < shape[3]; ++d)
            dst[a * caller.strides[0] + b * caller.strides[1] + i * caller.strides[2] + d * caller.strides[3]] =
                to_float(out16[n++]);
  }
  if (return_lse) return py::make_tuple(result, lse_array);
  return result;
}

py::array linear_attention_py(const py::array& q, const py::array& k, const py::array& v, bool causal,
                              const std::string& feature_map, double eps, std::int64_t chunk,
                              const std::string& backend, int threads, const py::object& out) {
  LinearAttentionOptions o;
  o.causal = causal;
  bool found = false;
  for (FeatureMap f : {FeatureMap::elu1, FeatureMap::relu, FeatureMap::identity})
    if (feature_map == feature_map_name(f)) o.feature_map = f, found = true;
  if (!found) throw Error("feature_map", "expected 'elu1', 'relu' or 'identity', got '" + feature_map + "'");
  o.eps = eps;
  o.chunk = chunk;
  o.threads = threads;
  o.backend = backend_of(backend);
  const ConstTensorView qv = view_of<ConstTensorView>(q, "q"), kv = view_of<ConstTensorView>(k, "k"),
                        vv = view_of<ConstTensorView>(v, "v");
  const Shape4 shape = attention_output_shape(qv, kv, vv);
  py::array result = out.is_none() ? py::array(numpy_dtype(qv.dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()))
                                   : out.cast<py::array>();
  const TensorView ov = view_of<TensorView>(result, "out");
  {
    py::gil_scoped_release release;
    linear_attention(qv, kv, vv, ov, o);
  }
  return result;
}

// Per-call seconds of `reps` attention() calls made from C++ on the same arrays (the calling
// overhead benchmark's baseline; perf/python_overhead.py).
std::vector<double> time_attention_cpp(const py::array& q, const py::array& k, const py::array& v, py::array& out,
                                       int reps, int threads) {
  const ConstTensorView qv = view_of<ConstTensorView>(q, "q"), kv = view_of<ConstTensorView>(k, "k"),
                        vv = view_of<ConstTensorView>(v, "v");
  const TensorView ov = view_of<TensorView>(out, "out");
  AttentionOptions o;
  o.threads = threads;
  std::vector<double> t;
  py::gil_scoped_release release;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    attention(qv, kv, vv, ov, o);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return t;
}

// ---- the layer ---------------------------------------------------------------------------------

// A layer of dtype t from float arrays in torch's layout.
template <class T>
MultiHeadAttention make_layer(const MhaConfig& c, const py::dict& w) {
  const auto get = [&](const char* key, bool required) -> std::vector<T> {
    const std::string name = std::string(key);
    if (!w.contains(key) || w[key].is_none()) {
      if (required) throw Error(name, "expected an array");
      return {};
    }
    const py::array a = w[key].cast<py::array>();
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const py::array_t<T, py::array::c_style | py::array::forcecast> x(a);
      return std::vector<T>(x.data(), x.data() + x.size());
    } else {
      const py::array_t<float, py::array::c_style | py::array::forcecast> x(a);
      std::vector<T> r(static_cast<std::size_t>(x.size()));
      for (std::size_t i = 0; i < r.size(); ++i) {
        if constexpr (std::is_same_v<T, bfloat16>) r[i] = to_bfloat16(x.data()[i]);
        else r[i] = to_float16(x.data()[i]);
      }
      return r;
    }
  };
  MhaWeights<T> m{get("wq", true), get("wk", true), get("wv", true), get("wo", true),
                  get("bq", false), get("bk", false), get("bv", false), get("bo", false)};
  return MultiHeadAttention(c, std::move(m));
}

std::int64_t dim_of(const py::array& a, int axis, const char* name) {
  if (a.ndim() != 2) throw Error(name, "expected a 2-D weight [out_features, in_features], got " +
                                           std::to_string(a.ndim()) + "-D");
  return static_cast<std::int64_t>(a.shape(axis));
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
      else throw Error("rope.scaling", "expected 'none', 'linear' or 'llama3', got '" + s + "'");
    } else if (k == "factor") c.factor = value.cast<double>();
    else if (k == "low_freq_factor") c.low_freq_factor = value.cast<double>();
    else if (k == "high_freq_factor") c.high_freq_factor = value.cast<double>();
    else if (k == "original_max_positions") c.original_max_positions = value.cast<std::int64_t>();
    else throw Error("rope", "unknown key '" + k + "'");
  }
  return c;
}

MultiHeadAttention layer_from_arrays(const py::array& wq, const py::array& wk, const py::array& wv,
                                     const py::array& wo, std::int64_t heads, const py::object& bq,
                                     const py::object& bk, const py::object& bv, const py::object& bo,
                                     std::int64_t kv_heads, std::int64_t head_dim, const py::object& rope,
                                     const py::object& q_norm, const py::object& k_norm, double qk_norm_eps,
                                     const py::object& scale, const py::object& softcap, const py::object& window,
                                     const py::object& alibi_slopes, const py::object& sinks,
                                     const py::object& t5_table, bool t5_bidirectional, std::int64_t t5_max_distance,
                                     bool causal, const py::object& dtype) {
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
  w["wq"] = wq, w["wk"] = wk, w["wv"] = wv, w["wo"] = wo, w["bq"] = bq, w["bk"] = bk, w["bv"] = bv, w["bo"] = bo;
  const DType t = optional_dtype(dtype, "dtype").value_or(dtype_of_array(wq, "wq"));
  switch (t) {
    case DType::f32: return make_layer<float>(c, w);
    case DType::f64: return make_layer<double>(c, w);
    case DType::bf16: return make_layer<bfloat16>(c, w);
    case DType::f16: return make_layer<float16>(c, w);
    default: throw Error("dtype", "expected f32, f64, bf16 or f16");
  }
}

// A [B, S, E] sequence batch of the layer's dtype: the array itself when it already is one (C
// order), else a copy (bf16 layers: float arrays rounded to bf16). `keep` holds any copy.
struct SeqInput {
  py::array array;
  std::vector<bfloat16> bf16;
  ConstSeqView view;
};

SeqInput seq_input(const py::array& a, DType t, const char* name) {
  if (a.ndim() != 3) throw Error(name, "expected a 3-D array [B, S, E], got " + std::to_string(a.ndim()) + "-D");
  SeqInput s;
  const auto B = a.shape(0), S = a.shape(1), E = a.shape(2);
  if (t == DType::bf16) {
    const py::array_t<float, py::array::c_style | py::array::forcecast> f(a);
    s.bf16.resize(static_cast<std::size_t>(f.size()));
    for (std::size_t i = 0; i < s.bf16.size(); ++i) s.bf16[i] = to_bfloat16(f.data()[i]);
    s.view = ConstSeqView(s.bf16.data(), B, S, E);
    return s;
  }
  if (dtype_of_array(a, name) != t)
    throw Error(name, "expected the layer's dtype " + std::string(dtype_name(t)) + ", got " +
                          std::string(dtype_name(dtype_of_array(a, name))));
  s.array = py::array::ensure(a, py::array::c_style);
  s.view.data = s.array.data(), s.view.dtype = t, s.view.B = B, s.view.S = S, s.view.E = E;
  if (s.view.data == nullptr) s.view.data = &s;
  return s;
}

py::object forward_py(const MultiHeadAttention& layer, const py::array& query, const py::object& key,
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
  if (!attn_mask.is_none()) o.attn_mask = view_of<ConstTensorView>(attn_mask.cast<py::array>(), "attn_mask", 2);
  std::vector<std::int64_t> pos;
  if (!positions.is_none()) {
    pos = vector_of<std::int64_t>(py::array(positions).attr("reshape")(-1), "positions");
    o.positions = pos;
  }
  o.threads = threads;
  o.backend = backend_of(backend);
  if (key.is_none() != value.is_none()) throw Error(key.is_none() ? "key" : "value", "key and value go together");
  if (cache != nullptr && !key.is_none()) throw Error("cache", "a KV cache is for self-attention (no key/value)");

  const SeqInput q = seq_input(query, t, "query");
  SeqInput k, v;
  if (!key.is_none()) k = seq_input(key.cast<py::array>(), t, "key"), v = seq_input(value.cast<py::array>(), t, "value");
  const std::int64_t B = q.view.B, Sq = q.view.S;
  const std::int64_t Sk = cache != nullptr ? cache->capacity() : (key.is_none() ? Sq : k.view.S);
  const std::vector<py::ssize_t> out_dims{B, Sq, c.d_model};
  const DType out_t = t == DType::bf16 ? DType::f32 : t;
  py::array result = out.is_none() ? py::array(numpy_dtype(out_t), out_dims) : out.cast<py::array>();
  if (!out.is_none()) {
    if (result.ndim() != 3 || !(result.flags() & py::array::c_style) || !result.writeable())
      throw Error("out", "expected a writeable C-contiguous 3-D array");
    if (dtype_of_array(result, "out") != out_t) throw Error("out", "expected dtype " + std::string(dtype_name(out_t)));
  }
  std::vector<bfloat16> out16;
  SeqView ov;
  if (t == DType::bf16) {
    out16.resize(static_cast<std::size_t>(B * Sq * c.d_model));
    ov = SeqView(out16.data(), B, Sq, c.d_model);
  } else {
    ov.data = result.mutable_data(), ov.dtype = t, ov.B = B, ov.S = Sq, ov.E = c.d_model;
    if (ov.data == nullptr) ov.data = &ov;
    if (result.shape(0) != B || result.shape(1) != Sq || result.shape(2) != c.d_model)
      throw Error("out", "expected shape [" + std::to_string(B) + ", " + std::to_string(Sq) + ", " +
                             std::to_string(c.d_model) + "]");
  }
  py::object weights = py::none();
  if (need_weights) {
    const DType wt = t == DType::f64 ? DType::f64 : DType::f32;
    weights = py::array(numpy_dtype(wt), std::vector<py::ssize_t>{B, average_attn_weights ? 1 : c.heads, Sq, Sk});
    o.attn_weights = view_of<TensorView>(weights.cast<py::array>(), "attn_weights");
  }
  {
    py::gil_scoped_release release;
    if (cache != nullptr) layer.forward(q.view, *cache, ov, o);
    else if (key.is_none()) layer.forward(q.view, ov, o);
    else layer.forward(q.view, k.view, v.view, ov, o);
  }
  if (t == DType::bf16) {
    auto* dst = static_cast<float*>(result.mutable_data());
    for (std::size_t i = 0; i < out16.size(); ++i) dst[i] = to_float(out16[i]);
  }
  if (need_weights) return py::make_tuple(result, average_attn_weights ? weights.attr("reshape")(B, Sq, Sk) : weights);
  return result;
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

PYBIND11_MODULE(simdattn, m) {
  m.doc() =
      "simdattn: SIMD-optimized CPU attention for transformer inference.\n\n"
      "attention() and linear_attention() read and write NumPy arrays in place through their\n"
      "strides (float32, float64, float16; dtype='bf16' computes in bfloat16 from float arrays).\n"
      "MultiHeadAttention is torch.nn.MultiheadAttention's layer (batch_first), with a KvCache\n"
      "for incremental decoding. Every call releases the GIL while it computes; invalid input\n"
      "raises simdattn.Error (a ValueError) whose .argument names the argument at fault.";

  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // The C++ API names option fields (options.mask, config.heads); here they are keyword
      // arguments of the same name.
      std::string argument = e.argument(), message = e.what();
      for (const std::string prefix : {"options.", "config."}) {
        if (argument.rfind(prefix, 0) == 0) argument.erase(0, prefix.size());
        if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
      }
      py::object err = py::reinterpret_borrow<py::object>(error.ptr())(message);
      err.attr("argument") = argument;
      PyErr_SetObject(error.ptr(), err.ptr());
    }
  });
  error.attr("__doc__") = "Invalid input to a simdattn call; .argument names the argument (or file) at fault.";

  m.attr("__version__") = kVersionString;

  m.def("attention", &attention_py, py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(),
        py::arg("mask") = py::none(), py::arg("causal") = py::none(), py::arg("scale") = py::none(),
        py::arg("window") = py::none(), py::arg("key_lengths") = py::none(), py::arg("global_tokens") = 0,
        py::arg("block_mask") = py::none(), py::arg("block_size") = 64, py::arg("softcap") = py::none(),
        py::arg("alibi_slopes") = py::none(), py::arg("relative_bias") = py::none(),
        py::arg("relative_bias_bidirectional") = true, py::arg("relative_bias_max_distance") = 128,
        py::arg("sinks") = py::none(), py::arg("query_offsets") = py::none(), py::arg("lse") = py::none(),
        py::arg("return_lse") = false, py::arg("scores") = py::none(), py::arg("scores_stage") = "softmax",
        py::arg("backend") = "native", py::arg("threads") = 0, py::arg("out") = py::none(),
        py::arg("dtype") = py::none(),
        R"doc(Scaled dot-product attention: out = softmax(q k^T * scale + mask) v.

Shapes (4-D arrays of any non-negative strides, read in place, never copied):
  q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] -> out [B, H, Sq, Dv]
  one dtype for all: float32, float64 or float16. H % Hkv == 0 (grouped-query:
  query head h reads key/value head h // (H // Hkv)).

Keyword arguments:
  mask          boolean (bool/uint8: nonzero = attend) or additive float array,
                broadcastable to [B, H, Sq, Sk]; 2-D and 3-D arrays get leading axes of 1.
  causal        None/False, True or 'top_left', 'bottom_right'.
  scale         multiplies q k^T (default 1/sqrt(D)).
  window        (left, right): keys p-left .. p+right are visible (-1: unbounded).
  key_lengths   B ints: keys j >= key_lengths[b] are hidden.
  global_tokens the first G positions are global (see docs/design.md).
  block_mask    bool/uint8 [ceil(Sq/bs), ceil(Sk/bs)]; block_size bs (default 64).
  softcap       s = cap * tanh(s / cap).
  alibi_slopes  H floats: s += slope[h] * (j - p).
  relative_bias T5's table [num_buckets, H]; relative_bias_bidirectional,
                relative_bias_max_distance as T5's.
  sinks         H floats: one sink logit per head in the softmax's denominator.
  query_offsets B ints: query i of batch b sits at position i + offset.
  lse           float32 array [B, H, Sq, 1] to receive each row's log-sum-exp;
  return_lse    True: return (out, lse), lse allocated when not given.
  scores        array [B, H, Sq, Sk] to receive the scores at scores_stage
                ('scaled', 'capped', 'biased' or 'softmax').
  backend       'native' (default), 'reference' (float64 loops) or 'onednn'.
  threads       0: OpenMP's default; 1: the calling thread only.
  out           array [B, H, Sq, Dv] to write (any strides); default: a new array.
  dtype         'bf16': round the float inputs to bfloat16, compute, return float32.

Returns out (or (out, lse) with return_lse). Raises simdattn.Error naming the argument
on invalid input, before anything is written.)doc");

  m.def("linear_attention", &linear_attention_py, py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(),
        py::arg("causal") = false, py::arg("feature_map") = "elu1", py::arg("eps") = 1e-6, py::arg("chunk") = 64,
        py::arg("backend") = "native", py::arg("threads") = 0, py::arg("out") = py::none(),
        R"doc(Linear attention (Katharopoulos et al. 2020): softmax replaced by a feature map phi.

  out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / (phi(q_i)^T sum_j phi(k_j) + eps)
  (causal: sums over j <= i; needs Sq == Sk)

Shapes and dtypes as attention(). feature_map: 'elu1' (default), 'relu' or 'identity'.
backend: 'native' or 'reference'. Returns out.)doc");

  m.def("info", [] {
    const RuntimeInfo r = runtime_info();
    py::dict d;
    d["version"] = r.version, d["isa"] = r.isa, d["isa_forced"] = r.isa_forced, d["isas"] = r.isas;
    d["isa_notes"] = r.isa_notes, d["default_threads"] = r.default_threads, d["thread_budget"] = r.thread_budget;
    d["backends"] = r.backends, d["onednn_version"] = r.onednn_version;
    return d;
  }, "What this build and machine offer: version, the ISA the kernels use, backends, threads (a dict).");

  m.def("set_thread_budget", &set_thread_budget, py::arg("threads"),
        "The most threads all concurrent calls of the library use together (0: the CPUs of the process).");

  m.def("standard_alibi_slopes", [](std::int64_t heads) {
    const std::vector<float> s = standard_alibi_slopes(heads);
    py::array_t<float> a(static_cast<py::ssize_t>(s.size()));
    std::copy(s.begin(), s.end(), a.mutable_data());
    return a;
  }, py::arg("heads"), "ALiBi's usual slopes for `heads` heads (as BLOOM and MPT build them), float32.");

  m.def("_time_attention_cpp", &time_attention_cpp, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("reps"), py::arg("threads") = 0,
        "Seconds of each of `reps` attention() calls made from C++ (the calling-overhead baseline).");

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
(theta, rotary_dim, style 'half'/'interleaved', scaling 'none'/'linear'/'llama3', factor,
low_freq_factor, high_freq_factor, original_max_positions). q_norm/k_norm: [head_dim]
RMSNorm weights. scale, softcap, window (left, right), alibi_slopes, sinks, T5's table
[num_buckets, heads] as attention(). causal: a decoder's self-attention.)doc")
      .def_static("from_safetensors",
                  [](const std::string& path, std::int64_t heads, std::int64_t kv_heads, const std::string& prefix,
                     const std::string& dtype) {
                    return MultiHeadAttention::from_safetensors(path, heads, kv_heads, prefix, dtype_named(dtype, "dtype"));
                  },
                  py::arg("path"), py::arg("heads"), py::arg("kv_heads") = 0, py::arg("prefix") = "",
                  py::arg("dtype") = "f32",
                  "A layer from a safetensors file: torch's in_proj_weight/out_proj names or Hugging Face's\n"
                  "q_proj/k_proj/v_proj/o_proj, looked up under `prefix`.")
      .def_static("from_pretrained",
                  [](const std::string& dir, std::int64_t layer, const std::string& stack,
                     const std::string& attention_kind, const py::object& dtype) {
                    return MultiHeadAttention::from_pretrained(dir, layer, pretrained_options(stack, attention_kind, dtype));
                  },
                  py::arg("dir"), py::arg("layer"), py::arg("stack") = "", py::arg("attention") = "self",
                  py::arg("dtype") = py::none(),
                  "One attention sub-layer of a Hugging Face model directory (config.json + model.safetensors\n"
                  "or its sharded index): bert, roberta, vit, deit, gpt2, t5 (stack 'encoder'/'decoder',\n"
                  "attention 'self'/'cross'), bloom, llama, mistral, qwen2, qwen3, gemma2 (docs/models.md).")
      .def_static("from_diffusers",
                  [](const std::string& path, const std::string& prefix, std::int64_t heads,
                     const std::string& attention_kind, const py::object& dtype) {
                    return MultiHeadAttention::from_diffusers(path, prefix, heads,
                                                              pretrained_options("", attention_kind, dtype));
                  },
                  py::arg("path"), py::arg("prefix"), py::arg("heads"), py::arg("attention") = "self",
                  py::arg("dtype") = py::none(),
                  "A diffusers transformer block's attn1 ('self') or attn2 ('cross') under `prefix`.")
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
             const std::optional<DType> t = optional_dtype(dtype, "dtype");
             return t ? KvCache(layer, batch, capacity, *t) : KvCache(layer, batch, capacity);
           }),
           py::arg("layer"), py::arg("batch"), py::arg("capacity"), py::arg("dtype") = py::none(),
           py::keep_alive<1, 2>(),
           "A cache of `capacity` tokens for `batch` sequences, in the layer's dtype or `dtype`.")
      .def("reset", &KvCache::reset, "Every sequence back to length 0.")
      .def("truncate", &KvCache::truncate, py::arg("sequence"), py::arg("length"),
           "Keep the first `length` tokens of sequence `sequence`.")
      .def_property_readonly("lengths", [](const KvCache& c) {
        return std::vector<std::int64_t>(c.lengths().begin(), c.lengths().end());
      })
      .def_property_readonly("batch", &KvCache::batch)
      .def_property_readonly("capacity", &KvCache::capacity)
      .def_property_readonly("dtype", [](const KvCache& c) { return std::string(dtype_name(c.dtype())); });
}
