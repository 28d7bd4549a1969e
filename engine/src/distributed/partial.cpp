#include "distributed/partial.hpp"

#include <algorithm>

#include "core/element.hpp"

namespace simdattn::detail::mpi {

void attend_into(Partial& part, std::int64_t sq_total, std::int64_t row0, const ConstTensorView& q,
                 const ConstTensorView& k, const ConstTensorView& v, const AttentionOptions& options) {
  const std::int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], Dv = v.shape[3];
  if (B * H * Sq == 0) return;
  const Shape4 out_shape{B, H, Sq, Dv};
  std::vector<unsigned char> out_bytes(static_cast<std::size_t>(B * H * Sq * Dv) * dtype_size(q.dtype));
  std::vector<float> lse(static_cast<std::size_t>(B * H * Sq));
  AttentionOptions o = options;
  o.lse = TensorView(lse.data(), {B, H, Sq, 1});
  attention(q, k, v, TensorView(out_bytes.data(), q.dtype, out_shape), o);
  std::vector<double> row(static_cast<std::size_t>(Dv));
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t i = 0; i < Sq; ++i) {
      const std::int64_t r = bh * Sq + i;
      for (std::int64_t d = 0; d < Dv; ++d)
        row[static_cast<std::size_t>(d)] = widen_at(out_bytes.data(), q.dtype, r * Dv + d);
      Partial::merge_row(part.row(bh * sq_total + row0 + i), Dv, row.data(), lse[static_cast<std::size_t>(r)]);
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
