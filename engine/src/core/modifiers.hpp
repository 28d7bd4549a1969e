// The score modifiers (simdattn/attention.hpp, docs/design.md "Score modifiers"): T5's buckets,
// and the ALiBi and T5 line the native kernel adds (a row's end, the sink and lse: partial.hpp's
// finish_row). Applied in
// this order: softcap, ALiBi, T5's relative bias, then the additive mask (the reference's
// reference_row_scores, the native path's scale_mask_row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/element.hpp"
#include "core/problem.hpp"

namespace simdattn::detail {

// T5's bucket for relative position rel = j - p, in float32 as Hugging Face's
// T5Attention._relative_position_bucket: bidirectional, the upper half of the buckets for keys
// after the query and |rel| below; one-way, only keys at or before the query (rel <= 0) count,
// later ones fall in bucket 0. Positions below max_exact = buckets / 2 (of the half) are exact,
// larger ones logarithmic up to max_distance, the last bucket beyond.
inline std::int64_t t5_bucket(std::int64_t rel, bool bidirectional, std::int64_t num_buckets, std::int64_t max_distance) {
  std::int64_t bucket = 0;
  std::int64_t n = num_buckets;
  if (bidirectional) {
    n /= 2;
    if (rel > 0) bucket += n;
    rel = rel < 0 ? -rel : rel;
  } else {
    rel = rel < 0 ? -rel : 0;
  }
  const std::int64_t max_exact = n / 2;
  if (rel < max_exact) return bucket + rel;
  // float32 throughout, the log's divisor rounded once from double (Python's math.log), the
  // product truncated toward zero (torch's .to(long))
  const float ratio = static_cast<float>(rel) / static_cast<float>(max_exact);
  const auto denom = static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = std::log(ratio) / denom * static_cast<float>(n - max_exact);
  const auto large = max_exact + static_cast<std::int64_t>(scaled);
  return bucket + std::min(large, n - 1);
}

// T5's bias of head h at relative position rel.
inline double t5_bias(const Problem& p, std::int64_t h, std::int64_t rel) {
  const std::int64_t k = t5_bucket(rel, p.t5_bidirectional, p.t5_buckets, p.t5_max_distance);
  return widen_at(p.t5_table, p.t5_dtype, k * p.t5_strides[0] + h * p.t5_strides[1]);
}

// T5's bias of head h at every relative position in [-reach, reach], into by_rel[rel + reach]:
// with reach = max_distance, every position beyond is its side's end value (the last buckets).
template <class T>
void fill_t5_by_rel(const Problem& p, std::int64_t h, std::int64_t reach, T* by_rel) {
  for (std::int64_t r = -reach; r <= reach; ++r) by_rel[r + reach] = static_cast<T>(t5_bias(p, h, r));
}

// How far a table of fill_t5_by_rel reaches for this problem: max_distance (so that it answers
// every position), or less when that is huge (positions past it are then computed directly).
inline std::int64_t t5_table_reach(const Problem& p) {
  return p.t5_table == nullptr ? 0 : std::min<std::int64_t>(p.t5_max_distance, std::int64_t{1} << 14);
}

// The additive part of the modifiers for head h along relative positions rel0 .. rel0 + n - 1:
// line[k] = slope[h] * (rel0 + k) + T5's bias at rel0 + k (those given), rounded once. The rows
// of a block of queries against a block of keys share one line, each row reading it from its
// own start (rel0 = j0 - p of the block's last row). t5_by_rel: fill_t5_by_rel's table of head
// h (reach t5_table_reach), or null to compute T5's buckets here.
template <class T>
void fill_bias_line(const Problem& p, std::int64_t h, std::int64_t rel0, std::int64_t n, T* line,
                    const T* t5_by_rel = nullptr) {
  const std::int64_t reach = t5_table_reach(p);
  const bool saturates = reach == p.t5_max_distance;
  for (std::int64_t k = 0; k < n; ++k) {
    const std::int64_t rel = rel0 + k;
    double v = 0.0;
    if (p.alibi != nullptr) v += static_cast<double>(p.alibi[h]) * static_cast<double>(rel);
    if (p.t5_table != nullptr) {
      if (t5_by_rel != nullptr && (saturates || (rel >= -reach && rel <= reach)))
        v += static_cast<double>(t5_by_rel[std::clamp(rel, -reach, reach) + reach]);
      else
        v += t5_bias(p, h, rel);
    }
    line[k] = static_cast<T>(v);
  }
}

}  // namespace simdattn::detail
