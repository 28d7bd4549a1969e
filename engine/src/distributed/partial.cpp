#include "distributed/partial.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/element.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail::mpi {

namespace scratch {
struct MpiAccumulator : ScratchSlot {};  // the rows, when out cannot hold them
struct MpiPart : ScratchSlot {};         // one attention() call's output and lse
}  // namespace scratch

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row r of a [B, H, S, W] view (r = (b * H + h) * S + i).
template <class T>
T* row_of(const TensorView& t, std::int64_t r) {
  const std::int64_t S = t.shape[2], H = t.shape[1];
  const std::int64_t b = r / (H * S), h = r / S % H, i = r % S;
  return static_cast<T*>(t.data) + b * t.strides[0] + h * t.strides[1] + i * t.strides[2];
}

// One part's row x (lse lb, in S) merged into the accumulator's row a (element stride st, lse
// la), by core/partial.hpp's state merge.
template <class A, class S>
void merge_row(A* a, std::int64_t st, double& la, const S* x, double lb, std::int64_t dv) {
  if (std::isnan(la)) return;
  const StateWeights w = merge_states(la, lb);
  if (w.nan) {
    for (std::int64_t d = 0; d < dv; ++d) a[d * st] = std::numeric_limits<A>::quiet_NaN();
    return;
  }
  if (w.b == 0.0) return;
  if (w.a == 0.0) {
    for (std::int64_t d = 0; d < dv; ++d) a[d * st] = static_cast<A>(widen(x[d]));
    return;
  }
  const A wa = static_cast<A>(w.a), wb = static_cast<A>(w.b);
  for (std::int64_t d = 0; d < dv; ++d) a[d * st] = a[d * st] * wa + static_cast<A>(widen(x[d])) * wb;
}

template <class A, class S>
void merge_part(const TensorView& acc, double* lse, std::int64_t row0, const S* part, const float* part_lse,
                std::int64_t BH, std::int64_t n, std::int64_t dv) {
  const std::int64_t sq = acc.shape[2];
  for (std::int64_t bh = 0; bh < BH; ++bh)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t r = bh * sq + row0 + i;
      merge_row(row_of<A>(acc, r), acc.strides[3], lse[r], part + (bh * n + i) * dv, double(part_lse[bh * n + i]), dv);
    }
}

template <class A>
void merge_any(const TensorView& acc, double* lse, std::int64_t row0, const void* part, DType dtype,
               const float* part_lse, std::int64_t BH, std::int64_t n, std::int64_t dv) {
  switch (dtype) {
    case DType::f32: merge_part<A>(acc, lse, row0, static_cast<const float*>(part), part_lse, BH, n, dv); break;
    case DType::f64: merge_part<A>(acc, lse, row0, static_cast<const double*>(part), part_lse, BH, n, dv); break;
    case DType::bf16: merge_part<A>(acc, lse, row0, static_cast<const bfloat16*>(part), part_lse, BH, n, dv); break;
    case DType::f16: merge_part<A>(acc, lse, row0, static_cast<const float16*>(part), part_lse, BH, n, dv); break;
    default: throw Error("q", "dtype " + std::string(dtype_name(dtype)) + " (expected f32, f64, bf16 or f16)");
  }
}

// The accumulator's rows narrowed to out's dtype S (zeros where lse is -inf).
template <class S, class A>
void write_typed(const TensorView& acc, const std::vector<double>& lse, const TensorView& out) {
  const std::int64_t dv = acc.shape[3];
  for (std::size_t r = 0; r < lse.size(); ++r) {
    const A* a = row_of<A>(acc, static_cast<std::int64_t>(r));
    S* dst = row_of<S>(out, static_cast<std::int64_t>(r));
    const bool none = lse[r] == -kInf;
    for (std::int64_t d = 0; d < dv; ++d)
      dst[d * out.strides[3]] = none ? S{} : narrow<S>(static_cast<double>(a[d * acc.strides[3]]));
  }
}

template <class A>
void write_any(const TensorView& acc, const std::vector<double>& lse, const TensorView& out) {
  switch (out.dtype) {
    case DType::f32: write_typed<float, A>(acc, lse, out); break;
    case DType::f64: write_typed<double, A>(acc, lse, out); break;
    case DType::bf16: write_typed<bfloat16, A>(acc, lse, out); break;
    case DType::f16: write_typed<float16, A>(acc, lse, out); break;
    default: throw Error("out", "dtype " + std::string(dtype_name(out.dtype)) + " (expected f32, f64, bf16 or f16)");
  }
}

}  // namespace

void Accumulator::reset(const Shape4& shape, DType dtype, const TensorView& out) {
  shape_ = shape;
  dtype_ = dtype == DType::f64 ? DType::f64 : DType::f32;
  out_ = out;
  const std::int64_t rows = shape[0] * shape[1] * shape[2];
  lse_.assign(static_cast<std::size_t>(rows), -kInf);
  if (!out.empty() && out.dtype == dtype_) {
    acc_ = out;
  } else {
    const auto n = static_cast<std::size_t>(rows * shape[3]);
    void* data = dtype_ == DType::f64 ? static_cast<void*>(thread_buffer<double, scratch::MpiAccumulator>().get(n))
                                      : static_cast<void*>(thread_buffer<float, scratch::MpiAccumulator>().get(n));
    acc_ = TensorView(data, dtype_, shape);
  }
}

void Accumulator::attend(std::int64_t row0, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                         const AttentionOptions& options) {
  const std::int64_t B = q.shape[0], H = q.shape[1], n = q.shape[2], Dv = v.shape[3], sq = shape_[2];
  if (B * H * n == 0) return;
  auto& part_lse = thread_buffer<float, scratch::MpiPart>();
  float* lse = part_lse.get(static_cast<std::size_t>(B * H * n));
  AttentionOptions o = options;
  o.lse = TensorView(lse, {B, H, n, 1});
  // The first part to reach these rows (every one still -inf) goes straight into the accumulator.
  bool first = q.dtype == dtype_;
  for (std::int64_t bh = 0; bh < B * H && first; ++bh)
    for (std::int64_t i = 0; i < n && first; ++i) first = lse_[static_cast<std::size_t>(bh * sq + row0 + i)] == -kInf;
  if (first) {
    TensorView rows = acc_;
    rows.data = static_cast<unsigned char*>(acc_.data) + row0 * acc_.strides[2] * static_cast<std::int64_t>(dtype_size(dtype_));
    rows.shape[2] = n;
    attention(q, k, v, rows, o);
    for (std::int64_t bh = 0; bh < B * H; ++bh)
      for (std::int64_t i = 0; i < n; ++i) lse_[static_cast<std::size_t>(bh * sq + row0 + i)] = lse[bh * n + i];
    return;
  }
  auto& scratch = thread_buffer<unsigned char, scratch::MpiPart>();
  unsigned char* part = scratch.get(static_cast<std::size_t>(B * H * n * Dv) * dtype_size(q.dtype));
  attention(q, k, v, TensorView(part, q.dtype, {B, H, n, Dv}), o);
  if (dtype_ == DType::f64) merge_any<double>(acc_, lse_.data(), row0, part, q.dtype, lse, B * H, n, Dv);
  else merge_any<float>(acc_, lse_.data(), row0, part, q.dtype, lse, B * H, n, Dv);
}

void Accumulator::export_rows(double* dst) const {
  const std::int64_t dv = shape_[3];
  for (std::size_t r = 0; r < lse_.size(); ++r) {
    double* row = dst + static_cast<std::int64_t>(r) * (dv + 1);
    const bool none = lse_[r] == -kInf;
    const auto st = acc_.strides[3];
    for (std::int64_t d = 0; d < dv; ++d) {
      const auto ri = static_cast<std::int64_t>(r);
      row[d] = none ? 0.0 : dtype_ == DType::f64 ? row_of<double>(acc_, ri)[d * st] : double(row_of<float>(acc_, ri)[d * st]);
    }
    row[dv] = lse_[r];
  }
}

void Accumulator::finish(std::span<const float> sinks, const TensorView& lse) {
  const std::int64_t H = shape_[1], sq = shape_[2], dv = shape_[3];
  for (std::size_t r = 0; r < lse_.size(); ++r) {
    double& l = lse_[r];
    const auto ri = static_cast<std::int64_t>(r);
    double w = l == -kInf ? 0.0 : 1.0;  // the rows' scale: 0 for a row no key reached, the sink's share taken out
    if (!sinks.empty() && !std::isnan(l)) w *= merge_states(l, sinks[static_cast<std::size_t>(ri / sq % H)]).a;
    if (w == 1.0) continue;
    const auto st = acc_.strides[3];
    if (dtype_ == DType::f64) {
      double* a = row_of<double>(acc_, ri);
      for (std::int64_t d = 0; d < dv; ++d) a[d * st] = w == 0.0 ? 0.0 : a[d * st] * w;
    } else {
      float* a = row_of<float>(acc_, ri);
      for (std::int64_t d = 0; d < dv; ++d) a[d * st] = w == 0.0 ? 0.0f : a[d * st] * static_cast<float>(w);
    }
  }
  if (!out_.empty() && acc_.data != out_.data) {
    if (dtype_ == DType::f64) write_any<double>(acc_, lse_, out_);
    else write_any<float>(acc_, lse_, out_);
  }
  if (!lse.empty())
    for (std::size_t r = 0; r < lse_.size(); ++r) {
      const auto ri = static_cast<std::int64_t>(r);
      const std::int64_t b = ri / (H * sq), h = ri / sq % H, i = ri % sq;
      static_cast<float*>(lse.data)[b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]] = static_cast<float>(lse_[r]);
    }
}

void write_rows(const Partial& part, std::int64_t heads, std::int64_t sq, const TensorView& out,
                const TensorView& lse) {
  const std::int64_t dv = part.dv();
  for (std::int64_t r = 0; r < part.rows(); ++r) {
    const std::int64_t b = r / (heads * sq), h = r / sq % heads, i = r % sq;
    const double* row = part.row(r);
    const std::int64_t base = b * out.strides[0] + h * out.strides[1] + i * out.strides[2];
    for (std::int64_t d = 0; d < dv; ++d) store_at(out.data, out.dtype, base + d * out.strides[3], row[d]);
    if (!lse.empty())
      static_cast<float*>(lse.data)[b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]] =
          static_cast<float>(row[dv]);
  }
}

}  // namespace simdattn::detail::mpi
