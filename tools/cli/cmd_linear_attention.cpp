// `simdattn linear`: linear attention on .npy files, with the run command's I/O and error
// conventions: the kernel feature maps (--rule kernel, the default), and the gated delta rule
// (--rule gated-delta) on q, k, v, g, beta files or through a qwen3_next model's GatedDeltaNet
// layer (--model DIR --layer N --x X.npy).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct LinearArgs {
  std::string q, k, v, out, feature_map = "elu1", backend = "native", threads, dtype;
  bool causal = false;
  // --rule gated-delta
  std::string rule = "kernel", g, beta, initial_state, final_state, scale, model, layer, x;
  bool qk_l2norm = false;
};

// An f32 copy of a float array (f16 / bf16 / f64 files widened or rounded once).
NpyArray as_f32(const NpyArray& a) { return a.dtype == DType::f32 ? a : converted(a, DType::f32); }

// --rule gated-delta on files: q, k [B, T, H, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv]; computed
// in f32 (f16 inputs as f16); out in q's file dtype; --final-state [B, Hv, Dk, Dv] f32.
void run_gated_delta_files(const LinearArgs& a) {
  for (const auto& [flag, v] : {std::pair{"--q", &a.q}, std::pair{"--k", &a.k}, std::pair{"--v", &a.v},
                                std::pair{"--g", &a.g}, std::pair{"--beta", &a.beta}})
    if (v->empty()) throw UsageError(std::string(flag) + ": --rule gated-delta needs --q, --k, --v, --g and --beta (or --model)");
  NpyArray q = load_npy("--q", a.q), k = load_npy("--k", a.k), v = load_npy("--v", a.v);
  const DType file_dtype = q.dtype;
  check_float_array("--q", a.q, q, 4, " [B, T, H, Dk]", true);
  check_float_array("--k", a.k, k, 4, " [B, T, H, Dk]", true);
  check_float_array("--v", a.v, v, 4, " [B, T, Hv, Dv]", true);
  const DType t = q.dtype == DType::f16 && k.dtype == DType::f16 && v.dtype == DType::f16 ? DType::f16 : DType::f32;
  if (t == DType::f32) q = as_f32(q), k = as_f32(k), v = as_f32(v);
  NpyArray g = as_f32(load_npy("--g", a.g)), beta = as_f32(load_npy("--beta", a.beta));
  check_float_array("--g", a.g, g, 3, " [B, T, Hv]", true);
  check_float_array("--beta", a.beta, beta, 3, " [B, T, Hv]", true);
  auto view4 = [](const NpyArray& n) {
    return ConstTensorView(n.data.data(), n.dtype, Shape4{n.shape[0], n.shape[1], n.shape[2], n.shape[3]});
  };
  auto view3 = [](const NpyArray& n) {
    return ConstTensorView(n.data.data(), n.dtype, Shape4{n.shape[0], n.shape[1], n.shape[2], 1});
  };
  GatedDeltaRuleOptions o;
  o.use_qk_l2norm = a.qk_l2norm;
  if (!a.scale.empty()) o.scale = parse_double("--scale", a.scale);
  if (!a.threads.empty()) o.threads = parse_threads(a.threads);
  NpyArray s0;
  if (!a.initial_state.empty()) {
    s0 = as_f32(load_npy("--initial-state", a.initial_state));
    check_float_array("--initial-state", a.initial_state, s0, 4, " [B, Hv, Dk, Dv]");
    o.initial_state = view4(s0);
  }
  const std::vector<std::int64_t> out_shape = {q.shape[0], q.shape[1], v.shape[2], v.shape[3]};
  NpyArray out = make_output(t, out_shape);
  NpyArray fin;
  if (!a.final_state.empty()) {
    fin = make_output(DType::f32, {q.shape[0], v.shape[2], q.shape[3], v.shape[3]});
    o.final_state = TensorView(fin.data.data(), DType::f32, Shape4{fin.shape[0], fin.shape[1], fin.shape[2], fin.shape[3]});
  }
  with_flag_errors([&] {
    gated_delta_rule(view4(q), view4(k), view4(v), view3(g), view3(beta),
                     TensorView(out.data.data(), t, Shape4{out_shape[0], out_shape[1], out_shape[2], out_shape[3]}), o);
  });
  save_output(a.out, file_dtype == t ? out : converted(out, file_dtype));
  if (!a.final_state.empty()) save_output(a.final_state, fin);
}

// --rule gated-delta --model DIR --layer N --x X.npy: the layer on x [B, S, hidden] from an
// empty state, in the layer's dtype (--dtype, else the checkpoint's); out in x's file dtype.
void run_gated_delta_layer(const LinearArgs& a) {
  if (a.layer.empty()) throw UsageError("--layer: --model needs the layer (0-based)");
  if (a.x.empty()) throw UsageError("--x: --model needs the layer's input [B, S, hidden] (.npy)");
  for (const auto& [flag, v] : {std::pair{"--q", &a.q}, std::pair{"--k", &a.k}, std::pair{"--v", &a.v},
                                std::pair{"--g", &a.g}, std::pair{"--beta", &a.beta},
                                std::pair{"--initial-state", &a.initial_state}, std::pair{"--final-state", &a.final_state},
                                std::pair{"--scale", &a.scale}})
    if (!v->empty()) throw UsageError(std::string(flag) + ": goes with the files' form, not --model");
  const std::int64_t layer_index = parse_int("--layer", a.layer, 0, std::int64_t{1} << 30);
  std::optional<DType> dtype;
  if (!a.dtype.empty()) dtype = parse_dtype("--dtype", a.dtype);
  const GatedDeltaNet layer = with_flag_errors([&] { return GatedDeltaNet::from_pretrained(a.model, layer_index, dtype); });
  const NpyArray x = load_npy("--x", a.x);
  check_float_array("--x", a.x, x, 3, " [B, S, hidden]", true);
  const std::int64_t d = layer.config().hidden_size;
  if (x.shape[2] != d)
    throw UsageError("--x " + a.x + ": expected [B, S, hidden=" + std::to_string(d) + "], got [" + dims_text(x.shape) + "]");
  const NpyArray xt = x.dtype == layer.dtype() ? x : converted(x, layer.dtype());
  NpyArray y = make_output(layer.dtype(), x.shape);
  ConstSeqView xv;
  xv.data = xt.data.data(), xv.dtype = layer.dtype(), xv.B = x.shape[0], xv.S = x.shape[1], xv.E = d;
  SeqView yv;
  yv.data = y.data.data(), yv.dtype = layer.dtype(), yv.B = x.shape[0], yv.S = x.shape[1], yv.E = d;
  const int threads = a.threads.empty() ? 0 : parse_threads(a.threads);
  with_flag_errors([&] { layer.forward(xv, yv, nullptr, threads); });
  save_output(a.out, y.dtype == x.dtype ? y : converted(y, x.dtype));
}

FeatureMap parse_feature_map(const std::string& text) {
  if (text == "elu1") return FeatureMap::elu1;
  if (text == "relu") return FeatureMap::relu;
  if (text == "identity") return FeatureMap::identity;
  throw UsageError("--feature-map: expected elu1, relu or identity, got '" + text + "'");
}

void run(const LinearArgs& a) {
  if (a.rule != "kernel" && a.rule != "gated-delta")
    throw UsageError("--rule: expected kernel or gated-delta, got '" + a.rule + "'");
  if (a.rule == "gated-delta") {
    if (a.causal || a.feature_map != "elu1" || a.backend != "native")
      throw UsageError(std::string(a.causal ? "--causal" : a.feature_map != "elu1" ? "--feature-map" : "--backend") +
                       ": goes with --rule kernel (the gated delta rule is causal, on the native kernels)");
    return a.model.empty() ? run_gated_delta_files(a) : run_gated_delta_layer(a);
  }
  for (const auto& [flag, v] : {std::pair{"--g", &a.g}, std::pair{"--beta", &a.beta}, std::pair{"--model", &a.model},
                                std::pair{"--x", &a.x}, std::pair{"--initial-state", &a.initial_state},
                                std::pair{"--final-state", &a.final_state}})
    if (!v->empty()) throw UsageError(std::string(flag) + ": goes with --rule gated-delta");
  for (const auto& [flag, v] : {std::pair{"--q", &a.q}, std::pair{"--k", &a.k}, std::pair{"--v", &a.v}})
    if (v->empty()) throw UsageError(std::string(flag) + ": linear attention needs --q, --k and --v");
  LinearAttentionOptions opt;
  opt.causal = a.causal;
  opt.feature_map = parse_feature_map(a.feature_map);
  opt.backend = parse_backend("--backend", a.backend);
  if (opt.backend == Backend::onednn)
    throw UsageError("--backend: linear attention runs on reference or native (oneDNN has no primitive for it)");
  if (!a.threads.empty()) opt.threads = parse_threads(a.threads);

  const DtypeChoice dtype = parse_dtype_option(a.dtype);
  QkvFiles in = load_qkv(a.q, a.k, a.v, true);
  compute_in_dtype(a.out, dtype, in, [&](const QkvFiles& x, void* o) {
    linear_attention(x.q_view(), x.k_view(), x.v_view(), x.o_view(o), opt);
  });
}

void add_options(CLI::App& sub, LinearArgs& a) {
  sub.add_option("--rule", a.rule, "kernel (feature maps, the default) | gated-delta (Gated DeltaNet's rule)");
  sub.add_option("--q", a.q, "Q [B, H, Sq, D] (.npy, <f4 or <f8); gated-delta: [B, T, H, Dk]");
  sub.add_option("--k", a.k, "K [B, Hkv, Sk, D], same dtype as Q; gated-delta: [B, T, H, Dk]");
  sub.add_option("--v", a.v, "V [B, Hkv, Sk, Dv], same dtype as Q; gated-delta: [B, T, Hv, Dv]");
  sub.add_option("--out", a.out, "output (.npy, Q's or X's dtype)")->required();
  sub.add_flag("--causal", a.causal, "each query attends to keys j <= i (needs Sq == Sk)");
  sub.add_option("--feature-map", a.feature_map, "elu1 | relu | identity (default elu1)");
  sub.add_option("--g", a.g, "gated-delta: the log decays g [B, T, Hv] (<= 0)");
  sub.add_option("--beta", a.beta, "gated-delta: beta [B, T, Hv]");
  sub.add_option("--initial-state", a.initial_state, "gated-delta: the state in [B, Hv, Dk, Dv] (default zeros)");
  sub.add_option("--final-state", a.final_state, "gated-delta: write the final state [B, Hv, Dk, Dv] (.npy, f32)");
  sub.add_option("--scale", a.scale, "gated-delta: the query scale (default Dk^-1/2)");
  sub.add_flag("--qk-l2norm", a.qk_l2norm, "gated-delta: q and k divided by their L2 norms first");
  sub.add_option("--model", a.model, "gated-delta: a qwen3_next model directory (with --layer and --x)");
  sub.add_option("--layer", a.layer, "gated-delta: the linear-attention layer of --model (0-based)");
  sub.add_option("--x", a.x, "gated-delta: the layer's input [B, S, hidden] (.npy)");
  add_dtype_option(sub, a.dtype);
  add_backend_threads_options(sub, a.backend, a.threads, "reference | native (default native)");
}

}  // namespace

Command add_linear_command(CLI::App& app) {
  return add_command<LinearArgs>(app, "linear", "Linear attention on .npy files: kernel feature maps, or the gated delta rule (files or a qwen3_next layer)",
                                 add_options, run);
}

}  // namespace simdattn::cli
