// The C API's Gated DeltaNet layer and its state (simdattn.h, C API 6) over
// simdattn/gated_delta_net.hpp.
#include <cstdint>
#include <optional>

#include "c_api/translate.hpp"
#include "simdattn/error.hpp"
#include "simdattn/gated_delta_net.hpp"
#include "simdattn/simdattn.h"

struct simdattn_gdn {
  simdattn::GatedDeltaNet layer;
};
struct simdattn_gdn_state {
  simdattn::GatedDeltaNetState state;
};

using namespace simdattn;
using namespace simdattn::c_api;

simdattn_status simdattn_gdn_from_pretrained(const char* dir, int64_t layer_index, int has_dtype, simdattn_dtype dtype,
                                             simdattn_gdn** layer) {
  if (layer != nullptr) *layer = nullptr;
  return guarded([&] {
    require(layer, "layer");
    require(dir, "dir");
    std::optional<DType> t;
    if (has_dtype != 0) t = dtype_of_c(dtype, "dtype");
    *layer = new simdattn_gdn{GatedDeltaNet::from_pretrained(dir, layer_index, t)};
  });
}

void simdattn_gdn_free(simdattn_gdn* layer) { delete layer; }

simdattn_status simdattn_gdn_get_info(const simdattn_gdn* layer, int64_t* hidden_size, int64_t* key_heads,
                                      int64_t* value_heads, int64_t* key_head_dim, int64_t* value_head_dim,
                                      int64_t* conv_kernel, simdattn_dtype* dtype) {
  return guarded([&] {
    require(layer, "layer");
    const GatedDeltaNetConfig& c = layer->layer.config();
    if (hidden_size != nullptr) *hidden_size = c.hidden_size;
    if (key_heads != nullptr) *key_heads = c.key_heads;
    if (value_heads != nullptr) *value_heads = c.value_heads;
    if (key_head_dim != nullptr) *key_head_dim = c.key_head_dim;
    if (value_head_dim != nullptr) *value_head_dim = c.value_head_dim;
    if (conv_kernel != nullptr) *conv_kernel = c.conv_kernel;
    if (dtype != nullptr) *dtype = dtype_to_c(layer->layer.dtype());
  });
}

simdattn_status simdattn_gdn_forward(const simdattn_gdn* layer, const simdattn_seq* x, const simdattn_seq* out,
                                     simdattn_gdn_state* state, int threads) {
  return guarded([&] {
    require(layer, "layer");
    layer->layer.forward(seq_of<ConstSeqView>(x, "x"), seq_of<SeqView>(out, "out"),
                         state != nullptr ? &state->state : nullptr, threads);
  });
}

simdattn_status simdattn_gdn_state_create(const simdattn_gdn* layer, int64_t batch, simdattn_gdn_state** state) {
  if (state != nullptr) *state = nullptr;
  return guarded([&] {
    require(state, "state");
    require(layer, "layer");
    *state = new simdattn_gdn_state{GatedDeltaNetState(layer->layer, batch)};
  });
}

void simdattn_gdn_state_free(simdattn_gdn_state* state) { delete state; }

simdattn_status simdattn_gdn_state_reset(simdattn_gdn_state* state) {
  return guarded([&] {
    require(state, "state");
    state->state.reset();
  });
}

simdattn_status simdattn_gdn_state_get_info(const simdattn_gdn_state* state, int64_t* bytes, int64_t* tokens) {
  return guarded([&] {
    require(state, "state");
    if (bytes != nullptr) *bytes = state->state.bytes();
    if (tokens != nullptr) *tokens = state->state.tokens();
  });
}
