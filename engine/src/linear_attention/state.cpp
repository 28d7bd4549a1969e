// LinearAttentionState (simdattn/linear.hpp): the recurrent form of linear attention, one token
// at a time over a running state, summed in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/validate/validate.hpp"
#include "linear_attention/phi.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"

namespace simdattn {

LinearAttentionState::LinearAttentionState(DType dtype, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                           std::int64_t head_dim, std::int64_t value_dim, FeatureMap feature_map,
                                           double eps)
    : dtype_(dtype), B_(batch), H_(heads), Hkv_(kv_heads), D_(head_dim), Dv_(value_dim), phi_(feature_map), eps_(eps) {
  detail::check_isa();
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error("dtype", "expected f32, f64, bf16 or f16, got " + std::string(dtype_name(dtype)));
  if (batch < 1 || heads < 1 || kv_heads < 1 || head_dim < 1 || value_dim < 1)
    throw Error("shape", "batch, heads, kv_heads, head_dim and value_dim must be >= 1");
  if (heads % kv_heads != 0)
    throw Error("kv_heads", "expected a divisor of heads " + std::to_string(heads) + ", got " + std::to_string(kv_heads));
  if (!(eps >= 0.0) || !std::isfinite(eps)) throw Error("eps", "must be finite and >= 0");
  s_.assign(static_cast<std::size_t>(B_ * Hkv_ * D_ * (Dv_ + 1)), 0.0);
  fq_.assign(static_cast<std::size_t>(D_), 0.0);
}

void LinearAttentionState::reset() noexcept {
  std::fill(s_.begin(), s_.end(), 0.0);
  tokens_ = 0;
}

namespace {

void check_step_view(const char* name, const ConstTensorView& t, DType dtype, const Shape4& want) {
  if (t.dtype != dtype)
    throw Error(name, "dtype " + std::string(dtype_name(t.dtype)) + " differs from the state's " +
                          std::string(dtype_name(dtype)));
  if (t.shape != want)
    throw Error(name, "expected shape [" + std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", 1, " +
                          std::to_string(want[3]) + "], got [" + std::to_string(t.shape[0]) + ", " +
                          std::to_string(t.shape[1]) + ", " + std::to_string(t.shape[2]) + ", " +
                          std::to_string(t.shape[3]) + "]");
  if (t.data == nullptr) throw Error(name, "null data");
  for (int d = 0; d < 4; ++d)
    if (t.strides[d] < 0) throw Error(name, "negative stride");
}

// Element [a, b, 0, d] of a step's view, widened exactly.
double at(const ConstTensorView& t, std::int64_t a, std::int64_t b, std::int64_t d) {
  return detail::widen_at(t.data, t.dtype, a * t.strides[0] + b * t.strides[1] + d * t.strides[3]);
}

}  // namespace

void LinearAttentionState::step(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                                const TensorView& out) {
  check_step_view("q", q, dtype_, {B_, H_, 1, D_});
  check_step_view("k", k, dtype_, {B_, Hkv_, 1, D_});
  check_step_view("v", v, dtype_, {B_, Hkv_, 1, Dv_});
  check_step_view("out", ConstTensorView(out.data, out.dtype, out.shape, out.strides), dtype_, {B_, H_, 1, Dv_});
  const std::int64_t W = Dv_ + 1, group = H_ / Hkv_;
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t hk = 0; hk < Hkv_; ++hk) {
      double* s = s_.data() + (b * Hkv_ + hk) * D_ * W;
      for (std::int64_t d = 0; d < D_; ++d) {
        const double f = phi<double>(phi_, at(k, b, hk, d));
        for (std::int64_t e = 0; e < Dv_; ++e) s[d * W + e] += f * at(v, b, hk, e);
        s[d * W + Dv_] += f;
      }
    }
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t h = 0; h < H_; ++h) {
      const double* s = s_.data() + (b * Hkv_ + h / group) * D_ * W;
      for (std::int64_t d = 0; d < D_; ++d)
        fq_[static_cast<std::size_t>(d)] = phi<double>(phi_, at(q, b, h, d));
      double den = eps_;
      for (std::int64_t d = 0; d < D_; ++d) den += fq_[static_cast<std::size_t>(d)] * s[d * W + Dv_];
      for (std::int64_t e = 0; e < Dv_; ++e) {
        double num = 0.0;
        for (std::int64_t d = 0; d < D_; ++d) num += fq_[static_cast<std::size_t>(d)] * s[d * W + e];
        const std::int64_t off = b * out.strides[0] + h * out.strides[1] + e * out.strides[3];
        detail::store_at(out.data, dtype_, off, num / den);  // rounded once, to nearest even
      }
    }
  ++tokens_;
}

}  // namespace simdattn
