// The reference backend: the maths of docs/design.md as plain loops in double precision, one row
// at a time, no SIMD, no threads. It is the oracle every other backend is tested against, so it is
// written to be obviously correct, not fast:
//
//   s_j = modify(scale * (q_i . k_j)) + mask_ij  for every visible key j (softcap, ALiBi and
//                                                T5's bias: modifiers.hpp)
//   m   = max(max_j s_j, sink)                   (stable softmax: subtract the row maximum)
//   w_j = exp(s_j - m) / (sum_j exp(s_j - m) + exp(sink - m))    (no sink: no term)
//   o_i = sum_j w_j v_j,  lse_i = m + log(sum_j exp(s_j - m) + exp(sink - m))
//
// Masked keys are left out of the sums entirely (-inf semantics: exactly zero weight). A row with
// no visible key, or whose every score is -inf, is all zeros.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "element.hpp"
#include "modifiers.hpp"
#include "problem.hpp"
#include "visibility.hpp"

namespace simdattn::detail {
namespace {

template <class T>
void reference_impl(const Problem& p) {
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* o = static_cast<T*>(p.o);
  const std::int64_t group = p.H / p.Hkv;  // query heads per key/value head
  const double neg_inf = -std::numeric_limits<double>::infinity();

  // Row scratch, kept per thread so that a call allocates nothing once the thread has seen the
  // sizes (the MHA layer's hot path runs on this backend too).
  thread_local std::vector<double> score, acc;
  thread_local std::vector<bool> visible;
  score.resize(static_cast<std::size_t>(p.Sk));
  visible.resize(static_cast<std::size_t>(p.Sk));
  acc.resize(static_cast<std::size_t>(p.Dv));

  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / group;
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const T* qi = q + b * p.qs[0] + h * p.qs[1] + i * p.qs[2];

        // scores of the visible keys
        bool any_nan = false;
        double m = neg_inf;
        const KeyRange keys = row_keys(p, b, i);  // what position_visible asks, once per row
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          visible[j] = (p.sparse() ? position_visible(p, b, i, j) : j >= keys.lo && j < keys.hi) &&
                       (p.mask_kind != MaskKind::boolean || p.mask_allows(b, h, i, j));
          if (!visible[j]) continue;
          const T* kj = k + b * p.ks[0] + hk * p.ks[1] + j * p.ks[2];
          double dot = 0.0;
          for (std::int64_t d = 0; d < p.D; ++d)
            dot += widen(qi[d * p.qs[3]]) * widen(kj[d * p.ks[3]]);
          double s = p.scale * dot;
          if (p.scores_modified()) s = modify_score<double>(p, h, j - (i + p.query_offset(b)), s);
          if (p.mask_kind == MaskKind::additive) s += p.mask_add(b, h, i, j);
          score[j] = s;
          if (std::isnan(s)) any_nan = true;
          else if (s > m) m = s;
        }

        // softmax weights and the weighted sum of values (a sink joins the max and the sum)
        for (auto& a : acc) a = 0.0;
        double sum = 0.0, lse = neg_inf;
        const double sink = p.sinks != nullptr ? double(p.sinks[h]) : neg_inf;
        if (any_nan) {
          sum = lse = std::numeric_limits<double>::quiet_NaN();
        } else if (m == neg_inf) {
          lse = sink;  // no visible key: zeros (and the sink alone)
        } else {
          m = std::max(m, sink);
          if (p.sinks != nullptr) sum = std::exp(sink - m);
          for (std::int64_t j = 0; j < p.Sk; ++j) {
            if (!visible[j]) continue;
            const double w = std::exp(score[j] - m);  // exp(-inf) = 0 for -inf scores
            sum += w;
            const T* vj = v + b * p.vs[0] + hk * p.vs[1] + j * p.vs[2];
            for (std::int64_t d = 0; d < p.Dv; ++d) acc[d] += w * widen(vj[d * p.vs[3]]);
          }
          lse = m + std::log(sum);
        }
        if (p.lse != nullptr) p.lse[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] = static_cast<float>(lse);

        T* oi = o + b * p.os[0] + h * p.os[1] + i * p.os[2];
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          double out = 0.0;  // fully masked row (m == -inf): zeros
          if (any_nan) out = std::numeric_limits<double>::quiet_NaN();
          else if (m != neg_inf) out = acc[d] / sum;
          oi[d * p.os[3]] = narrow<T>(out);
        }
      }
    }
  }
}

}  // namespace

void attention_reference(const Problem& p) {
  switch (p.dtype) {
    case DType::f64: reference_impl<double>(p); break;
    case DType::bf16: reference_impl<bfloat16>(p); break;
    case DType::f16: reference_impl<float16>(p); break;
    default: reference_impl<float>(p); break;
  }
}

}  // namespace simdattn::detail
