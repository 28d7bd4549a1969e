// One query row of the maths of docs/design.md in double, as plain loops: its scores at a stage
// and its softmax weights. The reference backend (reference.cpp) and the opt-in scores output
// (scores.cpp) both compute rows this way, so the two cannot disagree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/element.hpp"
#include "core/modifiers.hpp"
#include "core/position_rule.hpp"
#include "core/problem.hpp"

namespace simdattn::detail {

struct RowStats {
  double max = -std::numeric_limits<double>::infinity();  // of the visible, non-NaN scores
  bool any_nan = false;                                    // a visible score is NaN
};

// The scores of query i of head (b, h) against every key, into score[0:Sk], at `stage`:
// scaled (scale * q.k) and capped (then the softcap) for every key; biased (then ALiBi, T5's
// bias and the additive mask) for the visible keys, -inf for the hidden ones (never read: a
// mask's value there cannot reach the row). The stats are over the visible keys (scaled and
// capped: over all).
template <class T>
RowStats reference_row_scores(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, ScoreStage stage,
                              double* score) {
  const T* qi = static_cast<const T*>(p.q) + p.q_offset(b, h, i);
  const std::int64_t hk = h / (p.H / p.Hkv);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const bool visibility = stage == ScoreStage::biased || stage == ScoreStage::softmax;
  const KeyRange keys = row_keys(p, b, i);  // what position_visible asks, once per row
  RowStats st;
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const bool visible = (p.sparse() ? position_visible(p, b, i, j) : j >= keys.lo && j < keys.hi) &&
                         (p.mask_kind != MaskKind::boolean || p.mask_allows(b, h, i, j));
    if (visibility && !visible) {
      score[j] = neg_inf;
      continue;
    }
    double dot = 0.0;
    if (p.kv_codes()) {
      for (std::int64_t d = 0; d < p.D; ++d) dot += widen(qi[d * p.q_strides[3]]) * p.k_code_value(b, hk, j, d);
    } else {
      const T* kj = static_cast<const T*>(p.k) + p.k_at(p.key_run(b, j, j + 1), hk);
      for (std::int64_t d = 0; d < p.D; ++d) dot += widen(qi[d * p.q_strides[3]]) * widen(kj[d * p.k_strides[3]]);
    }
    double s = p.scale * dot;
    if (stage != ScoreStage::scaled && p.softcap > 0.0) s = p.softcap * std::tanh(s / p.softcap);
    if (visibility) {
      const std::int64_t rel = j - (i + p.query_offset(b));
      if (p.alibi != nullptr) s += static_cast<double>(p.alibi[h]) * static_cast<double>(rel);
      if (p.t5_table != nullptr) s += t5_bias(p, h, rel);
      if (p.mask_kind == MaskKind::additive) s += p.mask_add(b, h, i, j);
    }
    score[j] = s;
    if (std::isnan(s)) st.any_nan = true;
    else if (s > st.max) st.max = s;
  }
  return st;
}

// The softmax weights of a row from its biased scores (a sink joins the max and the sum):
// w[j] = exp(s_j - m) / (sum + exp(sink - m)), 0 where s_j = -inf; all 0 for a row with no
// finite score, all NaN for a row with a NaN one. Returns the row's log-sum-exp (the sink's
// alone, or -inf, for a row with no finite score).
inline double reference_row_weights(const Problem& p, std::int64_t h, const RowStats& st, const double* score,
                                    double* w) {
  const double neg_inf = -std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const double sink = p.sinks != nullptr ? static_cast<double>(p.sinks[h]) : neg_inf;
  if (st.any_nan) {
    std::fill(w, w + p.Sk, nan);
    return nan;
  }
  if (st.max == neg_inf) {
    std::fill(w, w + p.Sk, 0.0);
    return sink;
  }
  const double m = std::max(st.max, sink);
  double sum = p.sinks != nullptr ? std::exp(sink - m) : 0.0;
  for (std::int64_t j = 0; j < p.Sk; ++j) sum += (w[j] = std::exp(score[j] - m));  // exp(-inf) = 0
  for (std::int64_t j = 0; j < p.Sk; ++j) w[j] /= sum;
  return m + std::log(sum);
}

}  // namespace simdattn::detail
