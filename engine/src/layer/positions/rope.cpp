// Rotary position embeddings (simdattn/rope.hpp).
#include "simdattn/rope.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "layer/positions/rope_table.hpp"
#include "simdattn/error.hpp"

namespace simdattn {

void apply_rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeConfig& config) {
  if (x.dtype != DType::f32 && x.dtype != DType::f64 && x.dtype != DType::bf16 && x.dtype != DType::f16)
    throw Error("x", "dtype must be f32, f64, bf16 or f16, got " + std::string(dtype_name(x.dtype)));
  for (int d = 0; d < 4; ++d)
    if (x.shape[d] < 0 || x.strides[d] < 0) throw Error("x", "negative size or stride in " + detail::shape_str(x.shape));
  const std::int64_t B = x.shape[0], H = x.shape[1], S = x.shape[2], hd = x.shape[3];
  const detail::RopeTable table = detail::rope_table(config, hd, x.dtype == DType::f64);
  if (!positions.empty() && static_cast<std::int64_t>(positions.size()) != B * S)
    throw Error("positions", "expected B*S = " + std::to_string(B * S) + " entries, got " + std::to_string(positions.size()));
  for (std::size_t i = 0; i < positions.size(); ++i)
    if (positions[i] < 0) throw Error("positions", "entry " + std::to_string(i) + " is negative");
  if (B * H * S * hd == 0) return;
  if (x.data == nullptr) throw Error("x", "null data pointer");
  std::vector<double> cs(table.inv_freq.size() * 2);
  auto rotate_all = [&](auto* data) {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s) {
        detail::rope_angles(table, positions.empty() ? s : positions[static_cast<std::size_t>(b * S + s)], cs.data());
        for (std::int64_t h = 0; h < H; ++h)
          detail::rope_rotate(table, cs.data(), data + b * x.strides[0] + h * x.strides[1] + s * x.strides[2], x.strides[3]);
      }
  };
  detail::visit_dtype(x.dtype, [&](auto t) { rotate_all(static_cast<decltype(t)*>(x.data)); });
}

}  // namespace simdattn
