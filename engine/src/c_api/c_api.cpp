// The C API (simdattn/simdattn.h) over the C++ API: attention, linear attention, the runtime.
// Each function checks its structs' sizes, converts them to the C++ options and runs the C++
// call inside `guarded` (translate.hpp); the layer's functions are in mha.cpp.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "c_api/translate.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"
#include "simdattn/runtime.hpp"
#include "simdattn/simdattn.h"
#include "simdattn/version.hpp"

namespace {

using namespace simdattn;
using namespace simdattn::c_api;

AttentionOptions attention_options(const simdattn_attention_options* c) {
  AttentionOptions o;
  const std::optional<simdattn_attention_options> given = read_options(c, {offsetof(simdattn_attention_options, k_scale)}, o);
  if (!given) return o;
  const simdattn_attention_options& s = *given;
  o.mask = optional_view<ConstTensorView>(s.mask, "options.mask");
  o.key_lengths = span_of(s.key_lengths, s.key_lengths_count, "options.key_lengths");
  o.global_tokens = s.global_tokens;
  o.block_mask = optional_view<ConstTensorView>(s.block_mask, "options.block_mask");
  o.block_size = s.block_size;
  if (s.relative_bias_table.data != nullptr)
    o.relative_bias = RelativePositionBias{
        optional_view<ConstTensorView>(s.relative_bias_table, "options.relative_bias_table"),
        s.relative_bias_bidirectional != 0, s.relative_bias_max_distance};
  o.query_offsets = span_of(s.query_offsets, s.query_offsets_count, "options.query_offsets");
  o.lse = optional_view<TensorView>(s.lse, "options.lse");
  o.scores = optional_view<TensorView>(s.scores, "options.scores");
  switch (s.scores_stage) {
    case SIMDATTN_SCORES_SCALED: o.scores_stage = ScoreStage::scaled; break;
    case SIMDATTN_SCORES_CAPPED: o.scores_stage = ScoreStage::capped; break;
    case SIMDATTN_SCORES_BIASED: o.scores_stage = ScoreStage::biased; break;
    case SIMDATTN_SCORES_SOFTMAX: o.scores_stage = ScoreStage::softmax; break;
    default:
      throw Error("options.scores_stage", "expected SIMDATTN_SCORES_SCALED, _CAPPED, _BIASED or _SOFTMAX, got " +
                                              std::to_string(static_cast<long long>(s.scores_stage)));
  }
  return o;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

extern "C" {

const char* simdattn_status_string(simdattn_status status) {
  switch (status) {
    case SIMDATTN_OK: return "ok";
    case SIMDATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case SIMDATTN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case SIMDATTN_ERROR_VERSION: return "struct version mismatch";
    case SIMDATTN_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* simdattn_version(void) { return kVersionString; }
int simdattn_c_api_version(void) { return SIMDATTN_C_API_VERSION; }

simdattn_tensor simdattn_tensor_contiguous(void* data, simdattn_dtype dtype, int64_t d0, int64_t d1, int64_t d2,
                                           int64_t d3) {
  simdattn_tensor t = empty_tensor();
  t.data = data;
  t.dtype = dtype;
  t.shape[0] = d0, t.shape[1] = d1, t.shape[2] = d2, t.shape[3] = d3;
  t.strides[3] = 1, t.strides[2] = d3, t.strides[1] = d2 * d3, t.strides[0] = d1 * d2 * d3;
  return t;
}

void simdattn_attention_options_init(simdattn_attention_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->scale = 0.0;
  o->causal = SIMDATTN_CAUSAL_NONE;
  o->mask = o->block_mask = o->relative_bias_table = o->lse = o->scores = o->k_scale = o->v_scale = empty_tensor();
  o->window_left = o->window_right = -1;
  o->block_size = 64;
  o->relative_bias_bidirectional = 1;
  o->relative_bias_max_distance = 128;
  o->scores_stage = SIMDATTN_SCORES_SOFTMAX;
  o->backend = SIMDATTN_BACKEND_NATIVE;
}

simdattn_status simdattn_attention(const simdattn_tensor* q, const simdattn_tensor* k, const simdattn_tensor* v,
                                   const simdattn_tensor* out, const simdattn_attention_options* options) {
  return guarded([&] {
    attention(view_of<ConstTensorView>(q, "q"), view_of<ConstTensorView>(k, "k"), view_of<ConstTensorView>(v, "v"),
              view_of<TensorView>(out, "out"), attention_options(options));
  });
}

simdattn_status simdattn_attention_output_shape(const simdattn_tensor* q, const simdattn_tensor* k,
                                                const simdattn_tensor* v, int64_t shape[4]) {
  return guarded([&] {
    require(shape, "shape");
    const Shape4 s = attention_output_shape(view_of<ConstTensorView>(q, "q"), view_of<ConstTensorView>(k, "k"),
                                            view_of<ConstTensorView>(v, "v"));
    for (int i = 0; i < 4; ++i) shape[i] = s[i];
  });
}

simdattn_status simdattn_quantize_kv(const simdattn_tensor* x, simdattn_dtype code, const simdattn_tensor* codes,
                                     const simdattn_tensor* scales) {
  return guarded([&] {
    quantize_kv(view_of<ConstTensorView>(x, "x"), dtype_of_c(code, "code"), view_of<TensorView>(codes, "codes"),
                view_of<TensorView>(scales, "scales"));
  });
}

simdattn_status simdattn_dequantize_kv(const simdattn_tensor* codes, const simdattn_tensor* scales,
                                       const simdattn_tensor* out) {
  return guarded([&] {
    dequantize_kv(view_of<ConstTensorView>(codes, "codes"), view_of<ConstTensorView>(scales, "scales"),
                  view_of<TensorView>(out, "out"));
  });
}

simdattn_status simdattn_standard_alibi_slopes(int64_t heads, float* slopes) {
  return guarded([&] {
    require(slopes, "slopes");
    const std::vector<float> s = standard_alibi_slopes(heads);
    std::memcpy(slopes, s.data(), s.size() * sizeof(float));
  });
}

void simdattn_linear_options_init(simdattn_linear_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->feature_map = SIMDATTN_FEATURE_ELU1;
  o->eps = 1e-6;
  o->chunk = 64;
  o->backend = SIMDATTN_BACKEND_NATIVE;
}

void simdattn_gated_delta_options_init(simdattn_gated_delta_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->initial_state.struct_size = sizeof(simdattn_tensor);
  options->final_state.struct_size = sizeof(simdattn_tensor);
}

simdattn_status simdattn_gated_delta_rule(const simdattn_tensor* q, const simdattn_tensor* k, const simdattn_tensor* v,
                                          const simdattn_tensor* g, const simdattn_tensor* beta, const simdattn_tensor* out,
                                          const simdattn_gated_delta_options* options) {
  return guarded([&] {
    GatedDeltaRuleOptions o;
    if (options != nullptr) {
      // C API 5's struct ends before has_scale: its scale 0 is the default
      constexpr std::size_t kV5 = offsetof(simdattn_gated_delta_options, has_scale);
      const simdattn_gated_delta_options s = checked_options(options, "options", {kV5});
      if (options->struct_size == kV5) {
        if (s.scale != 0.0) o.scale = s.scale;
      } else {
        o.scale = optional_double(s.has_scale, s.scale);
      }
      o.initial_state = optional_view<ConstTensorView>(s.initial_state, "options.initial_state");
      o.final_state = optional_view<TensorView>(s.final_state, "options.final_state");
      o.use_qk_l2norm = s.use_qk_l2norm != 0;
      o.threads = s.threads;
    }
    gated_delta_rule(view_of<ConstTensorView>(q, "q"), view_of<ConstTensorView>(k, "k"), view_of<ConstTensorView>(v, "v"),
                     view_of<ConstTensorView>(g, "g"), view_of<ConstTensorView>(beta, "beta"), view_of<TensorView>(out, "out"), o);
  });
}

simdattn_status simdattn_linear_attention(const simdattn_tensor* q, const simdattn_tensor* k,
                                          const simdattn_tensor* v, const simdattn_tensor* out,
                                          const simdattn_linear_options* options) {
  return guarded([&] {
    LinearAttentionOptions o;
    if (options != nullptr) {
      const simdattn_linear_options& s = checked(options, "options");
      o.causal = s.causal != 0;
      switch (s.feature_map) {
        case SIMDATTN_FEATURE_ELU1: o.feature_map = FeatureMap::elu1; break;
        case SIMDATTN_FEATURE_RELU: o.feature_map = FeatureMap::relu; break;
        case SIMDATTN_FEATURE_IDENTITY: o.feature_map = FeatureMap::identity; break;
        default: throw Error("options.feature_map", "expected SIMDATTN_FEATURE_ELU1, _RELU or _IDENTITY");
      }
      o.eps = s.eps;
      o.chunk = s.chunk;
      o.threads = s.threads;
      o.backend = backend_of_c(s.backend, "options.backend");
    }
    linear_attention(view_of<ConstTensorView>(q, "q"), view_of<ConstTensorView>(k, "k"),
                     view_of<ConstTensorView>(v, "v"), view_of<TensorView>(out, "out"), o);
  });
}

simdattn_status simdattn_get_info(simdattn_info* info) {
  // The strings the struct points to: this thread's, until its next call.
  thread_local std::string version, isa, isas, backends, onednn;
  return guarded([&] {
    require(info, "info");
    const RuntimeInfo r = runtime_info();
    version = r.version, isa = r.isa, isas = joined(r.isas), backends = joined(r.backends), onednn = r.onednn_version;
    simdattn_info v;
    std::memset(&v, 0, sizeof v);
    v.version = version.c_str();
    v.isa = isa.c_str();
    v.isa_forced = r.isa_forced ? 1 : 0;
    v.isas = isas.c_str();
    v.backends = backends.c_str();
    v.onednn_version = onednn.c_str();
    v.default_threads = r.default_threads;
    v.thread_budget = r.thread_budget;
    write_out(info, v, "info");
  });
}

simdattn_status simdattn_set_thread_budget(int threads) {
  return guarded([&] { set_thread_budget(threads); });
}

simdattn_status simdattn_set_thread_runtime(simdattn_thread_runtime runtime) {
  return guarded([&] {
    if (runtime != SIMDATTN_THREAD_RUNTIME_TEAM && runtime != SIMDATTN_THREAD_RUNTIME_OPENMP)
      throw Error("runtime", "expected SIMDATTN_THREAD_RUNTIME_TEAM or SIMDATTN_THREAD_RUNTIME_OPENMP, got " +
                                 std::to_string(static_cast<int>(runtime)));
    set_thread_runtime(runtime == SIMDATTN_THREAD_RUNTIME_OPENMP ? ThreadRuntime::openmp : ThreadRuntime::team);
  });
}

simdattn_thread_runtime simdattn_get_thread_runtime(void) {
  return thread_runtime() == ThreadRuntime::openmp ? SIMDATTN_THREAD_RUNTIME_OPENMP : SIMDATTN_THREAD_RUNTIME_TEAM;
}

void simdattn_set_verbose(int on) { set_verbose(on != 0); }

int simdattn_get_verbose(void) { return verbose() ? 1 : 0; }

}  // extern "C"
