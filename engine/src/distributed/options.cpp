#include "distributed/options.hpp"

#include <cmath>
#include <cstring>

#include "core/text.hpp"

namespace simdattn::detail::mpi {

namespace {

std::int64_t bits_of(double d) {
  std::int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

}  // namespace

void describe(Shared& shared, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
              const AttentionOptions& options, bool same_queries) {
  shared.add("q.shape[0]", q.shape[0]);
  shared.add("q.shape[1]", q.shape[1]);
  if (same_queries) shared.add("q.shape[2]", q.shape[2]);
  shared.add("q.shape[3]", q.shape[3]);
  shared.add("q.dtype", static_cast<std::int64_t>(q.dtype));
  shared.add("k.shape[0]", k.shape[0]);
  shared.add("k.shape[1]", k.shape[1]);
  shared.add("k.shape[3]", k.shape[3]);
  shared.add("k.dtype", static_cast<std::int64_t>(k.dtype));
  shared.add("v.shape[3]", v.shape[3]);
  shared.add("options.scale", options.scale ? bits_of(*options.scale) : 0);
  shared.add("options.causal", static_cast<std::int64_t>(options.causal));
  shared.add("options.window", options.window ? options.window->left : -2);
  shared.add("options.window", options.window ? options.window->right : -2);
  shared.add("options.softcap", options.softcap ? bits_of(*options.softcap) : 0);
  shared.add_bytes("options.key_lengths", options.key_lengths.data(), options.key_lengths.size_bytes());
  shared.add_bytes("options.query_offsets", options.query_offsets.data(), options.query_offsets.size_bytes());
  shared.add_bytes("options.alibi_slopes", options.alibi_slopes.data(), options.alibi_slopes.size_bytes());
  shared.add_bytes("options.sinks", options.sinks.data(), options.sinks.size_bytes());
  const bool t5 = options.relative_bias.has_value();
  shared.add("options.relative_bias", t5 ? options.relative_bias->table.shape[2] : -1);
  shared.add("options.relative_bias.bidirectional", t5 ? options.relative_bias->bidirectional : -1);
  shared.add("options.relative_bias.max_distance", t5 ? options.relative_bias->max_distance : -1);
  shared.add("options.mask", options.mask.empty() ? -1 : static_cast<std::int64_t>(options.mask.dtype));
  shared.add("options.backend", static_cast<std::int64_t>(options.backend));
}

void refuse_local_positions(const AttentionOptions& options, const char* what) {
  std::string why = what;
  why += " does not take it (its positions are the local key index)";
  if (options.global_tokens != 0) throw Error("options.global_tokens", why);
  if (!options.block_mask.empty()) throw Error("options.block_mask", why);
  if (!options.scores.empty()) throw Error("options.scores", why);
}

void check_outputs(DType q_dtype, const Shape4& shape, const TensorView& out, const TensorView& lse) {
  if (out.dtype != q_dtype)
    throw Error("out", "expected dtype " + std::string(dtype_name(q_dtype)) + " (q's), got " + std::string(dtype_name(out.dtype)));
  if (out.shape != shape) throw Error("out", "expected shape " + shape_text(shape) + ", got " + shape_text(out.shape));
  if (out.data == nullptr && shape[0] * shape[1] * shape[2] * shape[3] > 0) throw Error("out", "is empty");
  if (!lse.empty()) {
    const Shape4 lse_shape{shape[0], shape[1], shape[2], 1};
    if (lse.dtype != DType::f32 || lse.shape != lse_shape)
      throw Error("options.lse", "expected f32 " + shape_text(lse_shape) + ", got " + std::string(dtype_name(lse.dtype)) +
                                     " " + shape_text(lse.shape));
  }
}

void check_sinks(const AttentionOptions& options, std::int64_t heads) {
  if (!options.sinks.empty() && static_cast<std::int64_t>(options.sinks.size()) != heads)
    throw Error("options.sinks", "expected " + std::to_string(heads) + " sinks (one per head), got " +
                                     std::to_string(options.sinks.size()));
  for (float s : options.sinks)
    if (!std::isfinite(s)) throw Error("options.sinks", "expected finite logits");
}

std::string shape_text(const Shape4& s) { return shape_str(std::span<const std::int64_t>(s.data(), s.size())); }

}  // namespace simdattn::detail::mpi
