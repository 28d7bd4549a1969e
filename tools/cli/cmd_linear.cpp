// `simdattn linear`: linear attention on .npy files, with the run command's I/O and error
// conventions.
#include <memory>
#include <string>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct LinearArgs {
  std::string q, k, v, out, feature_map = "elu1", backend = "native", threads;
  bool causal = false;
};

std::string flag_for(const std::string& argument) {
  if (argument == "q") return "--q";
  if (argument == "k") return "--k";
  if (argument == "v") return "--v";
  if (argument == "out") return "--out";
  if (argument == "options.causal") return "--causal";
  if (argument == "options.backend") return "--backend";
  if (argument == "options.threads") return "--threads";
  return argument;
}

void run(const LinearArgs& a) {
  LinearAttentionOptions opt;
  opt.causal = a.causal;
  if (a.feature_map == "elu1") opt.feature_map = FeatureMap::elu1;
  else if (a.feature_map == "relu") opt.feature_map = FeatureMap::relu;
  else if (a.feature_map == "identity") opt.feature_map = FeatureMap::identity;
  else throw UsageError("--feature-map: expected elu1, relu or identity, got '" + a.feature_map + "'");
  opt.backend = parse_backend("--backend", a.backend);
  if (opt.backend == Backend::onednn)
    throw UsageError("--backend: linear attention runs on reference or native (oneDNN has no primitive for it)");
  if (!a.threads.empty()) opt.threads = static_cast<int>(parse_int("--threads", a.threads, 1, 4096));

  const NpyArray q = load_npy("--q", a.q);
  const NpyArray k = load_npy("--k", a.k);
  const NpyArray v = load_npy("--v", a.v);
  const Shape4 qs = shape4("--q", a.q, q), ks = shape4("--k", a.k, k), vs = shape4("--v", a.v, v);
  if (k.dtype != q.dtype)
    throw UsageError("--k " + a.k + ": dtype " + std::string(dtype_name(k.dtype)) + " differs from --q's " +
                     std::string(dtype_name(q.dtype)));
  if (v.dtype != q.dtype)
    throw UsageError("--v " + a.v + ": dtype " + std::string(dtype_name(v.dtype)) + " differs from --q's " +
                     std::string(dtype_name(q.dtype)));
  NpyArray out;
  out.dtype = q.dtype;
  out.shape = {qs[0], qs[1], qs[2], vs[3]};
  std::int64_t n = 1;
  for (std::int64_t d : out.shape)
    if (__builtin_mul_overflow(n, d, &n)) throw UsageError("--out: output shape is too large");
  out.data.resize(static_cast<std::size_t>(n) * dtype_size(q.dtype));
  try {
    linear_attention(ConstTensorView(q.data.data(), q.dtype, qs), ConstTensorView(k.data.data(), k.dtype, ks),
                     ConstTensorView(v.data.data(), v.dtype, vs),
                     TensorView(out.data.data(), out.dtype, {out.shape[0], out.shape[1], out.shape[2], out.shape[3]}),
                     opt);
  } catch (const Error& e) {
    const std::string flag = flag_for(e.argument());
    std::string msg = e.what();
    if (flag != e.argument() && msg.rfind(e.argument() + ": ", 0) == 0)
      msg = flag + ": " + msg.substr(e.argument().size() + 2);
    throw UsageError(msg);
  }
  try {
    write_npy(a.out, out);
  } catch (const Error& e) {
    throw UsageError(std::string("--out ") + e.what());
  }
}

}  // namespace

Command add_linear_command(CLI::App& app) {
  auto args = std::make_shared<LinearArgs>();
  CLI::App* sub = app.add_subcommand("linear", "Linear attention (kernel feature maps) on .npy files");
  sub->add_option("--q", args->q, "Q [B, H, Sq, D] (.npy, <f4 or <f8)")->required();
  sub->add_option("--k", args->k, "K [B, Hkv, Sk, D], same dtype as Q")->required();
  sub->add_option("--v", args->v, "V [B, Hkv, Sk, Dv], same dtype as Q")->required();
  sub->add_option("--out", args->out, "output O [B, H, Sq, Dv] (.npy, Q's dtype)")->required();
  sub->add_flag("--causal", args->causal, "each query attends to keys j <= i (needs Sq == Sk)");
  sub->add_option("--feature-map", args->feature_map, "elu1 | relu | identity (default elu1)");
  sub->add_option("--backend", args->backend, "reference | native (default native)");
  sub->add_option("--threads", args->threads, "threads (>= 1; default: OpenMP's)");
  return [args, sub] {
    if (*sub) run(*args);
  };
}

}  // namespace simdattn::cli
