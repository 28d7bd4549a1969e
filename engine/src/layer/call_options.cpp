// The checks of a layer call's arguments and the attention core's options (call_options.hpp).
#include "layer/call_options.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "core/element.hpp"
#include "core/problem.hpp"
#include "core/text.hpp"
#include "layer/storage.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

void check_seq(const char* name, const ConstSeqView& s, DType dtype, std::int64_t B, std::int64_t E) {
  if (s.dtype != dtype)
    throw Error(name, "dtype " + std::string(dtype_name(s.dtype)) + " differs from the layer's " +
                          std::string(dtype_name(dtype)));
  if (s.B < 0 || s.S < 0 || (B >= 0 && s.B != B) || s.E != E)
    throw Error(name, "expected shape " + std::string(B >= 0 ? "[B=" + std::to_string(B) : "[B") +
                          ", S, E=" + std::to_string(E) + "], got " + shape_str({s.B, s.S, s.E}));
  if (s.data == nullptr && s.B * s.S * s.E != 0) throw Error(name, "null data");
}

void check_rows(const char* name, const ConstSeqView& s, std::int64_t width, std::int64_t element_size) {
  std::int64_t n = 0;
  if (__builtin_mul_overflow(s.B, s.S, &n) || __builtin_mul_overflow(n, width, &n) ||
      n > std::numeric_limits<std::int64_t>::max() / element_size)
    throw Error(name, "size overflow: " + shape_str({s.B, s.S, s.E}) + " through this layer's " + std::to_string(width) +
                          "-wide projections");
}

void check_out(const SeqView& o, DType dtype, std::int64_t B, std::int64_t S, std::int64_t E) {
  if (o.dtype != dtype)
    throw Error("out", "dtype " + std::string(dtype_name(o.dtype)) + " differs from the layer's " +
                           std::string(dtype_name(dtype)));
  if (o.B != B || o.S != S || o.E != E)
    throw Error("out", "expected shape " + shape_str({B, S, E}) + ", got " + shape_str({o.B, o.S, o.E}));
  if (o.data == nullptr && B * S * E != 0) throw Error("out", "null data");
}

namespace {

// The key padding mask [B, Sk] and an additive mask broadcast to [B, mh, mi, Sk] (am's head and
// query sizes), padded keys -inf, in M.
template <class M>
ConstTensorView merged_mask(const MhaOptions& o, std::int64_t B, std::int64_t Sk) {
  const ConstTensorView& am = o.attn_mask;
  const std::int64_t mh = am.shape[1], mi = am.shape[2];
  M* m = thread_buffer<M, scratch::MhaMask>().get(static_cast<std::size_t>(B * mh * mi * Sk));
  const M neg_inf = -std::numeric_limits<M>::infinity();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < mh; ++h)
      for (std::int64_t i = 0; i < mi; ++i)
        for (std::int64_t j = 0; j < Sk; ++j) {
          const std::int64_t off = (am.shape[0] == 1 ? 0 : b) * am.strides[0] + h * am.strides[1] +
                                   i * am.strides[2] + (am.shape[3] == 1 ? 0 : j) * am.strides[3];
          const M x = static_cast<M>(widen_at(am.data, am.dtype, off));
          m[((b * mh + h) * mi + i) * Sk + j] = o.key_padding_mask[static_cast<std::size_t>(b * Sk + j)] ? neg_inf : x;
        }
  return ConstTensorView(m, {B, mh, mi, Sk});
}

}  // namespace

AttentionOptions attention_options(const MhaOptions& o, DType layer_dtype, std::int64_t B, std::int64_t H,
                                   std::int64_t Sq, std::int64_t Sk) {
  AttentionOptions a;
  a.causal = o.causal;
  a.threads = o.threads;
  a.backend = o.backend;
  const bool padding = !o.key_padding_mask.empty();
  const bool additive = view_given(o.attn_mask);
  const DType md = o.attn_mask.dtype;
  if (additive && md != DType::f32 && md != DType::f64 && md != DType::bf16 && md != DType::f16)
    throw Error("options.attn_mask", "expected an additive f32, f64, bf16 or f16 mask, got " +
                                         std::string(dtype_name(md)));
  if (padding && static_cast<std::int64_t>(o.key_padding_mask.size()) != B * Sk)
    throw Error("options.key_padding_mask", "expected B*Sk = " + std::to_string(B) + "*" + std::to_string(Sk) +
                                                " entries ([B, Sk]), got " + std::to_string(o.key_padding_mask.size()));
  if (padding && !additive) {
    std::uint8_t* m = thread_buffer<std::uint8_t, scratch::MhaPaddingMask>().get(static_cast<std::size_t>(B * Sk));
    for (std::int64_t i = 0; i < B * Sk; ++i) m[i] = o.key_padding_mask[static_cast<std::size_t>(i)] ? 0 : 1;
    a.mask = ConstTensorView(m, DType::u8, {B, 1, 1, Sk});
  } else if (additive && !padding) {
    a.mask = o.attn_mask;
  } else if (additive && padding) {
    const ConstTensorView& am = o.attn_mask;
    for (int d = 0; d < 4; ++d)
      if (am.shape[d] < 1 || am.strides[d] < 0)
        throw Error("options.attn_mask", "needs sizes >= 1 and strides >= 0 (shape " +
                                             shape_str({am.shape[0], am.shape[1], am.shape[2], am.shape[3]}) + ")");
    if (am.data == nullptr) throw Error("options.attn_mask", "null data");
    const Shape4 target{B, H, Sq, Sk};
    for (int d = 0; d < 4; ++d)
      if (am.shape[d] != target[d] && am.shape[d] != 1)
        throw Error("options.attn_mask", "shape " + shape_str({am.shape[0], am.shape[1], am.shape[2], am.shape[3]}) +
                                             " does not broadcast to " + shape_str({B, H, Sq, Sk}));
    // a 16-bit layer's combined mask in f32
    a.mask = layer_dtype == DType::f64 ? merged_mask<double>(o, B, Sk) : merged_mask<float>(o, B, Sk);
  }
  return a;
}

void add_config_options(const MhaConfig& c, AttentionOptions& a) {
  a.scale = c.scale;
  a.softcap = c.softcap;
  if (c.window) a.window = c.window;
  a.alibi_slopes = c.alibi_slopes;
  a.sinks = c.sinks;
  if (!c.t5_table.empty()) {
    const auto buckets = static_cast<std::int64_t>(c.t5_table.size()) / c.heads;
    a.relative_bias = RelativePositionBias{ConstTensorView(c.t5_table.data(), {1, 1, buckets, c.heads}),
                                           c.t5_bidirectional, c.t5_max_distance};
  }
}

WeightsOut weights_output(const MhaOptions& o, std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                          AttentionOptions& a) {
  WeightsOut w;
  if (!view_given(o.attn_weights)) return w;
  const TensorView& v = o.attn_weights;
  if (v.dtype != DType::f32 && v.dtype != DType::f64)
    throw Error("options.attn_weights", "dtype must be f32 or f64, got " + std::string(dtype_name(v.dtype)));
  if (v.shape[0] != B || (v.shape[1] != H && v.shape[1] != 1) || v.shape[2] != Sq || v.shape[3] != Sk)
    throw Error("options.attn_weights", "expected [B, H, Sq, Sk] = " + shape_str({B, H, Sq, Sk}) + " or [B, 1, Sq, Sk], got " +
                                            shape_str(v.shape));
  w.average = v.shape[1] != H;
  if (w.average) {
    const std::size_t n = static_cast<std::size_t>(B * H * Sq * Sk) * dtype_size(v.dtype);
    w.per_head = TensorView(thread_buffer<std::byte, scratch::MhaWeights>().get(n), v.dtype, {B, H, Sq, Sk});
  } else {
    w.per_head = v;
  }
  a.scores = w.per_head;
  a.scores_stage = ScoreStage::softmax;
  return w;
}

void average_weights(const WeightsOut& w, const TensorView& out) {
  if (!w.average) return;
  const Shape4& s = w.per_head.shape;
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t i = 0; i < s[2]; ++i)
      for (std::int64_t j = 0; j < s[3]; ++j) {
        double sum = 0;
        for (std::int64_t h = 0; h < s[1]; ++h)
          sum += widen_at(w.per_head.data, w.per_head.dtype, ((b * s[1] + h) * s[2] + i) * s[3] + j);
        store_at(out.data, out.dtype, b * out.strides[0] + i * out.strides[2] + j * out.strides[3],
                 sum / static_cast<double>(s[1]));
      }
}

}  // namespace simdattn::detail
