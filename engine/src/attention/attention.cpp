// attention() and attention_paged(): each call's arguments validated into one Problem
// (core/validate/validate.cpp, paged.cpp), then the same way through the backends (run_problem).
#include "simdattn/attention.hpp"
#include "simdattn/paged.hpp"

#include "attention/run.hpp"
#include "attention/verbose.hpp"
#include "core/backends.hpp"
#include "core/validate/validate.hpp"
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

// A validated problem on `backend`: verbose mode's fields, the backend, the scores output.
void run_problem(const detail::Problem& p, Backend backend, detail::VerboseCall* verbose) {
  if (verbose != nullptr) {
    detail::describe_attention(*verbose, p, backend);
    if (backend == Backend::onednn) verbose->set_threads(detail::resolve_threads(p.threads));
  }
  switch (backend) {
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

namespace detail {

void run_attention(std::string_view op, const Problem& p, Backend backend) {
  verbose_entry(op, [&](VerboseCall* verbose) {
    const CallScope in_use;
    run_problem(p, backend, verbose);
  });
}

}  // namespace detail

void attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
               const TensorView& out, const AttentionOptions& options) {
  detail::verbose_entry("attention", [&](detail::VerboseCall* verbose) {
    const detail::CallScope in_use;  // the thread budget counts this thread as busy
    if (!backend_available(options.backend))
      throw Error("options.backend", "backend '" + std::string(backend_name(options.backend)) +
                                         "' is not available in this build");
    run_problem(detail::make_problem(q, k, v, out, options), options.backend, verbose);
  });
}

void attention_paged(const ConstTensorView& q, const ConstTensorView& k_cache, const ConstTensorView& v_cache,
                     const BlockTable& block_table, std::span<const std::int64_t> seq_lens, const TensorView& out,
                     const PagedAttentionOptions& options) {
  detail::verbose_entry("attention_paged", [&](detail::VerboseCall* verbose) {
    const detail::CallScope in_use;
    if (options.backend != Backend::native && options.backend != Backend::reference)
      throw Error("options.backend", "attention_paged runs on the native and reference backends, not '" +
                                         std::string(backend_name(options.backend)) + "'");
    run_problem(detail::make_problem(q, k_cache, v_cache, block_table, seq_lens, out, options), options.backend, verbose);
  });
}

}  // namespace simdattn
