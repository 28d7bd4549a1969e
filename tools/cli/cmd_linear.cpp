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

  const QkvFiles in = load_qkv(a.q, a.k, a.v);
  NpyArray out = make_output(in.q.dtype, {in.os[0], in.os[1], in.os[2], in.os[3]});
  try {
    linear_attention(in.q_view(), in.k_view(), in.v_view(), TensorView(out.data.data(), out.dtype, in.os), opt);
  } catch (const Error& e) {
    throw usage_error(e);
  }
  save_output(a.out, out);
}

}  // namespace

Command add_linear_command(CLI::App& app) {
  auto args = std::make_shared<LinearArgs>();
  CLI::App* sub = app.add_subcommand("linear", "Linear attention (kernel feature maps) on .npy files");
  add_qkv_out_options(*sub, args->q, args->k, args->v, args->out);
  sub->add_flag("--causal", args->causal, "each query attends to keys j <= i (needs Sq == Sk)");
  sub->add_option("--feature-map", args->feature_map, "elu1 | relu | identity (default elu1)");
  sub->add_option("--backend", args->backend, "reference | native (default native)");
  sub->add_option("--threads", args->threads, "threads (>= 1; default: OpenMP's)");
  return [args, sub] {
    if (*sub) run(*args);
  };
}

}  // namespace simdattn::cli
