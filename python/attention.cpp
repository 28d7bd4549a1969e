// The Python module's attention, linear attention and runtime functions (module.cpp binds them).
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

// Everything attention() takes but q, k, v and out, and the storage the options' spans point to.
struct AttentionCall {
  AttentionOptions o;
  std::vector<std::int64_t> key_lengths, query_offsets;
  std::vector<float> slopes, sinks;
  Array mask, block_mask, relative_bias, scores, lse;
  std::vector<Array> scales;
};

// q's dtype, or bf16 when `dtype` asks for it (float inputs rounded to a bf16 copy); Error("dtype")
// for any other conversion.
bool converts_to_bf16(const py::object& dtype, const Array& q) {
  const std::optional<DType> as = optional_dtype(dtype, "dtype");
  if (as && *as != DType::bf16 && *as != q.dtype)
    throw Error("dtype", "converts to 'bf16' only; the other dtypes are the arrays' own (q is " + q.dtype_text() + ")");
  return as == DType::bf16 && q.dtype != DType::bf16;
}

py::object attention_py(const py::object& q_in, const py::object& k_in, const py::object& v_in, const py::object& mask,
                        const py::object& causal, const py::object& scale, const py::object& window,
                        const py::object& key_lengths, std::int64_t global_tokens, const py::object& block_mask,
                        std::int64_t block_size, const py::object& softcap, const py::object& alibi_slopes,
                        const py::object& relative_bias, bool relative_bias_bidirectional,
                        std::int64_t relative_bias_max_distance, const py::object& sinks,
                        const py::object& query_offsets, const py::object& lse, bool return_lse,
                        const py::object& scores, const std::string& scores_stage, const std::string& backend,
                        int threads, const py::object& out, const py::object& dtype, const py::object& k_scale,
                        const py::object& v_scale, const py::object& kv_dtype) {
  const Array q = array_of(q_in, "q"), k = array_of(k_in, "k"), v = array_of(v_in, "v");
  AttentionCall c;
  AttentionOptions& o = c.o;
  if (!scale.is_none()) o.scale = scale.cast<double>();
  o.causal = causal_of(causal);
  if (!mask.is_none()) c.mask = array_of(mask, "mask"), o.mask = const_view(c.mask, "mask", 2);
  c.key_lengths = vector_of<std::int64_t>(key_lengths, "key_lengths");
  if (!key_lengths.is_none()) o.key_lengths = c.key_lengths;
  o.window = window_of(window);
  o.global_tokens = global_tokens;
  if (!block_mask.is_none()) c.block_mask = array_of(block_mask, "block_mask"), o.block_mask = const_view(c.block_mask, "block_mask", 2);
  o.block_size = block_size;
  if (!softcap.is_none()) o.softcap = softcap.cast<double>();
  c.slopes = vector_of<float>(alibi_slopes, "alibi_slopes");
  if (!alibi_slopes.is_none()) o.alibi_slopes = c.slopes;
  if (!relative_bias.is_none()) {
    c.relative_bias = array_of(relative_bias, "relative_bias");
    o.relative_bias = RelativePositionBias{const_view(c.relative_bias, "relative_bias", 2), relative_bias_bidirectional,
                                           relative_bias_max_distance};
  }
  c.sinks = vector_of<float>(sinks, "sinks");
  if (!sinks.is_none()) o.sinks = c.sinks;
  c.query_offsets = vector_of<std::int64_t>(query_offsets, "query_offsets");
  if (!query_offsets.is_none()) o.query_offsets = c.query_offsets;
  bool stage_found = false;
  for (ScoreStage s : {ScoreStage::scaled, ScoreStage::capped, ScoreStage::biased, ScoreStage::softmax})
    if (scores_stage == score_stage_name(s)) o.scores_stage = s, stage_found = true;
  if (!stage_found)
    throw Error("scores_stage", "expected 'scaled', 'capped', 'biased' or 'softmax', got '" + scores_stage + "'");
  if (!scores.is_none()) c.scores = array_of(scores, "scores"), o.scores = mutable_view(c.scores, "scores");
  o.threads = threads;
  o.backend = backend_of(backend);

  const bool bf16 = converts_to_bf16(dtype, q);
  const bool coded = !kv_dtype.is_none();  // k and v are codes: set_kv_codes views them
  Converted q16, k16, v16;
  ConstTensorView qv, kv, vv;
  if (bf16) {
    q16 = converted(q, DType::bf16, "q"), qv = const_view(q16.array, "q");
    if (!coded) {
      k16 = converted(k, DType::bf16, "k"), v16 = converted(v, DType::bf16, "v");
      kv = const_view(k16.array, "k"), vv = const_view(v16.array, "v");
    }
  } else {
    qv = const_view(q, "q");
    if (!coded) kv = const_view(k, "k"), vv = const_view(v, "v");
  }
  set_kv_codes(kv_dtype, k, v, "k", "v", k_scale, v_scale, "[B, Hkv, Sk]", kv, vv, c.scales, o);
  const Shape4 shape = attention_output_shape(qv, kv, vv);
  // dtype='bf16' computes in bf16 and returns float32 (NumPy has no bfloat16)
  const Output result = output_of(out, q, bf16 ? DType::f32 : qv.dtype, qv.dtype, {shape.begin(), shape.end()});
  py::object lse_array = lse;
  if (lse.is_none() && return_lse) lse_array = new_array(q, DType::f32, {shape[0], shape[1], shape[2]});
  if (!lse_array.is_none()) {
    c.lse = array_of(lse_array, "lse");
    if (c.lse.ndim() == 3) c.lse.shape.push_back(1), c.lse.strides.push_back(1);  // [B, H, Sq] as [B, H, Sq, 1]
    o.lse = mutable_view(c.lse, "lse");
  }
  {
    py::gil_scoped_release release;
    attention(qv, kv, vv, result.view, o);
    result.finish();
  }
  if (return_lse) return py::make_tuple(result.object, lse_array);
  return result.object;
}

// x [..., D] as rows: its codes and one f32 scale per row, arrays of x's kind.
py::tuple quantize_kv_py(const py::object& x_in, const py::object& dtype) {
  const DType code = code_dtype_named(dtype, "dtype");
  const Array x = array_of(x_in, "x");
  if (x.ndim() < 1) throw Error("x", "expected an array of at least 1 dimension [..., D]");
  if (x.dtype != DType::f32 && x.dtype != DType::f64 && x.dtype != DType::f16 && x.dtype != DType::bf16)
    throw Error("x", "expected float32, float64, float16 or bfloat16, got dtype " + x.dtype_text());
  std::vector<std::int64_t> shape = x.shape;
  const std::int64_t D = shape.back(), rows = D == 0 ? 0 : x.size() / D;
  const Converted f = converted(x, DType::f32, "x");  // C-contiguous: rows of D
  py::object codes = new_array(x, code == DType::int8 ? DType::int8 : DType::u8, shape);
  shape.pop_back();
  py::object scales = new_array(x, DType::f32, shape);
  if (rows > 0 && D > 0) {
    const Array ca = array_of(codes, "codes"), sa = array_of(scales, "scales");
    const ConstTensorView xv(f.array.data, DType::f32, Shape4{1, 1, rows, D});
    const TensorView cv(ca.data, code, Shape4{1, 1, rows, D}), sv(sa.data, DType::f32, Shape4{1, 1, rows, 1});
    py::gil_scoped_release release;
    quantize_kv(xv, code, cv, sv);
  }
  return py::make_tuple(codes, scales);
}

py::object dequantize_kv_py(const py::object& codes_in, const py::object& scales_in, const py::object& dtype) {
  const DType code = code_dtype_named(dtype, "dtype");
  const Array codes = array_of(codes_in, "codes"), scales = array_of(scales_in, "scales");
  if (codes.ndim() < 1) throw Error("codes", "expected an array of at least 1 dimension [..., D]");
  const DType want = code == DType::int8 ? DType::int8 : DType::u8;
  if (codes.dtype != want)
    throw Error("codes", std::string("expected ") + (code == DType::int8 ? "an int8" : "a uint8") + " array of " +
                             std::string(dtype_name(code)) + " codes, got dtype " + codes.dtype_text());
  if (scales.shape != std::vector<std::int64_t>(codes.shape.begin(), codes.shape.end() - 1))
    throw Error("scales", "expected the codes' shape without its last axis");
  if (scales.dtype != DType::f32) throw Error("scales", "expected a float32 array");
  // C-contiguous rows: the arrays themselves, or copies
  const Converted cc = codes.c_contiguous() ? Converted{} : converted(codes, codes.dtype, "codes"),
                  sc = scales.c_contiguous() ? Converted{} : converted(scales, DType::f32, "scales");
  const void* c = codes.c_contiguous() ? codes.data : cc.array.data;
  const void* s = scales.c_contiguous() ? scales.data : sc.array.data;
  py::object out = new_array(codes, DType::f32, codes.shape);
  const std::int64_t D = codes.shape.back(), rows = D == 0 ? 0 : codes.size() / D;
  if (rows > 0) {
    const ConstTensorView cv(c, code, Shape4{1, 1, rows, D}), sv(s, DType::f32, Shape4{1, 1, rows, 1});
    const TensorView ov(array_of(out, "out").data, DType::f32, Shape4{1, 1, rows, D});
    py::gil_scoped_release release;
    dequantize_kv(cv, sv, ov);
  }
  return out;
}

py::object linear_attention_py(const py::object& q_in, const py::object& k_in, const py::object& v_in, bool causal,
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
  const Array q = array_of(q_in, "q"), k = array_of(k_in, "k"), v = array_of(v_in, "v");
  const ConstTensorView qv = const_view(q, "q"), kv = const_view(k, "k"), vv = const_view(v, "v");
  const Shape4 shape = attention_output_shape(qv, kv, vv);
  const Output result = output_of(out, q, qv.dtype, qv.dtype, {shape.begin(), shape.end()});
  {
    py::gil_scoped_release release;
    linear_attention(qv, kv, vv, result.view, o);
  }
  return result.object;
}

// A [B, T, Hv] array (g, beta) as the [B, T, Hv, 1] view gated_delta_rule takes.
ConstTensorView per_head_view(const Array& a, const char* name) {
  if (a.ndim() != 3) throw Error(name, "expected [B, T, Hv], got " + std::to_string(a.ndim()) + " dimensions");
  return ConstTensorView(a.data, a.dtype, Shape4{a.shape[0], a.shape[1], a.shape[2], 1},
                         Shape4{a.strides[0], a.strides[1], a.strides[2], 1});
}

py::object gated_delta_rule_py(const py::object& q_in, const py::object& k_in, const py::object& v_in, const py::object& g_in,
                               const py::object& beta_in, const py::object& scale, const py::object& initial_state,
                               bool output_final_state, bool use_qk_l2norm, int threads, const py::object& out) {
  const Array q = array_of(q_in, "q"), k = array_of(k_in, "k"), v = array_of(v_in, "v");
  const Array g = array_of(g_in, "g"), beta = array_of(beta_in, "beta");
  for (const auto& [a, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
    if (a->ndim() != 4) throw Error(name, "expected 4 dimensions ([B, T, heads, D]), got " + std::to_string(a->ndim()));
  const ConstTensorView qv = const_view(q, "q"), kv = const_view(k, "k"), vv = const_view(v, "v");
  const ConstTensorView gv = per_head_view(g, "g"), bv = per_head_view(beta, "beta");
  GatedDeltaRuleOptions o;
  if (!scale.is_none()) o.scale = scale.cast<double>();
  o.use_qk_l2norm = use_qk_l2norm;
  o.threads = threads;
  Array init;
  if (!initial_state.is_none()) {
    init = array_of(initial_state, "initial_state");
    if (init.ndim() != 4) throw Error("initial_state", "expected [B, Hv, Dk, Dv], got " + std::to_string(init.ndim()) + " dimensions");
    o.initial_state = const_view(init, "initial_state");
  }
  const std::vector<std::int64_t> shape = {q.shape[0], q.shape[1], v.shape[2], v.shape[3]};
  const Output result = output_of(out, q, qv.dtype, qv.dtype, shape);
  py::object final_state = py::none();
  if (output_final_state) {
    final_state = new_array(q, DType::f32, {q.shape[0], v.shape[2], q.shape[3], v.shape[3]});
    o.final_state = mutable_view(array_of(final_state, "final_state"), "final_state");
  }
  {
    py::gil_scoped_release release;
    gated_delta_rule(qv, kv, vv, gv, bv, result.view, o);
    result.finish();
  }
  if (output_final_state) return py::make_tuple(result.object, final_state);
  return result.object;
}

// Per-call seconds of `reps` attention() calls made from C++ on the same arrays (the calling
// overhead benchmark's baseline; perf/hosts/python_overhead.py).
std::vector<double> time_attention_cpp(const py::object& q_in, const py::object& k_in, const py::object& v_in,
                                       const py::object& out_in, int reps, int threads) {
  const Array q = array_of(q_in, "q"), k = array_of(k_in, "k"), v = array_of(v_in, "v"), out = array_of(out_in, "out");
  const ConstTensorView qv = const_view(q, "q"), kv = const_view(k, "k"), vv = const_view(v, "v");
  const TensorView ov = mutable_view(out, "out");
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

}  // namespace

void bind_attention(py::module_& m) {
  m.def("attention", &attention_py, py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(),
        py::arg("mask") = py::none(), py::arg("causal") = py::none(), py::arg("scale") = py::none(),
        py::arg("window") = py::none(), py::arg("key_lengths") = py::none(), py::arg("global_tokens") = 0,
        py::arg("block_mask") = py::none(), py::arg("block_size") = 64, py::arg("softcap") = py::none(),
        py::arg("alibi_slopes") = py::none(), py::arg("relative_bias") = py::none(),
        py::arg("relative_bias_bidirectional") = true, py::arg("relative_bias_max_distance") = 128,
        py::arg("sinks") = py::none(), py::arg("query_offsets") = py::none(), py::arg("lse") = py::none(),
        py::arg("return_lse") = false, py::arg("scores") = py::none(), py::arg("scores_stage") = "softmax",
        py::arg("backend") = "native", py::arg("threads") = 0, py::arg("out") = py::none(),
        py::arg("dtype") = py::none(), py::arg("k_scale") = py::none(), py::arg("v_scale") = py::none(),
        py::arg("kv_dtype") = py::none(),
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
  lse           float32 array [B, H, Sq] (or [B, H, Sq, 1]) to receive each row's log-sum-exp;
  return_lse    True: return (out, lse), lse allocated when not given.
  scores        array [B, H, Sq, Sk] to receive the scores at scores_stage
                ('scaled', 'capped', 'biased' or 'softmax').
  backend       'native' (default), 'reference' (float64 loops) or 'onednn'.
  threads       0: OpenMP's default; 1: the calling thread only.
  out           array [B, H, Sq, Dv] to write (any strides); default: a new array.
  dtype         'bf16': round the float inputs to bfloat16, compute, return float32.
  kv_dtype      'int8', 'fp8_e4m3' or 'fp8_e5m2': k and v are 8-bit codes (int8 arrays,
                or uint8 holding fp8) from quantize_kv, with k_scale and v_scale float32
                [B, Hkv, Sk] (each key's row scale); q float32, float16 (or dtype='bf16').

Returns out (or (out, lse) with return_lse). Raises simdattn.Error naming the argument
on invalid input, before anything is written.)doc");

  m.def("quantize_kv", &quantize_kv_py, py::arg("x"), py::arg("dtype"),
        R"doc(8-bit K/V codes of x [..., D] (float32, float64 or float16; float64 rounded to float32):
returns (codes [..., D], scales [...] float32), one scale per row of D values.

  int8      s = max|x| / 127;   code = clamp(round_half_even(x / s), -127, 127)    (int8 array)
  fp8_e4m3  s = max|x| / 448;   code = x / s to nearest even in OCP E4M3FN, saturating (uint8)
  fp8_e5m2  s = max|x| / 57344; code = x / s to nearest even in OCP E5M2, saturating (uint8)

Each division is one float32 division; a row of zeros has s = 0 and codes 0. A row with a NaN
or an infinity raises simdattn.Error naming it.)doc");
  m.def("dequantize_kv", &dequantize_kv_py, py::arg("codes"), py::arg("scales"), py::arg("dtype"),
        "decode(codes) * scales as float32 (codes [..., D] from quantize_kv, scales [...]).");

  m.def("gated_delta_rule", &gated_delta_rule_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"),
        py::kw_only(), py::arg("scale") = py::none(), py::arg("initial_state") = py::none(),
        py::arg("output_final_state") = false, py::arg("use_qk_l2norm") = false, py::arg("threads") = 0,
        py::arg("out") = py::none(),
        R"doc(The gated delta rule (Gated DeltaNet; flash-linear-attention's chunk_gated_delta_rule layout).

  q, k [B, T, H, Dk]; v [B, T, Hv, Dv] (Hv a multiple of H); g, beta [B, T, Hv] (g <= 0);
  initial_state [B, Hv, Dk, Dv] float32 (None: zeros). Per batch and value head h (query/key head
  h // (Hv // H)), for t = 0 .. T-1: q_t, k_t L2-normalized with use_qk_l2norm (+1e-6 inside the
  sqrt), q_t *= scale (default Dk^-0.5); S = exp(g_t) S; u = beta_t (v_t - S^T k_t);
  S = S + k_t u^T; out_t = S^T q_t.
Returns out [B, T, Hv, Dv] (q's dtype; float32 for NumPy bf16), or (out, final_state) with
output_final_state. float32 (bf16 and f16 q/k/v computed in float32).)doc");

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
    d["backends"] = r.backends, d["onednn_version"] = r.onednn_version, d["thread_runtime"] = r.thread_runtime;
    return d;
  }, "What this build and machine offer: version, the ISA the kernels use, backends, threads (a dict).");

  m.def("set_thread_budget", &set_thread_budget, py::arg("threads"),
        "The most threads all concurrent calls of the library use together (0: the CPUs of the process).");

  m.def("set_thread_runtime", [](const std::string& runtime) {
    if (runtime == "team") set_thread_runtime(ThreadRuntime::team);
    else if (runtime == "openmp") set_thread_runtime(ThreadRuntime::openmp);
    else throw Error("runtime", "expected 'team' or 'openmp', got '" + runtime + "'");
  }, py::arg("runtime"),
        "The threads every parallel loop runs on, process-wide: 'team' (simdattn's own workers) or 'openmp'\n"
        "(OpenMP regions: the host's pool inside an OpenMP program such as PyTorch). Results are identical.");
  m.def("_set_default_thread_runtime", [](const std::string& runtime) {
    if (runtime != "team" && runtime != "openmp") throw Error("runtime", "expected 'team' or 'openmp', got '" + runtime + "'");
    set_default_thread_runtime(runtime == "openmp" ? ThreadRuntime::openmp : ThreadRuntime::team);
  }, py::arg("runtime"), "The runtime while none was chosen (set_thread_runtime, SIMDATTN_THREAD_RUNTIME).");
  m.def("thread_runtime", [] { return std::string(thread_runtime_name(thread_runtime())); },
        "The thread runtime in use: 'team' or 'openmp' (set_thread_runtime, SIMDATTN_THREAD_RUNTIME).");

  m.def("standard_alibi_slopes", [](std::int64_t heads) {
    const std::vector<float> s = standard_alibi_slopes(heads);
    py::array_t<float> a(static_cast<py::ssize_t>(s.size()));
    std::copy(s.begin(), s.end(), a.mutable_data());
    return a;
  }, py::arg("heads"), "ALiBi's usual slopes for `heads` heads (as BLOOM and MPT build them), float32.");

  m.def("_time_attention_cpp", &time_attention_cpp, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("reps"), py::arg("threads") = 0,
        "Seconds of each of `reps` attention() calls made from C++ (the calling-overhead baseline).");
}

}  // namespace simdattn::python
