// The opt-in scores output (AttentionOptions::scores): every row's scores at the asked stage,
// computed in double as the reference backend computes them (reference_rows.hpp), whatever the
// backend that computed the attention output, and rounded once into the view's dtype.
#include <cstdint>
#include <vector>

#include "attention/reference/rows.hpp"
#include "core/backends.hpp"
#include "core/element.hpp"
#include "core/problem.hpp"

namespace simdattn::detail {
namespace {

template <class T>
void scores_impl(const Problem& p) {
  thread_local std::vector<double> score, weight;
  score.resize(static_cast<std::size_t>(p.Sk));
  weight.resize(static_cast<std::size_t>(p.Sk));
  const bool softmax = p.scores_stage == ScoreStage::softmax;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const RowStats st =
            reference_row_scores<T>(p, b, h, i, softmax ? ScoreStage::biased : p.scores_stage, score.data());
        if (softmax) reference_row_weights(p, h, st, score.data(), weight.data());
        const std::vector<double>& row = softmax ? weight : score;
        const std::int64_t base = b * p.scores_strides[0] + h * p.scores_strides[1] + i * p.scores_strides[2];
        for (std::int64_t j = 0; j < p.Sk; ++j)
          store_at(p.scores, p.scores_dtype, base + j * p.scores_strides[3], row[static_cast<std::size_t>(j)]);
      }
}

}  // namespace

void write_scores(const Problem& p) {
  if (p.scores == nullptr) return;
  visit_dtype(p.dtype, [&](auto t) { scores_impl<decltype(t)>(p); });
}

}  // namespace simdattn::detail
