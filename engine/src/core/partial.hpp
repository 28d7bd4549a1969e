// Partial attention results and their merge: the one home of the rule (docs/architecture.md,
// "Split keys"). Attention over a part of a row's keys leaves one of two equivalent forms:
//
//   partial rows  m (a reference max), l = sum_j exp(s_j - m), acc = sum_j exp(s_j - m) v_j
//                 (unnormalised; the native paths' key splits: PartRows, merge_parts)
//   states        O = acc / l and its log-sum-exp s = m + log l (FlashInfer's attention
//                 states; the distributed merge: merge_states)
//
// Parts merge in a fixed key order, so the result does not depend on which thread computed which
// part. A part that saw no key has m = -inf (l = 0, acc never read) or s = -inf, and weight 0; a
// NaN anywhere makes the row NaN. After the last part, finish_row adds the sink's term to l and
// writes the row's lse.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "core/problem.hpp"

namespace simdattn::detail {

// One part's rows (a key split of a unit's rows): row r's m[r], l[r] and acc[r * ld .. + Dv).
template <class T>
struct PartRows {
  const T* m;
  const T* l;
  const T* acc;
  std::int64_t ld;
};

// Row r of a unit from its parts, in key order: returns the merged reference max M and sets
// l = sum_p l_p exp(m_p - M) and out[0:dv] = sum_p acc_p exp(m_p - M) (out untouched, and l = 0,
// when no part saw a key: M = -inf).
template <class T>
T merge_parts(std::span<const PartRows<T>> parts, std::int64_t r, std::int64_t dv, T& l, T* out) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  T mx = neg_inf;
  for (const PartRows<T>& part : parts) mx = std::max(mx, part.m[r]);
  l = T(0);
  bool first = true;
  for (const PartRows<T>& part : parts) {
    if (part.m[r] == neg_inf) continue;
    const T w = std::exp(part.m[r] - mx);
    l += part.l[r] * w;
    const T* acc = part.acc + r * part.ld;
    if (first) std::transform(acc, acc + dv, out, [w](T a) { return a * w; });
    else
      for (std::int64_t d = 0; d < dv; ++d) out[d] += acc[d] * w;
    first = false;
  }
  return mx;
}

// Two states of a row merge into the first: s_a = log(exp(s_a) + exp(s_b)), and the weights of
// O_a and O_b in the merged output. NaN in either: s_a NaN (and nan set); s = -inf weighs 0.
struct StateWeights {
  double a = 1.0, b = 0.0;
  bool nan = false;
};
inline StateWeights merge_states(double& sa, double sb) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (std::isnan(sa) || std::isnan(sb)) {
    sa = std::numeric_limits<double>::quiet_NaN();
    return {0.0, 0.0, true};
  }
  if (sb == -kInf) return {1.0, 0.0};
  if (sa == -kInf) {
    sa = sb;
    return {0.0, 1.0};
  }
  // the weights relative to the larger state, then their share of the sum (the weights as
  // exp(s - merged) lose log(sum) to rounding where |m| is large: equal states of 1e16 weighed 1
  // and 1)
  const double m = std::max(sa, sb);
  const double wa = std::exp(sa - m), wb = std::exp(sb - m), sum = wa + wb;
  sa = m + std::log(sum);
  return {wa / sum, wb / sum};
}

// The end of row i of head (b, h) whose keys left the sum l of exp(s - m) (m the reference it
// used; l == 0: no visible key): the sink's term added to l (so that the output acc / l is the
// contract's), and the row's log-sum-exp written where asked. In double.
template <class T>
void finish_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, T m, T& l) {
  if (p.sinks == nullptr && p.lse == nullptr) return;
  const double inf = std::numeric_limits<double>::infinity();
  const double md = static_cast<double>(m), ld = static_cast<double>(l);
  double lse = ld == 0.0 ? -inf : md + std::log(ld);  // NaN stays NaN
  if (p.sinks != nullptr) {
    const double sink = p.sinks[h];
    if (ld == 0.0) {
      lse = sink;  // no visible key: zeros, and the sink alone
    } else if (!std::isnan(ld)) {
      l = static_cast<T>(ld + std::exp(sink - md));  // inf past the range: the output 0
      const double hi = std::max(lse, sink), lo = std::min(lse, sink);
      lse = hi + std::log1p(std::exp(lo - hi));
    }
  }
  if (p.lse != nullptr) p.lse[p.lse_offset(b, h, i)] = static_cast<float>(lse);
}

}  // namespace simdattn::detail
