#include "score_options.hpp"

#include <CLI/CLI.hpp>

namespace simdattn::cli {

void add_score_options(CLI::App& sub, ScoreArgs& a, std::initializer_list<ScoreOption> which) {
  for (const ScoreOption option : which) {
    switch (option) {
      case ScoreOption::causal:
        sub.add_option("--causal", a.causal, "none | top-left | bottom-right (default none)");
        break;
      case ScoreOption::scale:
        sub.add_option("--scale", a.scale, "score scale (default 1/sqrt(head_dim))");
        break;
      case ScoreOption::window:
        sub.add_option("--window", a.window, "sliding window LEFT,RIGHT (-1 = unbounded side)");
        break;
      case ScoreOption::softcap:
        sub.add_option("--softcap", a.softcap, "cap the scaled scores: s = C * tanh(s / C), C > 0 (Gemma 2: 50)");
        break;
      case ScoreOption::alibi:
        sub.add_flag("--alibi", a.alibi, "ALiBi with the standard slopes");
        break;
      case ScoreOption::alibi_slopes:
        sub.add_option("--alibi-slopes", a.alibi_slopes, "ALiBi with these slopes: float [H]");
        break;
      case ScoreOption::t5_bias:
        sub.add_option("--t5-bias", a.t5_bias, "T5's relative position bias table: float [num_buckets, H]");
        break;
      case ScoreOption::t5_max_distance:
        sub.add_option("--t5-max-distance", a.t5_max_distance, "T5's max distance (default 128)");
        break;
      case ScoreOption::t5_unidirectional:
        sub.add_flag("--t5-unidirectional", a.t5_unidirectional,
                     "T5's one-way buckets (its decoder; default bidirectional)");
        break;
      case ScoreOption::sinks:
        sub.add_option("--sinks", a.sinks, "a sink logit per query head, in the softmax's denominator: float [heads]");
        break;
      case ScoreOption::query_offset:
        sub.add_option("--query-offset", a.query_offset,
                       "query i of batch b at key position i + O[b]: int [B] (<i4 or <i8), instead of the causal "
                       "alignment");
        break;
    }
  }
}

}  // namespace simdattn::cli
