// The reference backend: the maths of docs/design.md as plain loops in double precision, one row
// at a time, no SIMD, no threads. It is the oracle every other backend is tested against, so it is
// written to be obviously correct, not fast:
//
//   s_j = modify(scale * (q_i . k_j)) + mask_ij  for every visible key j (softcap, ALiBi and
//                                                T5's bias; reference_rows.hpp)
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

#include "attention/reference/rows.hpp"
#include "core/backends.hpp"
#include "core/element.hpp"
#include "core/problem.hpp"

namespace simdattn::detail {
namespace {

template <class T>
void reference_impl(const Problem& p) {
  const T* v = static_cast<const T*>(p.v);
  T* o = static_cast<T*>(p.o);
  const std::int64_t group = p.H / p.Hkv;  // query heads per key/value head
  const double nan = std::numeric_limits<double>::quiet_NaN();

  // Row scratch, kept per thread so that a call allocates nothing once the thread has seen the
  // sizes (the MHA layer's hot path runs on this backend too).
  thread_local std::vector<double> score, weight, acc;
  score.resize(static_cast<std::size_t>(p.Sk));
  weight.resize(static_cast<std::size_t>(p.Sk));
  acc.resize(static_cast<std::size_t>(p.Dv));

  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / group;
      for (std::int64_t i = 0; i < p.query_len(b); ++i) {
        const RowStats st = reference_row_scores<T>(p, b, h, i, ScoreStage::biased, score.data());
        const double lse = reference_row_weights(p, h, st, score.data(), weight.data());
        if (p.lse != nullptr) p.lse[p.lse_offset(b, h, i)] = static_cast<float>(lse);
        for (auto& a : acc) a = st.any_nan ? nan : 0.0;  // a NaN score: a NaN row; no visible key: zeros
        if (!st.any_nan)
          for (std::int64_t j = 0; j < p.Sk; ++j) {
            if (weight[j] == 0.0) continue;
            if (p.kv_codes()) {
              for (std::int64_t d = 0; d < p.Dv; ++d) acc[d] += weight[j] * p.v_code_value(b, hk, j, d);
              continue;
            }
            const T* vj = v + p.v_at(p.key_run(b, j, j + 1), hk);
            for (std::int64_t d = 0; d < p.Dv; ++d) acc[d] += weight[j] * widen(vj[d * p.v_strides[3]]);
          }
        T* oi = o + p.o_offset(b, h, i);
        for (std::int64_t d = 0; d < p.Dv; ++d) oi[d * p.o_strides[3]] = narrow<T>(acc[d]);
      }
    }
  }
}

}  // namespace

void attention_reference(const Problem& p) {
  visit_dtype(p.dtype, [&](auto t) { reference_impl<decltype(t)>(p); });
}

}  // namespace simdattn::detail
