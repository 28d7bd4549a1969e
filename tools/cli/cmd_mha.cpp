// `simdattn mha`: a multi-head attention layer from safetensors weights on .npy inputs
// (docs/cli.md's command-line contract).
#include <memory>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "score_options.hpp"

namespace simdattn::cli {
namespace {

// The score options (--causal, --window, --softcap, --scale, --alibi, --sinks) are ScoreArgs'.
struct MhaArgs : ScoreArgs {
  std::string weights, heads, kv_heads, query, key, value, out, key_padding_mask, prefix, backend = "native",
      threads, dtype;
  // a published checkpoint's layer: --model DIR --layer N, --gguf FILE --layer N, or --weights W
  // --family diffusers
  std::string model, gguf, layer, stack, attention, family;
  // the layer's position options
  std::string rope_theta, rotary_dim, rope_style, rope_scaling, rope_factor, rope_low_freq_factor,
      rope_high_freq_factor, rope_original_max_positions, positions;
};

// The layer options given by hand (their flags), which a published checkpoint's config sets.
std::vector<std::string> hand_options(const MhaArgs& a) {
  std::vector<std::string> given;
  const std::pair<const char*, const std::string*> flags[] = {
      {"--kv-heads", &a.kv_heads},       {"--rope-theta", &a.rope_theta},   {"--rotary-dim", &a.rotary_dim},
      {"--rope-style", &a.rope_style},   {"--rope-scaling", &a.rope_scaling}, {"--rope-factor", &a.rope_factor},
      {"--rope-low-freq-factor", &a.rope_low_freq_factor}, {"--rope-high-freq-factor", &a.rope_high_freq_factor},
      {"--rope-original-max-positions", &a.rope_original_max_positions}, {"--window", &a.window},
      {"--softcap", &a.softcap},         {"--scale", &a.scale},             {"--sinks", &a.sinks}};
  for (const auto& [flag, value] : flags)
    if (!value->empty()) given.emplace_back(flag);
  if (a.alibi) given.emplace_back("--alibi");
  return given;
}

// The layer's position and score options (MhaConfig), parsed before any file is read.
MhaConfig layer_options(const MhaArgs& a) {
  MhaConfig c;
  const bool rope_given = !a.rope_theta.empty() || !a.rotary_dim.empty() || !a.rope_style.empty() ||
                          !a.rope_scaling.empty();
  if (!rope_given && (!a.rope_factor.empty() || !a.rope_low_freq_factor.empty() || !a.rope_high_freq_factor.empty() ||
                      !a.rope_original_max_positions.empty()))
    throw UsageError("--rope-factor: the RoPE scaling options need --rope-scaling (or another --rope option)");
  if (rope_given) {
    RopeConfig r;
    if (!a.rope_theta.empty()) r.theta = parse_double("--rope-theta", a.rope_theta);
    if (!a.rotary_dim.empty()) r.rotary_dim = parse_int("--rotary-dim", a.rotary_dim, 0, std::int64_t{1} << 20);
    if (a.rope_style == "interleaved") r.style = RopeStyle::interleaved;
    else if (!a.rope_style.empty() && a.rope_style != "half")
      throw UsageError("--rope-style: expected half or interleaved, got '" + a.rope_style + "'");
    if (a.rope_scaling == "linear") r.scaling = RopeScaling::linear;
    else if (a.rope_scaling == "llama3") r.scaling = RopeScaling::llama3;
    else if (!a.rope_scaling.empty() && a.rope_scaling != "none")
      throw UsageError("--rope-scaling: expected none, linear or llama3, got '" + a.rope_scaling + "'");
    if (!a.rope_factor.empty()) r.factor = parse_double("--rope-factor", a.rope_factor);
    if (!a.rope_low_freq_factor.empty()) r.low_freq_factor = parse_double("--rope-low-freq-factor", a.rope_low_freq_factor);
    if (!a.rope_high_freq_factor.empty())
      r.high_freq_factor = parse_double("--rope-high-freq-factor", a.rope_high_freq_factor);
    if (!a.rope_original_max_positions.empty())
      r.original_max_positions =
          parse_int("--rope-original-max-positions", a.rope_original_max_positions, 1, std::int64_t{1} << 40);
    c.rope = r;
  }
  if (!a.window.empty()) c.window = parse_window("--window", a.window);
  if (!a.softcap.empty()) c.softcap = parse_double("--softcap", a.softcap);
  if (!a.scale.empty()) c.scale = parse_double("--scale", a.scale);
  return c;
}

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
                                               DType dtype, const MhaConfig& options) {
  try {
    return std::make_unique<MultiHeadAttention>(
        MultiHeadAttention::from_safetensors(a.weights, heads, kv_heads, a.prefix, dtype, options));
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

// --positions into opt (kept alive by `positions`).
void read_positions(const MhaArgs& a, const MhaInputs& in, MhaOptions& opt, std::vector<std::int64_t>& positions) {
  if (a.positions.empty()) return;
  positions = read_ints("--positions", a.positions, {in.query.B, in.query.S}, "a position per query token, [B, Sq]");
  opt.positions = positions;
}

// The layer on the inputs, written to --out in the query file's dtype `written`.
void forward_and_write(const MhaArgs& a, const MultiHeadAttention& layer, const MhaInputs& in, const MhaOptions& opt,
                       DType written) {
  const ConstSeqView& query = in.query;
  const DType dtype = layer.dtype();
  const std::int64_t d = layer.config().d_model;
  if (query.E != d)  // before the output [B, Sq, d_model] is allocated
    throw UsageError("--query " + a.query + ": expected [B, Sq, d_model=" + std::to_string(d) + "] for these weights, got [" +
                     dims_text({query.B, query.S, query.E}) + "]");
  auto compute = [&](void* y) {
    SeqView out;
    out.data = y;
    out.dtype = dtype;
    out.B = query.B, out.S = query.S, out.E = d;
    if (a.key.empty()) layer.forward(query, out, opt);
    else layer.forward(query, in.key, in.value, out, opt);
  };
  if (dtype == written) {
    write_output(a.out, written, {query.B, query.S, d}, compute);
    return;
  }
  NpyArray y = make_output(dtype, {query.B, query.S, d});
  with_flag_errors([&] { compute(y.data.data()); });
  save_output(a.out, converted(y, written));
}

// The call options every form takes.
MhaOptions call_options(const MhaArgs& a) {
  MhaOptions opt;
  opt.causal = parse_causal("--causal", a.causal);
  opt.backend = parse_backend("--backend", a.backend);
  if (!a.threads.empty()) opt.threads = parse_threads(a.threads);
  if (a.key.empty() != a.value.empty())
    throw UsageError(std::string(a.key.empty() ? "--value" : "--key") +
                     ": cross-attention needs both --key and --value");
  return opt;
}

// How the layer is found: by hand (--weights, --heads), a model directory (--model, --layer), a
// GGUF file (--gguf, --layer) or a diffusers block (--weights, --family diffusers, --prefix,
// --heads); the flags each needs and refuses, checked before any file is read.
enum class Source { hand, model, diffusers, gguf };

// The sub-layer a published checkpoint's call runs: --attention; with --family diffusers a
// --prefix whose last component is attn1 or attn2 (the tensor names' spelling) selects it, and
// contradicts --attention only with an error naming both (from_diffusers checks the same).
std::string attention_of(const MhaArgs& a, Source s) {
  std::string_view prefix = a.prefix;
  if (prefix.ends_with('.')) prefix.remove_suffix(1);
  const std::string_view last = prefix.substr(prefix.rfind('.') == std::string_view::npos ? 0 : prefix.rfind('.') + 1);
  if (s != Source::diffusers || (last != "attn1" && last != "attn2")) return a.attention.empty() ? "self" : a.attention;
  const std::string named = last == "attn1" ? "self" : "cross";
  if (!a.attention.empty() && a.attention != named)
    throw UsageError("--attention: " + a.attention + " contradicts --prefix " + a.prefix + ", which names " +
                     std::string(last) + " (" + named + "-attention)");
  return named;
}

// --gguf FILE --layer N: everything else comes from the file; self-attention only.
Source gguf_source(const MhaArgs& a) {
  for (const auto& [flag, v] : {std::pair{"--model", &a.model}, std::pair{"--weights", &a.weights}})
    if (!v->empty()) throw UsageError(std::string(flag) + ": give one of --gguf, --model and --weights");
  if (a.layer.empty()) throw UsageError("--layer: --gguf needs the layer (0-based)");
  for (const auto& [flag, v] : {std::pair{"--heads", &a.heads}, std::pair{"--prefix", &a.prefix},
                                std::pair{"--family", &a.family}})
    if (!v->empty()) throw UsageError(std::string(flag) + ": --gguf takes it from the file's metadata and tensor names");
  if (!a.stack.empty() || !a.attention.empty())
    throw UsageError(std::string(a.stack.empty() ? "--attention" : "--stack") + ": goes with --model or --family diffusers");
  if (!a.key.empty() || !a.value.empty()) throw UsageError("--key: a GGUF file's layer is self-attention (no --key or --value)");
  const std::vector<std::string> given = hand_options(a);
  if (!given.empty()) throw UsageError(given.front() + ": the file's metadata sets the layer's options (not with --gguf)");
  return Source::gguf;
}

Source source_of(const MhaArgs& a) {
  if (!a.gguf.empty()) return gguf_source(a);
  if (!a.model.empty()) {
    if (!a.weights.empty()) throw UsageError("--weights: give --model or --weights, not both");
    if (!a.family.empty()) throw UsageError("--family: --model takes the family from config.json's model_type");
    if (a.layer.empty()) throw UsageError("--layer: --model needs the layer (0-based)");
    for (const auto& [flag, v] : {std::pair{"--heads", &a.heads}, std::pair{"--prefix", &a.prefix}})
      if (!v->empty()) throw UsageError(std::string(flag) + ": --model takes it from config.json and the tensor names");
  } else {
    if (a.weights.empty()) throw UsageError("--weights: give --weights (a layer's safetensors) or --model (a model directory)");
    if (a.heads.empty()) throw UsageError("--heads: --weights needs the number of query heads");
    if (!a.layer.empty()) throw UsageError("--layer: goes with --model or --gguf");
    if (!a.family.empty() && a.family != "diffusers")
      throw UsageError("--family: expected diffusers (other families load with --model), got '" + a.family + "'");
  }
  const Source s = !a.model.empty() ? Source::model : !a.family.empty() ? Source::diffusers : Source::hand;
  if (s == Source::hand && (!a.stack.empty() || !a.attention.empty()))
    throw UsageError(std::string(a.stack.empty() ? "--attention" : "--stack") + ": goes with --model or --family diffusers");
  if (s != Source::hand && (attention_of(a, s) == "cross") != !a.key.empty())
    throw UsageError(a.key.empty() ? "--key: cross-attention needs --key and --value (the encoder's output)"
                                   : "--key: self-attention takes no --key or --value");
  if (s != Source::hand) {
    const std::vector<std::string> given = hand_options(a);
    if (!given.empty())
      throw UsageError(given.front() + ": the checkpoint's configuration sets the layer's options (not with " +
                       (s == Source::model ? "--model)" : "--family)"));
  }
  return s;
}

// Runs `fn` (a call on a published checkpoint), its errors as usage errors: those about its files
// name --model, --gguf or --weights.
template <class Fn>
auto published_errors(const MhaArgs& a, Source s, Fn&& fn) {
  const std::string& flag = s == Source::model ? "--model" : s == Source::gguf ? "--gguf" : "--weights";
  const std::string& where = s == Source::model ? a.model : s == Source::gguf ? a.gguf : a.weights;
  try {
    return fn();
  } catch (const Error& e) {
    const std::string& arg = e.argument();
    if (arg == "layer" || arg == "stack" || arg == "attention" || arg == "heads" || arg == "dtype") throw usage_error(e);
    if (arg.rfind("config.", 0) == 0 || arg.rfind("weights.", 0) == 0)  // the layer the files describe
      throw UsageError(flag + " " + where + ": " + e.what());
    throw UsageError(flag + " " + std::string(e.what()));  // a file: its path leads the message
  }
}

PretrainedOptions published_options(const MhaArgs& a, std::optional<DType> dtype) {
  PretrainedOptions o;
  o.stack = a.stack;
  if (!a.attention.empty()) o.attention = a.attention;
  o.dtype = dtype;
  return o;
}

// The dtype a published checkpoint's layer computes in: --dtype; else the checkpoint's if BF16
// (NumPy has no bf16), else the query file's. From the headers: nothing is loaded twice.
DType published_dtype(const MhaArgs& a, Source s, DType query_dtype) {
  if (!a.dtype.empty()) return parse_dtype("--dtype", a.dtype);
  const PretrainedOptions o = published_options(a, std::nullopt);
  const DType stored = published_errors(a, s, [&] {
    if (s == Source::model)
      return MultiHeadAttention::pretrained_dtype(a.model, parse_int("--layer", a.layer, 0, std::int64_t{1} << 30), o);
    if (s == Source::gguf)
      return MultiHeadAttention::gguf_dtype(a.gguf, parse_int("--layer", a.layer, 0, std::int64_t{1} << 30));
    return MultiHeadAttention::diffusers_dtype(a.weights, a.prefix, parse_int("--heads", a.heads, 1, std::int64_t{1} << 20),
                                               o);
  });
  return stored == DType::bf16 ? DType::bf16 : query_dtype;
}

// A published checkpoint's layer in `dtype`.
std::unique_ptr<MultiHeadAttention> load_published(const MhaArgs& a, Source s, DType dtype) {
  const PretrainedOptions o = published_options(a, dtype);
  return published_errors(a, s, [&] {
    if (s == Source::model)
      return std::make_unique<MultiHeadAttention>(
          MultiHeadAttention::from_pretrained(a.model, parse_int("--layer", a.layer, 0, std::int64_t{1} << 30), o));
    if (s == Source::gguf)
      return std::make_unique<MultiHeadAttention>(
          MultiHeadAttention::from_gguf(a.gguf, parse_int("--layer", a.layer, 0, std::int64_t{1} << 30), dtype));
    return std::make_unique<MultiHeadAttention>(MultiHeadAttention::from_diffusers(
        a.weights, a.prefix, parse_int("--heads", a.heads, 1, std::int64_t{1} << 20), o));
  });
}

// A published checkpoint's layer (--model, --gguf, or --family diffusers) on the inputs, in
// published_dtype's dtype.
void run_published(const MhaArgs& a, Source source) {
  MhaOptions opt = call_options(a);
  MhaInputs in;
  in.x = load_npy("--query", a.query);
  check_seq("--query", a.query, in.x);
  const DType written = in.x.dtype;
  const std::unique_ptr<MultiHeadAttention> layer = load_published(a, source, published_dtype(a, source, written));
  load_inputs(a, layer->dtype(), in, opt);
  std::vector<std::int64_t> positions;
  read_positions(a, in, opt, positions);
  forward_and_write(a, *layer, in, opt, written);
}

void run(const MhaArgs& a) {
  const Source source = source_of(a);
  if (source != Source::hand) return run_published(a, source);
  MhaOptions opt = call_options(a);
  const std::int64_t heads = parse_int("--heads", a.heads, 1, std::int64_t{1} << 20);
  const std::int64_t kv_heads = a.kv_heads.empty() ? 0 : parse_int("--kv-heads", a.kv_heads, 1, std::int64_t{1} << 20);
  MhaConfig options = layer_options(a);

  MhaInputs in;
  in.x = load_npy("--query", a.query);
  check_seq("--query", a.query, in.x);
  const DType written = in.x.dtype;  // the output's .npy dtype: the query file's
  const DType dtype = compute_dtype(a, written);
  load_inputs(a, dtype, in, opt);
  if (a.alibi) options.alibi_slopes = with_flag_errors([&] { return standard_alibi_slopes(heads); });
  if (!a.sinks.empty()) options.sinks = read_floats("--sinks", a.sinks, {heads}, "one sink per head");
  std::vector<std::int64_t> positions;
  read_positions(a, in, opt, positions);
  const std::unique_ptr<MultiHeadAttention> layer = load_layer(a, heads, kv_heads, dtype, options);
  forward_and_write(a, *layer, in, opt, written);
}

void add_options(CLI::App& sub, MhaArgs& a) {
  sub.add_option("--model", a.model,
                 "a Hugging Face model directory (config.json, model.safetensors or its sharded index): one of its "
                 "attention layers, as docs/models.md lists");
  sub.add_option("--gguf", a.gguf,
                 "a llama.cpp GGUF file (llama, mistral, qwen2, qwen3; F32, F16, BF16 or Q8_0): one of its attention "
                 "layers, as docs/models.md describes");
  sub.add_option("--layer", a.layer, "with --model or --gguf: the layer, from 0");
  sub.add_option("--stack", a.stack, "with --model, t5: encoder (default) | decoder");
  sub.add_option("--attention", a.attention,
                 "with --model (t5's decoder) or --family diffusers: self (default) | cross; a diffusers --prefix "
                 "ending in attn1 or attn2 selects it");
  sub.add_option("--family", a.family, "with --weights: diffusers (a transformer block's attn1 / attn2 under --prefix)");
  sub.add_option("--weights", a.weights, "layer weights (.safetensors; torch or Hugging Face names)");
  sub.add_option("--heads", a.heads, "query heads (with --weights)");
  sub.add_option("--kv-heads", a.kv_heads, "key/value heads (default: from the weights' shapes)");
  sub.add_option("--query", a.query, "X [B, Sq, d_model] (.npy, <f2, <f4 or <f8)")->required();
  sub.add_option("--key", a.key, "cross-attention keys [B, Sk, kdim]");
  sub.add_option("--value", a.value, "cross-attention values [B, Sk, vdim]");
  sub.add_option("--out", a.out, "output Y [B, Sq, d_model] (.npy, the query's dtype)")->required();
  add_score_options(sub, a, {ScoreOption::causal});
  sub.add_option("--key-padding-mask", a.key_padding_mask, "[B, Sk] bool/uint8, true = padding (ignored)");
  sub.add_option("--prefix", a.prefix, "name prefix of the layer in the file, e.g. model.layers.3.self_attn.");
  sub.add_option("--dtype", a.dtype,
                 "f32 | f64 | bf16 | f16: the layer's dtype; weights and inputs are rounded to it (default: bf16 "
                 "for a BF16 checkpoint or GGUF query weight, else the query's .npy dtype); the output is written in "
                 "the query's .npy dtype");
  sub.add_option("--rope-theta", a.rope_theta, "rotary embeddings of q and k: the base (default 10000)");
  sub.add_option("--rotary-dim", a.rotary_dim, "dimensions rotated (partial rotary; default head_dim)");
  sub.add_option("--rope-style", a.rope_style, "half (rotate_half: Llama, GPT-NeoX) | interleaved (GPT-J)");
  sub.add_option("--rope-scaling", a.rope_scaling, "none | linear | llama3");
  sub.add_option("--rope-factor", a.rope_factor, "the scaling's factor");
  sub.add_option("--rope-low-freq-factor", a.rope_low_freq_factor, "llama3's low_freq_factor (default 1)");
  sub.add_option("--rope-high-freq-factor", a.rope_high_freq_factor, "llama3's high_freq_factor (default 4)");
  sub.add_option("--rope-original-max-positions", a.rope_original_max_positions,
                 "llama3's original_max_position_embeddings (default 8192)");
  sub.add_option("--positions", a.positions, "each query token's position [B, Sq] (<i4 or <i8; default 0..Sq-1)");
  add_score_options(sub, a,
                    {ScoreOption::window, ScoreOption::softcap, ScoreOption::scale, ScoreOption::alibi,
                     ScoreOption::sinks});
  add_backend_threads_options(sub, a.backend, a.threads,
                              "reference | native | onednn: the attention core (default native)");
}

}  // namespace

Command add_mha_command(CLI::App& app) {
  return add_command<MhaArgs>(app, "mha", "A multi-head attention layer from safetensors weights on .npy inputs",
                              add_options, run);
}

}  // namespace simdattn::cli
