// The score options of run and mha (--causal, --scale, --window and the score modifiers): their
// names, defaults and help texts in one place; each command registers the ones it takes (linear
// takes none of them: its --causal is a plain flag).
#pragma once

#include <initializer_list>
#include <string>

namespace CLI {
class App;
}

namespace simdattn::cli {

// The options' values, as typed (empty: not given); a command's args extend it and parse them.
struct ScoreArgs {
  std::string causal = "none", scale, window, softcap, alibi_slopes, t5_bias, t5_max_distance, sinks, query_offset;
  bool alibi = false, t5_unidirectional = false;
};

enum class ScoreOption {
  causal,             // --causal none | top-left | bottom-right
  scale,              // --scale
  window,             // --window LEFT,RIGHT
  softcap,            // --softcap
  alibi,              // --alibi (the standard slopes)
  alibi_slopes,       // --alibi-slopes
  t5_bias,            // --t5-bias
  t5_max_distance,    // --t5-max-distance
  t5_unidirectional,  // --t5-unidirectional
  sinks,              // --sinks
  query_offset,       // --query-offset
};

// Registers `which` on `sub`, in that order (the order --help lists them in), bound to `a`.
void add_score_options(CLI::App& sub, ScoreArgs& a, std::initializer_list<ScoreOption> which);

}  // namespace simdattn::cli
