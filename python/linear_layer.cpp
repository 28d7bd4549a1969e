// The Python module's GatedDeltaNet and GatedDeltaNetState classes (module.cpp binds them).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convert.hpp"
#include "module.hpp"
#include "simdattn/simdattn.hpp"

namespace simdattn::python {
namespace {

py::object gdn_forward_py(const GatedDeltaNet& layer, const py::object& x_in, GatedDeltaNetState* state, int threads,
                          const py::object& out) {
  const DType t = layer.dtype();
  const GatedDeltaNetConfig& c = layer.config();
  const Array x = array_of(x_in, "x");
  if (t == DType::f16 && x.dtype != t)
    throw Error("x", "expected the layer's dtype f16, got " + x.dtype_text());
  // bf16 layers take float arrays (rounded once) and return float32, as MultiHeadAttention does
  const SeqInput q = seq_input(x, t, "x");
  const std::int64_t B = q.view.B, S = q.view.S;
  const Output result = output_of(out, x, layer_output_dtype(t, x), t, {B, S, c.hidden_size}, true);
  SeqView ov;
  ov.data = result.view.data, ov.dtype = t, ov.B = B, ov.S = S, ov.E = c.hidden_size;
  {
    py::gil_scoped_release release;
    layer.forward(q.view, ov, state, threads);
    result.finish();
  }
  return result.object;
}

// A copy of a state view as a NumPy array (float32; a bf16 / f16 window widened).
py::array state_array(const ConstTensorView& v, std::vector<std::int64_t> shape) {
  py::array_t<float> a(shape);
  float* dst = a.mutable_data();
  const std::int64_t n = v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3];  // (contiguous)
  for (std::int64_t i = 0; i < n; ++i) {
    if (v.dtype == DType::bf16) dst[i] = to_float(static_cast<const bfloat16*>(v.data)[i]);
    else if (v.dtype == DType::f16) dst[i] = to_float(static_cast<const float16*>(v.data)[i]);
    else dst[i] = static_cast<const float*>(v.data)[i];
  }
  return a;
}

}  // namespace

void bind_linear_layer(py::module_& m) {
  py::class_<GatedDeltaNet>(m, "GatedDeltaNet", R"doc(Qwen3-Next's linear-attention layer (transformers' Qwen3NextGatedDeltaNet).

  q|k|v|z|b|a = x W^T; q|k|v = SiLU(causal depthwise conv); beta = sigmoid(b);
  g = -exp(A_log) softplus(a + dt_bias); o = gated_delta_rule(q, k, v, g, beta, use_qk_l2norm);
  y = (norm_weight * RMSNorm(o) * SiLU(z)) W_out^T
Immutable; forward() may run from many threads at once (each with its own state).)doc")
      .def_static("from_pretrained",
                  [](const py::object& model_dir, std::int64_t layer_index, const py::object& dtype) {
                    return GatedDeltaNet::from_pretrained(path_arg(model_dir, "model_dir"), layer_index,
                                                          optional_dtype(dtype, "dtype"));
                  },
                  py::arg("model_dir"), py::arg("layer_index"), py::arg("dtype") = py::none(),
                  "Linear-attention layer `layer_index` of a qwen3_next model directory (a str or os.PathLike;\n"
                  "layer_types[layer_index] == 'linear_attention'). dtype: None (the checkpoint's; f64 taken as\n"
                  "f32), 'f32', 'bf16' or 'f16'.")
      .def_static("from_pretrained",  // (the earlier keyword names: dir, layer)
                  [](const py::object& dir, std::int64_t layer, const py::object& dtype) {
                    return GatedDeltaNet::from_pretrained(path_arg(dir, "dir"), layer, optional_dtype(dtype, "dtype"));
                  },
                  py::kw_only(), py::arg("dir"), py::arg("layer"), py::arg("dtype") = py::none())
      .def("forward", &gdn_forward_py, py::arg("x"), py::kw_only(), py::arg("state") = nullptr, py::arg("threads") = 0,
           py::arg("out") = py::none(),
           R"doc(The layer on x [B, S, hidden] (the layer's dtype; a bf16 layer takes float arrays and returns
float32). state: a GatedDeltaNetState of batch B to continue from and update (None: from an
empty state, nothing kept). out: a C-contiguous array to write. Returns out.)doc")
      .def_property_readonly("hidden_size", [](const GatedDeltaNet& l) { return l.config().hidden_size; })
      .def_property_readonly("key_heads", [](const GatedDeltaNet& l) { return l.config().key_heads; })
      .def_property_readonly("value_heads", [](const GatedDeltaNet& l) { return l.config().value_heads; })
      .def_property_readonly("key_head_dim", [](const GatedDeltaNet& l) { return l.config().key_head_dim; })
      .def_property_readonly("value_head_dim", [](const GatedDeltaNet& l) { return l.config().value_head_dim; })
      .def_property_readonly("conv_kernel", [](const GatedDeltaNet& l) { return l.config().conv_kernel; })
      .def_property_readonly("dtype", [](const GatedDeltaNet& l) { return std::string(dtype_name(l.dtype())); });

  py::class_<GatedDeltaNetState>(m, "GatedDeltaNetState",
                                 "The conv window and recurrent state of `batch` sequences through one GatedDeltaNet.")
      .def(py::init<const GatedDeltaNet&, std::int64_t>(), py::arg("layer"), py::arg("batch"))
      .def("reset", &GatedDeltaNetState::reset, "Back to the empty state (zeros, no tokens).")
      .def_property_readonly("batch", &GatedDeltaNetState::batch)
      .def_property_readonly("tokens", &GatedDeltaNetState::tokens, "Tokens seen since construction or reset().")
      .def_property_readonly("bytes", &GatedDeltaNetState::bytes,
                             "The recurrent state's and the conv window's bytes: B (Hv Dk Dv x 4 + (K - 1) conv_dim x the dtype's size)")
      .def_property_readonly("recurrent",
                             [](const GatedDeltaNetState& s) {
                               const ConstTensorView v = s.recurrent();
                               return state_array(v, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
                             },
                             "A copy of the recurrent state [B, Hv, Dk, Dv] (float32).")
      .def_property_readonly("conv_window",
                             [](const GatedDeltaNetState& s) {
                               const ConstTensorView v = s.conv_window();
                               return state_array(v, {v.shape[0], v.shape[2], v.shape[3]});
                             },
                             "A copy of the conv window [B, K - 1, conv_dim] (the last K - 1 pre-conv inputs, float32).");
}

}  // namespace simdattn::python
