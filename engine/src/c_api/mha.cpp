// The C API's multi-head attention layer and KV cache (simdattn/simdattn.h) over
// MultiHeadAttention and KvCache, as c_api.cpp does for attention.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "c_api/translate.hpp"
#include "core/element.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/simdattn.h"

struct simdattn_kv_cache {
  simdattn::KvCache cache;
};

namespace {

using namespace simdattn;
using namespace simdattn::c_api;

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

PretrainedOptions pretrained_options(const simdattn_pretrained_options* c) {
  PretrainedOptions o;
  if (c == nullptr) return o;
  const simdattn_pretrained_options& s = checked(c, "options");
  if (s.stack != nullptr) o.stack = s.stack;
  if (s.attention != nullptr) o.attention = s.attention;
  if (s.has_dtype) o.dtype = dtype_of_c(s.dtype, "options.dtype");
  return o;
}

}  // namespace

extern "C" {

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
    h = detail::visit_float_dtype(dtype_of_c(w.dtype, "weights.dtype"), "weights.dtype",
                                  [&](auto t) { return new simdattn_mha{make_layer<decltype(t)>(c, w)}; });
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

simdattn_status simdattn_mha_from_gguf(const char* path, int64_t layer_index, const simdattn_pretrained_options* options,
                                       simdattn_mha** layer) {
  if (layer != nullptr) *layer = nullptr;
  return guarded([&] {
    require(layer, "layer");
    require(path, "path");
    const PretrainedOptions o = pretrained_options(options);
    if (!o.stack.empty()) throw Error("options.stack", "a GGUF file's layer has one stack, got '" + o.stack + "'");
    if (!o.attention.empty() && o.attention != "self")
      throw Error("options.attention", "a GGUF file's layer is self-attention, got '" + o.attention + "'");
    *layer = new simdattn_mha{MultiHeadAttention::from_gguf(path, layer_index, o.dtype)};
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

simdattn_status simdattn_kv_cache_bytes_per_token(const simdattn_kv_cache* cache, int64_t* bytes) {
  return guarded([&] {
    require(cache, "cache");
    require(bytes, "bytes");
    *bytes = cache->cache.bytes_per_token();
  });
}

}  // extern "C"
