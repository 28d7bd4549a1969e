#include "simdattn/attention.hpp"

#include "attention/verbose.hpp"
#include "core/backends.hpp"
#include "core/validate.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"

#include <string>

#include "core/problem.hpp"
#include "simdattn/error.hpp"

namespace simdattn {

std::string_view backend_name(Backend b) noexcept {
  switch (b) {
    case Backend::reference: return "reference";
    case Backend::native: return "native";
    case Backend::onednn: return "onednn";
  }
  return "?";
}

std::string_view causal_name(Causal c) noexcept {
  switch (c) {
    case Causal::none: return "none";
    case Causal::top_left: return "top-left";
    case Causal::bottom_right: return "bottom-right";
  }
  return "?";
}

std::string_view score_stage_name(ScoreStage s) noexcept {
  switch (s) {
    case ScoreStage::scaled: return "scaled";
    case ScoreStage::capped: return "capped";
    case ScoreStage::biased: return "biased";
    case ScoreStage::softmax: return "softmax";
  }
  return "?";
}

bool backend_available(Backend b) noexcept {
#ifdef SIMDATTN_HAVE_ONEDNN
  if (b == Backend::onednn) return true;
#endif
  return b == Backend::reference || b == Backend::native;
}

bool backend_takes(Backend b, DType dtype) noexcept {
  if (!backend_available(b)) return false;
#ifdef SIMDATTN_HAVE_ONEDNN
  if (b == Backend::onednn) return detail::onednn_takes(dtype);
#endif
  (void)dtype;
  return true;
}

namespace {

void run_attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                   const TensorView& out, const AttentionOptions& options, detail::VerboseCall* verbose) {
  const detail::CallScope in_use;  // the thread budget counts this thread as busy
  if (!backend_available(options.backend))
    throw Error("options.backend", "backend '" + std::string(backend_name(options.backend)) +
                                       "' is not available in this build");
  const detail::Problem p = detail::make_problem(q, k, v, out, options);
  if (verbose != nullptr) {
    detail::describe_attention(*verbose, p, options.backend);
    if (options.backend == Backend::onednn) verbose->set_threads(detail::resolve_threads(p.threads));
  }
  switch (options.backend) {
    case Backend::reference: detail::attention_reference(p); break;
    case Backend::native: detail::attention_native(p); break;
    case Backend::onednn:
#ifdef SIMDATTN_HAVE_ONEDNN
      detail::attention_onednn(p);
#endif
      break;
  }
  detail::write_scores(p);
}

}  // namespace

void attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
               const TensorView& out, const AttentionOptions& options) {
  detail::verbose_entry("attention", [&](detail::VerboseCall* verbose) { run_attention(q, k, v, out, options, verbose); });
}

}  // namespace simdattn
