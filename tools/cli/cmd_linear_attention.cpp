// `simdattn linear`: linear attention on .npy files, with the run command's I/O and error
// conventions.
#include <string>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct LinearArgs {
  std::string q, k, v, out, feature_map = "elu1", backend = "native", threads, dtype;
  bool causal = false;
};

FeatureMap parse_feature_map(const std::string& text) {
  if (text == "elu1") return FeatureMap::elu1;
  if (text == "relu") return FeatureMap::relu;
  if (text == "identity") return FeatureMap::identity;
  throw UsageError("--feature-map: expected elu1, relu or identity, got '" + text + "'");
}

void run(const LinearArgs& a) {
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
  add_qkv_out_options(sub, a.q, a.k, a.v, a.out);
  sub.add_flag("--causal", a.causal, "each query attends to keys j <= i (needs Sq == Sk)");
  sub.add_option("--feature-map", a.feature_map, "elu1 | relu | identity (default elu1)");
  add_dtype_option(sub, a.dtype);
  add_backend_threads_options(sub, a.backend, a.threads, "reference | native (default native)");
}

}  // namespace

Command add_linear_command(CLI::App& app) {
  return add_command<LinearArgs>(app, "linear", "Linear attention (kernel feature maps) on .npy files",
                                 add_options, run);
}

}  // namespace simdattn::cli
