// The ranks' partial attention results (docs/distributed.md): attention over a part of the keys
// gives, per query row, the output over that part O_p and its log-sum-exp l_p, an attention state
// that merges with another by core/partial.hpp's rule (merge_states). Done in double, in a fixed
// order, so the merged rows do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "core/partial.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail::mpi {

// rows x (dv + 1) doubles: each row's output, then its lse.
class Partial {
 public:
  Partial() = default;
  Partial(std::int64_t rows, std::int64_t dv) { reset(rows, dv); }
  void reset(std::int64_t rows, std::int64_t dv) {
    rows_ = rows;
    dv_ = dv;
    data_.assign(static_cast<std::size_t>(rows * (dv + 1)), 0.0);
    for (std::int64_t r = 0; r < rows; ++r) data_[static_cast<std::size_t>(r * (dv + 1) + dv)] = -inf();
  }
  std::int64_t rows() const { return rows_; }
  std::int64_t dv() const { return dv_; }
  std::int64_t width() const { return dv_ + 1; }
  double* row(std::int64_t r) { return data_.data() + r * (dv_ + 1); }
  const double* row(std::int64_t r) const { return data_.data() + r * (dv_ + 1); }
  double* data() { return data_.data(); }
  const double* data() const { return data_.data(); }

  // Merges into acc (a row: dv outputs, then the lse) a part's row: output o[0, dv), lse l (the
  // state merge of core/partial.hpp).
  static void merge_row(double* acc, std::int64_t dv, const double* o, double l) {
    const StateWeights w = merge_states(acc[dv], l);
    for (std::int64_t d = 0; d < dv; ++d)
      acc[d] = w.nan ? std::numeric_limits<double>::quiet_NaN() : w.b == 0.0 ? acc[d] : w.a == 0.0 ? o[d] : acc[d] * w.a + o[d] * w.b;
  }

  // The sink's share (AttentionOptions::sinks): a state of output 0 and lse `sink` merged in.
  static void add_sink(double* acc, std::int64_t dv, double sink) {
    if (std::isnan(acc[dv])) return;
    const StateWeights w = merge_states(acc[dv], sink);
    for (std::int64_t d = 0; d < dv; ++d) acc[d] *= w.a;
  }

  static constexpr double inf() { return std::numeric_limits<double>::infinity(); }

 private:
  std::int64_t rows_ = 0, dv_ = 0;
  std::vector<double> data_;
};

// The parts of one rank's query rows as they arrive (ring steps, key runs): per row (b, h, i)
// of [B, H, Sq, Dv] the merged output, in f32 (f64 for f64 problems: the kernels' own
// precision), and the lse in double. The output accumulates in `out` itself when it has that
// dtype (else in this thread's scratch), and a part that is the first to reach its rows is
// written there by attention() directly; rows that no part reached end as zeros with lse -inf.
class Accumulator {
 public:
  // For the rows of shape [B, H, Sq, Dv] of a problem of dtype `dtype`; out: where the result
  // goes (empty: nowhere, only export_rows), accumulated in place when its dtype allows.
  void reset(const Shape4& shape, DType dtype, const TensorView& out);
  // attention(q, k, v, options) (no sinks, lse or scores asked: the merge adds sinks once) merged
  // into query rows [row0, row0 + q.shape[2]).
  void attend(std::int64_t row0, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
              const AttentionOptions& options);
  // Each row as dv doubles then its lse (width dv + 1), into dst (rows x (dv + 1)).
  void export_rows(double* dst) const;
  // The sinks added (sinks[h] for the rows of head h), then out (the view given to reset) and
  // lse [B, H, Sq, 1] (when given) written.
  void finish(std::span<const float> sinks, const TensorView& lse);

 private:
  Shape4 shape_{};
  DType dtype_ = DType::f32;  // the accumulator's: f32 or f64
  TensorView acc_;            // [B, H, Sq, Dv] of dtype_: out itself, or scratch
  TensorView out_;
  std::vector<double> lse_;   // B * H * Sq
};

// part's rows (after the sinks, if any) written to out [B, H, Sq, Dv] (its dtype) and, when
// given, lse [B, H, Sq, 1] f32; part holds B * H * Sq rows in that order.
void write_rows(const Partial& part, std::int64_t heads, std::int64_t sq, const TensorView& out,
                const TensorView& lse);

// A view's slice along the sequence axis (dimension 2): positions [start, start + length).
inline ConstTensorView slice_seq(const ConstTensorView& t, std::int64_t start, std::int64_t length) {
  ConstTensorView s = t;
  if (s.data != nullptr)
    s.data = static_cast<const unsigned char*>(t.data) +
             start * t.strides[2] * static_cast<std::int64_t>(dtype_size(t.dtype));
  s.shape[2] = length;
  return s;
}
inline TensorView slice_seq(const TensorView& t, std::int64_t start, std::int64_t length) {
  TensorView s = t;
  if (s.data != nullptr)
    s.data = static_cast<unsigned char*>(t.data) + start * t.strides[2] * static_cast<std::int64_t>(dtype_size(t.dtype));
  s.shape[2] = length;
  return s;
}

}  // namespace simdattn::detail::mpi
