// `simdattn mha`: a multi-head attention layer from safetensors weights on .npy inputs
// (docs/design.md's command-line contract).
#include <memory>
#include <span>
#include <string>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct MhaArgs {
  std::string weights, heads, kv_heads, query, key, value, out, causal = "none", key_padding_mask, prefix,
      backend = "native", threads, dtype;
};

// The input files and the views into them (key and value empty for self-attention).
struct MhaInputs {
  NpyArray x, kx, vx, pad;
  ConstSeqView query, key, value;
};

// A [B, S, E] input (<f2, <f4 or <f8), checked.
void check_seq(const std::string& flag, const std::string& path, const NpyArray& a) {
  check_float_array(flag, path, a, 3, " [B, S, E]", true);
}

// The view of a [B, S, E] input already in the layer's dtype.
ConstSeqView seq(const NpyArray& a) {
  ConstSeqView v;
  v.data = a.data.data();
  v.dtype = a.dtype;
  v.B = a.shape[0], v.S = a.shape[1], v.E = a.shape[2];
  return v;
}

// Every file but the weights and the query (in.x, read and checked first): both cross-attention
// files are read before either is checked. The inputs are converted to `dtype` (rounded to
// nearest even if narrower).
void load_inputs(const MhaArgs& a, DType dtype, MhaInputs& in, MhaOptions& opt) {
  in.x = converted(in.x, dtype);
  in.query = seq(in.x);
  if (!a.key.empty()) {
    in.kx = load_npy("--key", a.key);
    in.vx = load_npy("--value", a.value);
    check_seq("--key", a.key, in.kx);
    check_seq("--value", a.value, in.vx);
    in.kx = converted(in.kx, dtype);
    in.vx = converted(in.vx, dtype);
    in.key = seq(in.kx);
    in.value = seq(in.vx);
  }
  if (a.key_padding_mask.empty()) return;
  in.pad = load_bool_npy("--key-padding-mask", a.key_padding_mask);
  const std::int64_t B = in.query.B, Sk = a.key.empty() ? in.query.S : in.key.S;
  if (in.pad.shape.size() != 2 || in.pad.shape[0] != B || in.pad.shape[1] != Sk)
    throw UsageError("--key-padding-mask " + a.key_padding_mask + ": expected shape (" + std::to_string(B) +
                     ", " + std::to_string(Sk) + ") ([B, Sk], true = padding)");
  opt.key_padding_mask =
      std::span<const std::uint8_t>(in.pad.as<std::uint8_t>(), static_cast<std::size_t>(in.pad.numel()));
}

// The layer; errors about the file or its tensors name --weights.
std::unique_ptr<MultiHeadAttention> load_layer(const MhaArgs& a, std::int64_t heads, std::int64_t kv_heads,
                                               DType dtype) {
  try {
    return std::make_unique<MultiHeadAttention>(
        MultiHeadAttention::from_safetensors(a.weights, heads, kv_heads, a.prefix, dtype));
  } catch (const Error& e) {
    if (e.argument() == a.weights) throw UsageError("--weights " + std::string(e.what()));
    if (e.argument().rfind("weights.", 0) == 0 || e.argument() == "config.d_model" ||
        e.argument() == "config.kdim" || e.argument() == "config.vdim" || e.argument() == "config.head_dim")
      throw UsageError("--weights " + a.weights + ": " + std::string(e.what()));
    throw usage_error(e);
  }
}

// The dtype the layer computes in: --dtype; else bf16 for a checkpoint whose query weight is
// BF16 (NumPy has no bf16 for the query); else the query file's.
DType compute_dtype(const MhaArgs& a, DType query_dtype) {
  if (!a.dtype.empty()) return parse_dtype("--dtype", a.dtype);
  try {
    const SafetensorsFile f(a.weights);
    for (const char* name : {"q_proj.weight", "in_proj_weight", "q_proj_weight"}) {
      const auto it = f.tensors().find(a.prefix + name);
      if (it != f.tensors().end()) return it->second.dtype == "BF16" ? DType::bf16 : query_dtype;
    }
  } catch (const Error&) {
    // the layer's loading names the file's problem
  }
  return query_dtype;
}

void run(const MhaArgs& a) {
  MhaOptions opt;
  opt.causal = parse_causal("--causal", a.causal);
  opt.backend = parse_backend("--backend", a.backend);
  const std::int64_t heads = parse_int("--heads", a.heads, 1, std::int64_t{1} << 20);
  const std::int64_t kv_heads = a.kv_heads.empty() ? 0 : parse_int("--kv-heads", a.kv_heads, 1, std::int64_t{1} << 20);
  if (!a.threads.empty()) opt.threads = parse_threads(a.threads);
  if (a.key.empty() != a.value.empty())
    throw UsageError(std::string(a.key.empty() ? "--value" : "--key") +
                     ": cross-attention needs both --key and --value");

  MhaInputs in;
  in.x = load_npy("--query", a.query);
  check_seq("--query", a.query, in.x);
  const DType written = in.x.dtype;  // the output's .npy dtype: the query file's
  const DType dtype = compute_dtype(a, written);
  load_inputs(a, dtype, in, opt);
  const ConstSeqView& query = in.query;
  const std::unique_ptr<MultiHeadAttention> layer = load_layer(a, heads, kv_heads, dtype);
  const std::int64_t d = layer->config().d_model;
  if (query.E != d)  // before the output [B, Sq, d_model] is allocated
    throw UsageError("--query " + a.query + ": expected [B, Sq, d_model=" + std::to_string(d) + "] for these weights, got [" +
                     dims_text({query.B, query.S, query.E}) + "]");
  auto compute = [&](void* y) {
    SeqView out;
    out.data = y;
    out.dtype = dtype;
    out.B = query.B, out.S = query.S, out.E = d;
    if (a.key.empty()) layer->forward(query, out, opt);
    else layer->forward(query, in.key, in.value, out, opt);
  };
  if (dtype == written) {
    write_output(a.out, written, {query.B, query.S, d}, compute);
    return;
  }
  NpyArray y = make_output(dtype, {query.B, query.S, d});
  with_flag_errors([&] { compute(y.data.data()); });
  save_output(a.out, converted(y, written));
}

void add_options(CLI::App& sub, MhaArgs& a) {
  sub.add_option("--weights", a.weights, "layer weights (.safetensors; torch or Hugging Face names)")->required();
  sub.add_option("--heads", a.heads, "query heads")->required();
  sub.add_option("--kv-heads", a.kv_heads, "key/value heads (default: from the weights' shapes)");
  sub.add_option("--query", a.query, "X [B, Sq, d_model] (.npy, <f2, <f4 or <f8)")->required();
  sub.add_option("--key", a.key, "cross-attention keys [B, Sk, kdim]");
  sub.add_option("--value", a.value, "cross-attention values [B, Sk, vdim]");
  sub.add_option("--out", a.out, "output Y [B, Sq, d_model] (.npy, the query's dtype)")->required();
  sub.add_option("--causal", a.causal, "none | top-left | bottom-right (default none)");
  sub.add_option("--key-padding-mask", a.key_padding_mask, "[B, Sk] bool/uint8, true = padding (ignored)");
  sub.add_option("--prefix", a.prefix, "name prefix of the layer in the file, e.g. model.layers.3.self_attn.");
  sub.add_option("--dtype", a.dtype,
                 "f32 | f64 | bf16 | f16: the layer's dtype; weights and inputs are rounded to it (default: bf16 "
                 "for a BF16 checkpoint, else the query's .npy dtype); the output is written in the query's .npy "
                 "dtype");
  add_backend_threads_options(sub, a.backend, a.threads,
                              "reference | native | onednn: the attention core (default native)");
}

}  // namespace

Command add_mha_command(CLI::App& app) {
  return add_command<MhaArgs>(app, "mha", "A multi-head attention layer from safetensors weights on .npy inputs",
                              add_options, run);
}

}  // namespace simdattn::cli
