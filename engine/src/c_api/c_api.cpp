// The C API (simdattn/simdattn.h) over the C++ API: each function checks its structs' sizes,
// converts them to the C++ options and runs the C++ call inside `guarded`, which turns every
// exception into a status and this thread's error message.
#include "simdattn/simdattn.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/runtime.hpp"
#include "simdattn/version.hpp"

struct simdattn_mha {
  simdattn::MultiHeadAttention layer;
};
struct simdattn_kv_cache {
  simdattn::KvCache cache;
};

namespace {

using namespace simdattn;

thread_local std::string t_error, t_argument;

// A struct_size this library cannot take: the caller's struct is older than the library's, or a
// newer caller set a field this library does not know.
struct VersionError {
  std::string argument, message;
};

simdattn_status fail(simdattn_status status, std::string argument, std::string message) {
  t_argument = std::move(argument);
  t_error = std::move(message);
  return status;
}

// Runs f() (which may throw anything) and returns its status.
template <class F>
simdattn_status guarded(F&& f) noexcept {
  try {
    f();
    return SIMDATTN_OK;
  } catch (const Error& e) {
    return fail(SIMDATTN_ERROR_INVALID_ARGUMENT, e.argument(), e.what());
  } catch (const VersionError& e) {
    return fail(SIMDATTN_ERROR_VERSION, e.argument, e.argument + ": " + e.message);
  } catch (const std::bad_alloc&) {
    return fail(SIMDATTN_ERROR_OUT_OF_MEMORY, "", "out of memory");
  } catch (const std::exception& e) {
    return fail(SIMDATTN_ERROR_INTERNAL, "", std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(SIMDATTN_ERROR_INTERNAL, "", "internal error: unknown exception");
  }
}

template <class P>
void require(const P* p, const char* name) {
  if (p == nullptr) throw Error(name, "expected a pointer, got NULL");
}

// A caller's struct of `size` bytes at p, this library's being `ours`: smaller is refused, larger
// only when every byte past ours is zero (fields of a newer version left unset).
void check_size(const void* p, std::size_t size, std::size_t ours, const char* name) {
  if (size < ours)
    throw VersionError{name, "struct_size " + std::to_string(size) + " is smaller than this library's " +
                                 std::to_string(ours) + " (set it with its _init function or sizeof)"};
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (std::size_t i = ours; i < size; ++i)
    if (bytes[i] != 0)
      throw VersionError{name, "struct_size " + std::to_string(size) + " carries fields this library (C API " +
                                   std::to_string(SIMDATTN_C_API_VERSION) + ", " + std::to_string(ours) +
                                   " bytes) does not know, and one is set"};
}

template <class S>
const S& checked(const S* p, const char* name) {
  require(p, name);
  check_size(p, p->struct_size, sizeof(S), name);
  return *p;
}

DType dtype_of_c(simdattn_dtype t, const std::string& name) {
  switch (t) {
    case SIMDATTN_F32: return DType::f32;
    case SIMDATTN_F64: return DType::f64;
    case SIMDATTN_U8: return DType::u8;
    case SIMDATTN_I32: return DType::i32;
    case SIMDATTN_I64: return DType::i64;
    case SIMDATTN_BF16: return DType::bf16;
    case SIMDATTN_F16: return DType::f16;
  }
  throw Error(name, "expected a simdattn_dtype (0 .. 6), got " + std::to_string(static_cast<long long>(t)));
}

simdattn_dtype dtype_to_c(DType t) {
  switch (t) {
    case DType::f32: return SIMDATTN_F32;
    case DType::f64: return SIMDATTN_F64;
    case DType::u8: return SIMDATTN_U8;
    case DType::i32: return SIMDATTN_I32;
    case DType::i64: return SIMDATTN_I64;
    case DType::bf16: return SIMDATTN_BF16;
    case DType::f16: return SIMDATTN_F16;
  }
  return SIMDATTN_F32;
}

Causal causal_of_c(simdattn_causal c, const char* name) {
  switch (c) {
    case SIMDATTN_CAUSAL_NONE: return Causal::none;
    case SIMDATTN_CAUSAL_TOP_LEFT: return Causal::top_left;
    case SIMDATTN_CAUSAL_BOTTOM_RIGHT: return Causal::bottom_right;
  }
  throw Error(name, "expected SIMDATTN_CAUSAL_NONE, _TOP_LEFT or _BOTTOM_RIGHT, got " +
                        std::to_string(static_cast<long long>(c)));
}

Backend backend_of_c(simdattn_backend b, const char* name) {
  switch (b) {
    case SIMDATTN_BACKEND_REFERENCE: return Backend::reference;
    case SIMDATTN_BACKEND_NATIVE: return Backend::native;
    case SIMDATTN_BACKEND_ONEDNN: return Backend::onednn;
  }
  throw Error(name, "expected SIMDATTN_BACKEND_REFERENCE, _NATIVE or _ONEDNN, got " +
                        std::to_string(static_cast<long long>(b)));
}

// The C++ view of a tensor struct whose size has been checked.
template <class View>
View to_view(const simdattn_tensor& s, const char* name) {
  View v;
  v.data = s.data;
  v.dtype = dtype_of_c(s.dtype, std::string(name) + ".dtype");
  for (int i = 0; i < 4; ++i) v.shape[i] = s.shape[i], v.strides[i] = s.strides[i];
  return v;
}

// A tensor given by pointer (q, k, v, out): required, its struct checked.
template <class View>
View view_of(const simdattn_tensor* t, const char* name) {
  const simdattn_tensor& s = checked(t, name);
  if (s.data == nullptr) throw Error(name, "expected data, got NULL");
  return to_view<View>(s, name);
}

// An optional tensor embedded in an options struct: absent when its data is NULL.
template <class View>
View optional_view(const simdattn_tensor& s, const char* name) {
  if (s.data == nullptr) return {};
  if (s.struct_size != sizeof(simdattn_tensor))
    throw VersionError{name, "struct_size " + std::to_string(s.struct_size) + ", expected " +
                                 std::to_string(sizeof(simdattn_tensor)) + " (an embedded tensor; set it with the options' _init)"};
  return to_view<View>(s, name);
}

// count values at p (p may be NULL only when count is 0).
template <class T>
std::span<const T> span_of(const T* p, std::size_t count, const char* name) {
  if (p == nullptr && count != 0) throw Error(name, "expected " + std::to_string(count) + " values, got NULL");
  if (p == nullptr) return {};
  return {p, count};
}

std::optional<double> optional_double(int has, double value) { return has ? std::optional<double>(value) : std::nullopt; }

AttentionOptions attention_options(const simdattn_attention_options* c) {
  AttentionOptions o;
  if (c == nullptr) return o;
  const simdattn_attention_options& s = checked(c, "options");
  o.scale = optional_double(s.has_scale, s.scale);
  o.causal = causal_of_c(s.causal, "options.causal");
  o.mask = optional_view<ConstTensorView>(s.mask, "options.mask");
  o.key_lengths = span_of(s.key_lengths, s.key_lengths_count, "options.key_lengths");
  if (s.has_window) o.window = Window{s.window_left, s.window_right};
  o.global_tokens = s.global_tokens;
  o.block_mask = optional_view<ConstTensorView>(s.block_mask, "options.block_mask");
  o.block_size = s.block_size;
  o.softcap = optional_double(s.has_softcap, s.softcap);
  o.alibi_slopes = span_of(s.alibi_slopes, s.alibi_slopes_count, "options.alibi_slopes");
  if (s.relative_bias_table.data != nullptr)
    o.relative_bias = RelativePositionBias{
        optional_view<ConstTensorView>(s.relative_bias_table, "options.relative_bias_table"),
        s.relative_bias_bidirectional != 0, s.relative_bias_max_distance};
  o.sinks = span_of(s.sinks, s.sinks_count, "options.sinks");
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
  o.threads = s.threads;
  o.backend = backend_of_c(s.backend, "options.backend");
  return o;
}

simdattn_tensor empty_tensor() {
  simdattn_tensor t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  return t;
}

RopeConfig rope_of_c(const simdattn_rope_config& r) {
  if (r.struct_size != sizeof(simdattn_rope_config))
    throw VersionError{"config.rope", "struct_size " + std::to_string(r.struct_size) + ", expected " +
                                          std::to_string(sizeof(simdattn_rope_config)) +
                                          " (set it with simdattn_rope_config_init)"};
  RopeConfig c;
  c.theta = r.theta;
  c.rotary_dim = r.rotary_dim;
  switch (r.style) {
    case SIMDATTN_ROPE_HALF: c.style = RopeStyle::half; break;
    case SIMDATTN_ROPE_INTERLEAVED: c.style = RopeStyle::interleaved; break;
    default: throw Error("config.rope.style", "expected SIMDATTN_ROPE_HALF or _INTERLEAVED");
  }
  switch (r.scaling) {
    case SIMDATTN_ROPE_SCALING_NONE: c.scaling = RopeScaling::none; break;
    case SIMDATTN_ROPE_SCALING_LINEAR: c.scaling = RopeScaling::linear; break;
    case SIMDATTN_ROPE_SCALING_LLAMA3: c.scaling = RopeScaling::llama3; break;
    default: throw Error("config.rope.scaling", "expected SIMDATTN_ROPE_SCALING_NONE, _LINEAR or _LLAMA3");
  }
  c.factor = r.factor;
  c.low_freq_factor = r.low_freq_factor;
  c.high_freq_factor = r.high_freq_factor;
  c.original_max_positions = r.original_max_positions;
  return c;
}

// The C++ configuration: shapes, then the position and score options. Arrays whose length the
// shape gives (q_norm, k_norm: head_dim; slopes, sinks: heads; the T5 table) are copied.
MhaConfig mha_config(const simdattn_mha_config& s) {
  MhaConfig c;
  c.d_model = s.d_model, c.heads = s.heads, c.kv_heads = s.kv_heads, c.head_dim = s.head_dim;
  c.kdim = s.kdim, c.vdim = s.vdim;
  if (s.has_rope) c.rope = rope_of_c(s.rope);
  const std::int64_t hd = s.head_dim > 0 ? s.head_dim : (s.heads > 0 ? s.d_model / s.heads : 0);
  if ((s.q_norm == nullptr) != (s.k_norm == nullptr))
    throw Error(s.q_norm == nullptr ? "config.q_norm" : "config.k_norm",
                "q_norm and k_norm are given together or not at all");
  if (s.q_norm != nullptr) {
    if (hd <= 0) throw Error("config.head_dim", "q_norm needs head_dim (or d_model and heads) to size it");
    c.q_norm.assign(s.q_norm, s.q_norm + hd);
    c.k_norm.assign(s.k_norm, s.k_norm + hd);
  }
  c.qk_norm_eps = s.qk_norm_eps;
  c.scale = optional_double(s.has_scale, s.scale);
  c.softcap = optional_double(s.has_softcap, s.softcap);
  if (s.has_window) c.window = Window{s.window_left, s.window_right};
  const auto heads_array = [&](const float* p, const char* name) {
    std::vector<float> v;
    if (p == nullptr) return v;
    if (s.heads <= 0) throw Error("config.heads", std::string(name) + " needs heads >= 1 to size it");
    v.assign(p, p + s.heads);
    return v;
  };
  c.alibi_slopes = heads_array(s.alibi_slopes, "alibi_slopes");
  c.sinks = heads_array(s.sinks, "sinks");
  if (s.t5_table != nullptr) {
    if (s.t5_num_buckets < 2 || s.t5_num_buckets > (std::int64_t{1} << 20))
      throw Error("config.t5_num_buckets", "expected 2 .. 2^20, got " + std::to_string(s.t5_num_buckets));
    if (s.heads <= 0 || s.heads > (std::int64_t{1} << 20))
      throw Error("config.heads", "t5_table needs heads in 1 .. 2^20 to size it");
    c.t5_table.assign(s.t5_table, s.t5_table + s.t5_num_buckets * s.heads);
  }
  c.t5_bidirectional = s.t5_bidirectional != 0;
  c.t5_max_distance = s.t5_max_distance;
  c.causal = s.causal != 0;
  return c;
}

template <class T>
std::vector<T> copy_of(const void* p, std::int64_t n, const char* name, bool required) {
  if (p == nullptr) {
    if (required) throw Error(name, "expected a weight, got NULL");
    return {};
  }
  const T* t = static_cast<const T*>(p);
  return std::vector<T>(t, t + n);
}

// The weights' sizes from the configuration, then a layer of their dtype.
template <class T>
MultiHeadAttention make_layer(const MhaConfig& c, const simdattn_mha_weights& w) {
  // Sizes the C++ constructor checks again; here they say how much to copy.
  const auto bad = [](const char* name, std::int64_t v) {
    if (v <= 0 || v > (std::int64_t{1} << 24)) throw Error(name, "expected 1 .. 2^24, got " + std::to_string(v));
    return v;
  };
  const std::int64_t d = bad("config.d_model", c.d_model), H = bad("config.heads", c.heads);
  const std::int64_t Hkv = c.kv_heads > 0 ? bad("config.kv_heads", c.kv_heads) : H;
  const std::int64_t hd = c.head_dim > 0 ? bad("config.head_dim", c.head_dim) : d / H;
  const std::int64_t kd = c.kdim > 0 ? bad("config.kdim", c.kdim) : d, vd = c.vdim > 0 ? bad("config.vdim", c.vdim) : d;
  if (hd <= 0) throw Error("config.head_dim", "d_model / heads is 0: give head_dim");
  if (H % Hkv != 0)
    throw Error("config.kv_heads", "heads " + std::to_string(H) + " is not a multiple of kv_heads " + std::to_string(Hkv));
  const std::int64_t nq = H * hd, nkv = Hkv * hd;
  if (nq * std::max({d, kd, vd}) > (std::int64_t{1} << 34))
    throw Error("config", "weights of more than 2^34 elements");
  MhaWeights<T> m;
  m.wq = copy_of<T>(w.wq, nq * d, "weights.wq", true);
  m.wk = copy_of<T>(w.wk, nkv * kd, "weights.wk", true);
  m.wv = copy_of<T>(w.wv, nkv * vd, "weights.wv", true);
  m.wo = copy_of<T>(w.wo, d * nq, "weights.wo", true);
  m.bq = copy_of<T>(w.bq, nq, "weights.bq", false);
  m.bk = copy_of<T>(w.bk, nkv, "weights.bk", false);
  m.bv = copy_of<T>(w.bv, nkv, "weights.bv", false);
  m.bo = copy_of<T>(w.bo, d, "weights.bo", false);
  return MultiHeadAttention(c, std::move(m));
}

template <class View>
View seq_of(const simdattn_seq* p, const char* name) {
  const simdattn_seq& s = checked(p, name);
  if (s.data == nullptr) throw Error(name, "expected data, got NULL");
  View v;
  v.data = s.data;
  v.dtype = dtype_of_c(s.dtype, std::string(name) + ".dtype");
  v.B = s.batch, v.S = s.seq, v.E = s.width;
  return v;
}

MhaOptions mha_options(const simdattn_mha_options* c) {
  MhaOptions o;
  if (c == nullptr) return o;
  const simdattn_mha_options& s = checked(c, "options");
  o.causal = causal_of_c(s.causal, "options.causal");
  o.key_padding_mask = span_of(s.key_padding_mask, s.key_padding_mask_count, "options.key_padding_mask");
  o.attn_mask = optional_view<ConstTensorView>(s.attn_mask, "options.attn_mask");
  o.positions = span_of(s.positions, s.positions_count, "options.positions");
  o.attn_weights = optional_view<TensorView>(s.attn_weights, "options.attn_weights");
  o.threads = s.threads;
  o.backend = backend_of_c(s.backend, "options.backend");
  return o;
}

PretrainedOptions pretrained_options(const simdattn_pretrained_options* c) {
  PretrainedOptions o;
  if (c == nullptr) return o;
  const simdattn_pretrained_options& s = checked(c, "options");
  if (s.stack != nullptr) o.stack = s.stack;
  if (s.attention != nullptr) o.attention = s.attention;
  if (s.has_dtype) o.dtype = dtype_of_c(s.dtype, "options.dtype");
  return o;
}

// Writes an output struct: the caller's struct_size must hold ours; bytes past ours are zeroed.
template <class S>
void write_out(S* out, const S& value, const char* name) {
  require(out, name);
  if (out->struct_size < sizeof(S))
    throw VersionError{name, "struct_size " + std::to_string(out->struct_size) + " is smaller than this library's " +
                                 std::to_string(sizeof(S))};
  const std::size_t size = out->struct_size;
  std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(S), 0, size - sizeof(S));
  *out = value;
  out->struct_size = size;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

extern "C" {

const char* simdattn_last_error(void) { return t_error.c_str(); }
const char* simdattn_last_error_argument(void) { return t_argument.c_str(); }

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
  o->mask = o->block_mask = o->relative_bias_table = o->lse = o->scores = empty_tensor();
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

void simdattn_rope_config_init(simdattn_rope_config* r) {
  if (r == nullptr) return;
  std::memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->theta = 10000.0;
  r->style = SIMDATTN_ROPE_HALF;
  r->scaling = SIMDATTN_ROPE_SCALING_NONE;
  r->factor = 1.0;
  r->low_freq_factor = 1.0;
  r->high_freq_factor = 4.0;
  r->original_max_positions = 8192;
}

void simdattn_mha_config_init(simdattn_mha_config* c) {
  if (c == nullptr) return;
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  simdattn_rope_config_init(&c->rope);
  c->qk_norm_eps = 1e-6;
  c->window_left = c->window_right = -1;
  c->t5_bidirectional = 1;
  c->t5_max_distance = 128;
}

void simdattn_mha_weights_init(simdattn_mha_weights* w) {
  if (w == nullptr) return;
  std::memset(w, 0, sizeof *w);
  w->struct_size = sizeof *w;
  w->dtype = SIMDATTN_F32;
}

void simdattn_pretrained_options_init(simdattn_pretrained_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->dtype = SIMDATTN_F32;
}

simdattn_status simdattn_mha_create(const simdattn_mha_config* config, const simdattn_mha_weights* weights,
                                    simdattn_mha** layer) {
  if (layer != nullptr) *layer = nullptr;
  return guarded([&] {
    require(layer, "layer");
    const MhaConfig c = mha_config(checked(config, "config"));
    const simdattn_mha_weights& w = checked(weights, "weights");
    simdattn_mha* h = nullptr;
    switch (dtype_of_c(w.dtype, "weights.dtype")) {
      case DType::f32: h = new simdattn_mha{make_layer<float>(c, w)}; break;
      case DType::f64: h = new simdattn_mha{make_layer<double>(c, w)}; break;
      case DType::bf16: h = new simdattn_mha{make_layer<bfloat16>(c, w)}; break;
      case DType::f16: h = new simdattn_mha{make_layer<float16>(c, w)}; break;
      default: throw Error("weights.dtype", "expected f32, f64, bf16 or f16");
    }
    *layer = h;
  });
}

simdattn_status simdattn_mha_from_safetensors(const char* path, int64_t heads, int64_t kv_heads, const char* prefix,
                                              simdattn_dtype dtype, const simdattn_mha_config* options,
                                              simdattn_mha** layer) {
  if (layer != nullptr) *layer = nullptr;
  return guarded([&] {
    require(layer, "layer");
    require(path, "path");
    const DType t = dtype_of_c(dtype, "dtype");
    const std::string pre = prefix != nullptr ? prefix : "";
    if (options == nullptr) {
      *layer = new simdattn_mha{MultiHeadAttention::from_safetensors(path, heads, kv_heads, pre, t)};
    } else {
      simdattn_mha_config shaped = checked(options, "options");
      shaped.heads = heads;  // sizes the per-head arrays; the shape itself comes from the file
      *layer = new simdattn_mha{
                            MultiHeadAttention::from_safetensors(path, heads, kv_heads, pre, t, mha_config(shaped))};
    }
  });
}

simdattn_status simdattn_mha_from_pretrained(const char* dir, int64_t layer_index,
                                             const simdattn_pretrained_options* options, simdattn_mha** layer) {
  if (layer != nullptr) *layer = nullptr;
  return guarded([&] {
    require(layer, "layer");
    require(dir, "dir");
    *layer = new simdattn_mha{MultiHeadAttention::from_pretrained(dir, layer_index, pretrained_options(options))};
  });
}

simdattn_status simdattn_mha_from_diffusers(const char* path, const char* prefix, int64_t heads,
                                            const simdattn_pretrained_options* options, simdattn_mha** layer) {
  if (layer != nullptr) *layer = nullptr;
  return guarded([&] {
    require(layer, "layer");
    require(path, "path");
    *layer = new simdattn_mha{MultiHeadAttention::from_diffusers(path, prefix != nullptr ? prefix : "", heads,
                                                                          pretrained_options(options))};
  });
}

void simdattn_mha_free(simdattn_mha* layer) { delete layer; }

simdattn_status simdattn_mha_get_info(const simdattn_mha* layer, simdattn_mha_info* info) {
  return guarded([&] {
    require(layer, "layer");
    const MhaConfig& c = layer->layer.config();
    simdattn_mha_info v;
    std::memset(&v, 0, sizeof v);
    v.d_model = c.d_model, v.heads = c.heads, v.kv_heads = c.kv_heads, v.head_dim = c.head_dim;
    v.kdim = c.kdim, v.vdim = c.vdim;
    v.dtype = dtype_to_c(layer->layer.dtype());
    v.causal = c.causal ? 1 : 0;
    write_out(info, v, "info");
  });
}

simdattn_seq simdattn_seq_make(void* data, simdattn_dtype dtype, int64_t batch, int64_t seq, int64_t width) {
  simdattn_seq s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.data = data, s.dtype = dtype, s.batch = batch, s.seq = seq, s.width = width;
  return s;
}

void simdattn_mha_options_init(simdattn_mha_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->causal = SIMDATTN_CAUSAL_NONE;
  o->attn_mask = o->attn_weights = empty_tensor();
  o->backend = SIMDATTN_BACKEND_NATIVE;
}

simdattn_status simdattn_mha_forward(const simdattn_mha* layer, const simdattn_seq* query, const simdattn_seq* out,
                                     const simdattn_mha_options* options) {
  return guarded([&] {
    require(layer, "layer");
    layer->layer.forward(seq_of<ConstSeqView>(query, "query"), seq_of<SeqView>(out, "out"), mha_options(options));
  });
}

simdattn_status simdattn_mha_forward_cross(const simdattn_mha* layer, const simdattn_seq* query,
                                           const simdattn_seq* key, const simdattn_seq* value, const simdattn_seq* out,
                                           const simdattn_mha_options* options) {
  return guarded([&] {
    require(layer, "layer");
    layer->layer.forward(seq_of<ConstSeqView>(query, "query"), seq_of<ConstSeqView>(key, "key"),
                         seq_of<ConstSeqView>(value, "value"), seq_of<SeqView>(out, "out"), mha_options(options));
  });
}

simdattn_status simdattn_mha_forward_cached(const simdattn_mha* layer, const simdattn_seq* query,
                                            simdattn_kv_cache* cache, const simdattn_seq* out,
                                            const simdattn_mha_options* options) {
  return guarded([&] {
    require(layer, "layer");
    require(cache, "cache");
    layer->layer.forward(seq_of<ConstSeqView>(query, "query"), cache->cache, seq_of<SeqView>(out, "out"),
                         mha_options(options));
  });
}

simdattn_status simdattn_kv_cache_create(const simdattn_mha* layer, int64_t batch, int64_t capacity,
                                         simdattn_kv_cache** cache) {
  if (cache != nullptr) *cache = nullptr;
  return guarded([&] {
    require(cache, "cache");
    require(layer, "layer");
    *cache = new simdattn_kv_cache{KvCache(layer->layer, batch, capacity)};
  });
}

simdattn_status simdattn_kv_cache_create_with_dtype(const simdattn_mha* layer, int64_t batch, int64_t capacity,
                                                    simdattn_dtype dtype, simdattn_kv_cache** cache) {
  if (cache != nullptr) *cache = nullptr;
  return guarded([&] {
    require(cache, "cache");
    require(layer, "layer");
    *cache = new simdattn_kv_cache{KvCache(layer->layer, batch, capacity, dtype_of_c(dtype, "dtype"))};
  });
}

void simdattn_kv_cache_free(simdattn_kv_cache* cache) { delete cache; }

simdattn_status simdattn_kv_cache_reset(simdattn_kv_cache* cache) {
  return guarded([&] {
    require(cache, "cache");
    cache->cache.reset();
  });
}

simdattn_status simdattn_kv_cache_truncate(simdattn_kv_cache* cache, int64_t sequence, int64_t length) {
  return guarded([&] {
    require(cache, "cache");
    cache->cache.truncate(sequence, length);
  });
}

simdattn_status simdattn_kv_cache_length(const simdattn_kv_cache* cache, int64_t sequence, int64_t* length) {
  return guarded([&] {
    require(cache, "cache");
    require(length, "length");
    const auto lengths = cache->cache.lengths();
    if (sequence < 0 || sequence >= static_cast<std::int64_t>(lengths.size()))
      throw Error("sequence", "expected 0 .. " + std::to_string(lengths.size() - 1) + ", got " +
                                  std::to_string(sequence));
    *length = lengths[static_cast<std::size_t>(sequence)];
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

}  // extern "C"
