// `simdattn mha`: a multi-head attention layer from safetensors weights on .npy inputs
// (docs/design.md's command-line contract).
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct MhaArgs {
  std::string weights, heads, kv_heads, query, key, value, out, causal = "none", key_padding_mask, prefix,
      backend = "native", threads;
};

// A [B, S, E] input of the layer's dtype.
ConstSeqView seq(const std::string& flag, const std::string& path, const NpyArray& a) {
  if (a.dtype != DType::f32 && a.dtype != DType::f64)
    throw UsageError(flag + " " + path + ": expected dtype <f4 or <f8, got " + a.descr());
  if (a.shape.size() != 3) {
    std::string s = "(";
    for (std::size_t i = 0; i < a.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(a.shape[i]);
    throw UsageError(flag + " " + path + ": expected a 3-D array [B, S, E], got shape " + s + ")");
  }
  ConstSeqView v;
  v.data = a.data.data();
  v.dtype = a.dtype;
  v.B = a.shape[0], v.S = a.shape[1], v.E = a.shape[2];
  return v;
}

void run(const MhaArgs& a) {
  MhaOptions opt;
  opt.causal = parse_causal("--causal", a.causal);
  opt.backend = parse_backend("--backend", a.backend);
  const std::int64_t heads = parse_int("--heads", a.heads, 1, std::int64_t{1} << 20);
  const std::int64_t kv_heads = a.kv_heads.empty() ? 0 : parse_int("--kv-heads", a.kv_heads, 1, std::int64_t{1} << 20);
  if (!a.threads.empty()) opt.threads = static_cast<int>(parse_int("--threads", a.threads, 1, 4096));
  if (a.key.empty() != a.value.empty())
    throw UsageError(std::string(a.key.empty() ? "--value" : "--key") +
                     ": cross-attention needs both --key and --value");

  const NpyArray x = load_npy("--query", a.query);
  const ConstSeqView query = seq("--query", a.query, x);
  NpyArray kx, vx;
  ConstSeqView key, value;
  if (!a.key.empty()) {
    kx = load_npy("--key", a.key);
    vx = load_npy("--value", a.value);
    key = seq("--key", a.key, kx);
    value = seq("--value", a.value, vx);
  }
  NpyArray pad;
  if (!a.key_padding_mask.empty()) {
    pad = load_npy("--key-padding-mask", a.key_padding_mask);
    if (pad.dtype != DType::u8)
      throw UsageError("--key-padding-mask " + a.key_padding_mask + ": expected dtype |b1 or |u1, got " +
                       pad.descr());
    const std::int64_t Sk = a.key.empty() ? query.S : key.S;
    if (pad.shape.size() != 2 || pad.shape[0] != query.B || pad.shape[1] != Sk)
      throw UsageError("--key-padding-mask " + a.key_padding_mask + ": expected shape (" + std::to_string(query.B) +
                       ", " + std::to_string(Sk) + ") ([B, Sk], true = padding)");
    opt.key_padding_mask = std::span<const std::uint8_t>(pad.as<std::uint8_t>(), static_cast<std::size_t>(pad.numel()));
  }

  std::unique_ptr<MultiHeadAttention> layer;
  try {
    layer = std::make_unique<MultiHeadAttention>(
        MultiHeadAttention::from_safetensors(a.weights, heads, kv_heads, a.prefix, query.dtype));
  } catch (const Error& e) {
    if (e.argument() == a.weights) throw UsageError("--weights " + std::string(e.what()));
    if (e.argument().rfind("weights.", 0) == 0 || e.argument() == "config.d_model" ||
        e.argument() == "config.kdim" || e.argument() == "config.vdim" || e.argument() == "config.head_dim")
      throw UsageError("--weights " + a.weights + ": " + std::string(e.what()));
    throw usage_error(e);
  }
  const std::int64_t d = layer->config().d_model;
  if (query.E != d)  // before the output [B, Sq, d_model] is allocated
    throw UsageError("--query " + a.query + ": expected [B, Sq, d_model=" + std::to_string(d) + "] for these weights, got [" +
                     std::to_string(query.B) + ", " + std::to_string(query.S) + ", " + std::to_string(query.E) + "]");
  NpyArray y = make_output(query.dtype, {query.B, query.S, d});
  SeqView out;
  out.data = y.data.data();
  out.dtype = y.dtype;
  out.B = query.B, out.S = query.S, out.E = d;
  try {
    if (a.key.empty()) layer->forward(query, out, opt);
    else layer->forward(query, key, value, out, opt);
  } catch (const Error& e) {
    throw usage_error(e);
  }
  save_output(a.out, y);
}

}  // namespace

Command add_mha_command(CLI::App& app) {
  auto args = std::make_shared<MhaArgs>();
  CLI::App* sub = app.add_subcommand("mha", "A multi-head attention layer from safetensors weights on .npy inputs");
  sub->add_option("--weights", args->weights, "layer weights (.safetensors; torch or Hugging Face names)")->required();
  sub->add_option("--heads", args->heads, "query heads")->required();
  sub->add_option("--kv-heads", args->kv_heads, "key/value heads (default: from the weights' shapes)");
  sub->add_option("--query", args->query, "X [B, Sq, d_model] (.npy, <f4 or <f8)")->required();
  sub->add_option("--key", args->key, "cross-attention keys [B, Sk, kdim]");
  sub->add_option("--value", args->value, "cross-attention values [B, Sk, vdim]");
  sub->add_option("--out", args->out, "output Y [B, Sq, d_model] (.npy, the query's dtype)")->required();
  sub->add_option("--causal", args->causal, "none | top-left | bottom-right (default none)");
  sub->add_option("--key-padding-mask", args->key_padding_mask, "[B, Sk] bool/uint8, true = padding (ignored)");
  sub->add_option("--prefix", args->prefix, "name prefix of the layer in the file, e.g. model.layers.3.self_attn.");
  sub->add_option("--backend", args->backend, "reference | native | onednn: the attention core (default native)");
  sub->add_option("--threads", args->threads, "threads (>= 1; default: OpenMP's)");
  return [args, sub] {
    if (*sub) run(*args);
  };
}

}  // namespace simdattn::cli
