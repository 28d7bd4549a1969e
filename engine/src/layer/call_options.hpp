// The checks of a layer call's arguments and the attention core's options built from them: the
// call's masks merged into one, the layer's score options, the attention-weights output.
#pragma once

#include <cstdint>

#include "simdattn/attention.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

// A sequence argument `name`: the layer's dtype, [B (any if B < 0), S, E], data unless empty.
void check_seq(const char* name, const ConstSeqView& s, DType dtype, std::int64_t B, std::int64_t E);

// The rows of `s` through the layer's widest buffer (`width` values a row, the projections' or
// the input's): B * S * width elements of `element_size` bytes must be countable and addressable.
void check_rows(const char* name, const ConstSeqView& s, std::int64_t width, std::int64_t element_size);

// The output: the layer's dtype, [B, S, E], data unless empty.
void check_out(const SeqView& o, DType dtype, std::int64_t B, std::int64_t S, std::int64_t E);

// The attention options of one call: causal, threads, backend, and the key padding mask and
// additive mask combined into one mask from this thread's buffers (in f32 for a 16-bit layer,
// else in the layer's dtype).
AttentionOptions attention_options(const MhaOptions& o, DType layer_dtype, std::int64_t B, std::int64_t H,
                                   std::int64_t Sq, std::int64_t Sk);

// The layer's score options on the attention core.
void add_config_options(const MhaConfig& c, AttentionOptions& a);

// MhaOptions::attn_weights on the attention core's scores output (softmax stage): directly when
// per head; through a per-head buffer when averaged (average_weights then writes the mean).
struct WeightsOut {
  bool average = false;
  TensorView per_head;  // what the core writes
};
WeightsOut weights_output(const MhaOptions& o, std::int64_t B, std::int64_t H, std::int64_t Sq, std::int64_t Sk,
                          AttentionOptions& a);
// The mean over the heads into `out`, when averaged.
void average_weights(const WeightsOut& w, const TensorView& out);

}  // namespace simdattn::detail
