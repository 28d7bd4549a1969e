/* simdattn's C API (C11; usable from C, and from any language through its FFI).
 *
 * The same library as the C++ API (simdattn/simdattn.hpp), behind a boundary nothing crosses
 * but plain data:
 *   - every function returns a simdattn_status; SIMDATTN_OK (0) is success;
 *   - on failure, simdattn_last_error() gives the message of this thread's last failed call
 *     ("k: expected shape [B=2, Hkv, Sk, D=64], got [2, 4, 10, 32]") and
 *     simdattn_last_error_argument() the argument alone ("k"); both stay valid until this thread's
 *     next failing call. A failed call has written none of its outputs;
 *   - no exception crosses the boundary and nothing aborts: an invalid argument, an unreadable
 *     file, an allocation failure or a bug each come back as a status;
 *   - layers (simdattn_mha, simdattn_gdn), KV caches (simdattn_kv_cache), KV pools
 *     (simdattn_kv_pool), pool schedulers (simdattn_pool_scheduler) and Gated DeltaNet states
 *     (simdattn_gdn_state) are opaque handles, freed with their _free function (NULL is accepted
 *     and ignored);
 *   - every struct the caller fills starts with `size_t struct_size`: set it with the struct's
 *     _init function (which also sets every default), or to sizeof the struct. A smaller size
 *     than this version's is refused, except an older version's size of a struct a later one
 *     extended (docs/bindings.md, "Struct versions"); a larger one (a caller built against a newer header) is
 *     accepted when every byte past the fields this library knows is zero, and refused (status
 *     SIMDATTN_ERROR_VERSION, naming the struct) when a newer field is set.
 *
 * Semantics, shapes, dtypes and options are the C++ API's: simdattn/attention.hpp (attention),
 * simdattn/linear.hpp (linear attention), simdattn/mha.hpp (the layer and its cache),
 * simdattn/rope.hpp (RoPE). A tensor is a 4-D strided view; strides count elements, not bytes.
 * Every function may be called from many threads at once, except that a KV cache belongs to
 * one caller at a time.
 */
#ifndef SIMDATTN_SIMDATTN_H
#define SIMDATTN_SIMDATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SIMDATTN_C_API
#else
#define SIMDATTN_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header's structs and functions; simdattn_c_api_version() gives the
 * library's. A library accepts callers built against its version or an older one. */
#define SIMDATTN_C_API_VERSION 7

typedef enum simdattn_status {
  SIMDATTN_OK = 0,
  SIMDATTN_ERROR_INVALID_ARGUMENT = 1, /* a bad argument, shape, dtype, option or file */
  SIMDATTN_ERROR_OUT_OF_MEMORY = 2,
  SIMDATTN_ERROR_VERSION = 3,          /* a struct_size this library cannot take */
  SIMDATTN_ERROR_INTERNAL = 4          /* a bug: please report the message */
} simdattn_status;

typedef enum simdattn_dtype {
  SIMDATTN_F32 = 0,
  SIMDATTN_F64 = 1,
  SIMDATTN_U8 = 2,   /* boolean masks: nonzero = attend */
  SIMDATTN_I32 = 3,
  SIMDATTN_I64 = 4,
  SIMDATTN_BF16 = 5, /* bfloat16, stored as uint16_t */
  SIMDATTN_F16 = 6,  /* IEEE binary16, stored as uint16_t */
  SIMDATTN_INT8 = 7,     /* 8-bit K/V codes (int8_t) with f32 scales: see simdattn/attention.hpp */
  SIMDATTN_FP8_E4M3 = 8, /* 8-bit K/V codes, OCP E4M3FN in uint8_t, with f32 scales */
  SIMDATTN_FP8_E5M2 = 9  /* 8-bit K/V codes, OCP E5M2 in uint8_t, with f32 scales */
} simdattn_dtype;

typedef enum simdattn_causal {
  SIMDATTN_CAUSAL_NONE = 0,
  SIMDATTN_CAUSAL_TOP_LEFT = 1,
  SIMDATTN_CAUSAL_BOTTOM_RIGHT = 2
} simdattn_causal;

typedef enum simdattn_backend {
  SIMDATTN_BACKEND_REFERENCE = 0,
  SIMDATTN_BACKEND_NATIVE = 1,
  SIMDATTN_BACKEND_ONEDNN = 2
} simdattn_backend;

typedef enum simdattn_score_stage {
  SIMDATTN_SCORES_SCALED = 0,
  SIMDATTN_SCORES_CAPPED = 1,
  SIMDATTN_SCORES_BIASED = 2,
  SIMDATTN_SCORES_SOFTMAX = 3
} simdattn_score_stage;

typedef enum simdattn_feature_map {
  SIMDATTN_FEATURE_ELU1 = 0,
  SIMDATTN_FEATURE_RELU = 1,
  SIMDATTN_FEATURE_IDENTITY = 2
} simdattn_feature_map;

typedef enum simdattn_rope_style { SIMDATTN_ROPE_HALF = 0, SIMDATTN_ROPE_INTERLEAVED = 1 } simdattn_rope_style;

typedef enum simdattn_rope_scaling {
  SIMDATTN_ROPE_SCALING_NONE = 0,
  SIMDATTN_ROPE_SCALING_LINEAR = 1,
  SIMDATTN_ROPE_SCALING_LLAMA3 = 2
} simdattn_rope_scaling;

/* ---- errors and version ------------------------------------------------------------------- */

/* This thread's last error message ("" if none). */
SIMDATTN_C_API const char* simdattn_last_error(void);
/* The argument (or file, or struct) the last error names ("" if none). */
SIMDATTN_C_API const char* simdattn_last_error_argument(void);
/* A fixed description of a status ("invalid argument", ...). */
SIMDATTN_C_API const char* simdattn_status_string(simdattn_status status);

/* "major.minor.patch" of the library. */
SIMDATTN_C_API const char* simdattn_version(void);
/* SIMDATTN_C_API_VERSION of the library. */
SIMDATTN_C_API int simdattn_c_api_version(void);

/* ---- tensors ------------------------------------------------------------------------------- */

/* A 4-D strided view: element [a, b, c, d] at data + (a*strides[0] + ... + d*strides[3]) *
 * the dtype's size. data == NULL is an absent optional tensor. */
typedef struct simdattn_tensor {
  size_t struct_size;
  void* data; /* read-only for inputs */
  simdattn_dtype dtype;
  int64_t shape[4];
  int64_t strides[4]; /* elements, >= 0 */
} simdattn_tensor;

/* A contiguous (C order) view of `data`. */
SIMDATTN_C_API simdattn_tensor simdattn_tensor_contiguous(void* data, simdattn_dtype dtype, int64_t d0, int64_t d1,
                                                          int64_t d2, int64_t d3);

/* ---- attention ----------------------------------------------------------------------------- */

typedef struct simdattn_attention_options {
  size_t struct_size;
  int has_scale; /* 0: 1/sqrt(D) */
  double scale;
  simdattn_causal causal;
  simdattn_tensor mask; /* data NULL: none; u8 boolean or f32/f64/bf16/f16 additive */
  const int64_t* key_lengths; /* NULL or key_lengths_count == B values */
  size_t key_lengths_count;
  int has_window;
  int64_t window_left, window_right; /* -1: unbounded on that side */
  int64_t global_tokens;
  simdattn_tensor block_mask; /* data NULL: none */
  int64_t block_size;         /* default 64 */
  int has_softcap;
  double softcap;
  const float* alibi_slopes; /* NULL or H slopes */
  size_t alibi_slopes_count;
  simdattn_tensor relative_bias_table; /* T5's table [1, 1, num_buckets, H]; data NULL: none */
  int relative_bias_bidirectional;     /* default 1 */
  int64_t relative_bias_max_distance;  /* default 128 */
  const float* sinks; /* NULL or H logits */
  size_t sinks_count;
  const int64_t* query_offsets; /* NULL or B offsets */
  size_t query_offsets_count;
  simdattn_tensor lse;    /* optional output [B, H, Sq, 1] f32 */
  simdattn_tensor scores; /* optional output [B, H, Sq, Sk] */
  simdattn_score_stage scores_stage; /* default SIMDATTN_SCORES_SOFTMAX */
  int threads;                       /* 0: OpenMP's default */
  simdattn_backend backend;          /* default SIMDATTN_BACKEND_NATIVE */
  /* C API 2: 8-bit K and V (k, v of dtype SIMDATTN_INT8, _FP8_E4M3 or _FP8_E5M2): the rows'
   * scales, [B, Hkv, Sk, 1] f32; data NULL otherwise */
  simdattn_tensor k_scale;
  simdattn_tensor v_scale;
} simdattn_attention_options;

/* Sets struct_size and every default (and the embedded tensors' struct_size). */
SIMDATTN_C_API void simdattn_attention_options_init(simdattn_attention_options* options);

/* out = attention(q, k, v) with `options` (NULL: the defaults). */
SIMDATTN_C_API simdattn_status simdattn_attention(const simdattn_tensor* q, const simdattn_tensor* k,
                                                  const simdattn_tensor* v, const simdattn_tensor* out,
                                                  const simdattn_attention_options* options);

/* The output shape [B, H, Sq, Dv] attention() writes for these inputs, checked as it checks them. */
SIMDATTN_C_API simdattn_status simdattn_attention_output_shape(const simdattn_tensor* q, const simdattn_tensor* k,
                                                               const simdattn_tensor* v, int64_t shape[4]);

/* C API 2: 8-bit K/V codes (simdattn/attention.hpp's formats, exact): x [.., .., .., D] (f32, f64,
 * bf16 or f16) to codes of dtype `code` (SIMDATTN_INT8, _FP8_E4M3, _FP8_E5M2) of x's shape and
 * scales [.., .., .., 1] f32; a row with a NaN or an infinity is an error naming it, nothing
 * written. dequantize: out (f32, f64, bf16 or f16) = decode(codes) * scales. */
SIMDATTN_C_API simdattn_status simdattn_quantize_kv(const simdattn_tensor* x, simdattn_dtype code,
                                                   const simdattn_tensor* codes, const simdattn_tensor* scales);
SIMDATTN_C_API simdattn_status simdattn_dequantize_kv(const simdattn_tensor* codes, const simdattn_tensor* scales,
                                                     const simdattn_tensor* out);

/* ALiBi's usual slopes for `heads` heads into slopes[0 .. heads-1]. */
SIMDATTN_C_API simdattn_status simdattn_standard_alibi_slopes(int64_t heads, float* slopes);

/* ---- linear attention ---------------------------------------------------------------------- */

typedef struct simdattn_linear_options {
  size_t struct_size;
  int causal;
  simdattn_feature_map feature_map; /* default ELU1 */
  double eps;                       /* default 1e-6 */
  int64_t chunk;                    /* default 64 */
  int threads;
  simdattn_backend backend; /* reference or native (the default) */
} simdattn_linear_options;

SIMDATTN_C_API void simdattn_linear_options_init(simdattn_linear_options* options);
SIMDATTN_C_API simdattn_status simdattn_linear_attention(const simdattn_tensor* q, const simdattn_tensor* k,
                                                         const simdattn_tensor* v, const simdattn_tensor* out,
                                                         const simdattn_linear_options* options);

/* GatedDeltaRuleOptions (C API 5; has_scale C API 7): scale given where has_scale (any finite
 * value), else Dk^-1/2 (a struct of C API 5's size, without has_scale: scale 0 = Dk^-1/2);
 * initial_state and final_state f32 [B, Hv, Dk, Dv] (data NULL: absent). */
typedef struct simdattn_gated_delta_options {
  size_t struct_size;
  double scale;
  simdattn_tensor initial_state;
  simdattn_tensor final_state;
  int use_qk_l2norm;
  int threads;
  int has_scale;
} simdattn_gated_delta_options;

SIMDATTN_C_API void simdattn_gated_delta_options_init(simdattn_gated_delta_options* options);
/* simdattn::gated_delta_rule: q, k [B, T, H, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv, 1], out
 * [B, T, Hv, Dv] (simdattn/linear.hpp). options may be NULL. */
SIMDATTN_C_API simdattn_status simdattn_gated_delta_rule(const simdattn_tensor* q, const simdattn_tensor* k,
                                                         const simdattn_tensor* v, const simdattn_tensor* g,
                                                         const simdattn_tensor* beta, const simdattn_tensor* out,
                                                         const simdattn_gated_delta_options* options);

/* ---- the multi-head attention layer -------------------------------------------------------- */

typedef struct simdattn_mha simdattn_mha;
typedef struct simdattn_kv_cache simdattn_kv_cache;

typedef struct simdattn_rope_config {
  size_t struct_size;
  double theta;         /* default 10000 */
  int64_t rotary_dim;   /* 0: head_dim */
  simdattn_rope_style style;
  simdattn_rope_scaling scaling;
  double factor;           /* default 1 */
  double low_freq_factor;  /* default 1 */
  double high_freq_factor; /* default 4 */
  int64_t original_max_positions; /* default 8192 */
} simdattn_rope_config;

SIMDATTN_C_API void simdattn_rope_config_init(simdattn_rope_config* rope);

/* MhaConfig (simdattn/mha.hpp). Arrays are copied by the call that takes the struct. */
typedef struct simdattn_mha_config {
  size_t struct_size;
  int64_t d_model, heads;
  int64_t kv_heads, head_dim, kdim, vdim; /* 0: heads, d_model / heads, d_model, d_model */
  int has_rope;
  simdattn_rope_config rope;
  const float* q_norm; /* NULL or head_dim weights; with k_norm */
  const float* k_norm;
  double qk_norm_eps; /* default 1e-6 */
  int has_scale;
  double scale;
  int has_softcap;
  double softcap;
  int has_window;
  int64_t window_left, window_right;
  const float* alibi_slopes; /* NULL or heads slopes */
  const float* sinks;        /* NULL or heads logits */
  const float* t5_table;     /* NULL or [t5_num_buckets, heads] row-major */
  int64_t t5_num_buckets;
  int t5_bidirectional;    /* default 1 */
  int64_t t5_max_distance; /* default 128 */
  int causal;              /* a decoder's self-attention */
} simdattn_mha_config;

SIMDATTN_C_API void simdattn_mha_config_init(simdattn_mha_config* config);

/* Weights in torch's layout (W [out, in] row-major), all of `dtype` (f32, f64, bf16 or f16):
 * wq [H*hd, d_model], wk [Hkv*hd, kdim], wv [Hkv*hd, vdim], wo [d_model, H*hd]; each bias NULL
 * (none) or of the rows' count. Copied by the call. */
typedef struct simdattn_mha_weights {
  size_t struct_size;
  simdattn_dtype dtype;
  const void *wq, *wk, *wv, *wo;
  const void *bq, *bk, *bv, *bo;
} simdattn_mha_weights;

SIMDATTN_C_API void simdattn_mha_weights_init(simdattn_mha_weights* weights);

/* Which sub-layer of a published checkpoint (PretrainedOptions). */
typedef struct simdattn_pretrained_options {
  size_t struct_size;
  const char* stack;     /* NULL or "": the family's; T5: "encoder" or "decoder" */
  const char* attention; /* "self" or "cross"; NULL: self, or the sub-layer a diffusers prefix names (attn1/attn2) */
  int has_dtype;         /* 0: the checkpoint's dtype */
  simdattn_dtype dtype;
} simdattn_pretrained_options;

SIMDATTN_C_API void simdattn_pretrained_options_init(simdattn_pretrained_options* options);

/* A layer from memory; *layer receives the handle (NULL on failure). */
SIMDATTN_C_API simdattn_status simdattn_mha_create(const simdattn_mha_config* config,
                                                   const simdattn_mha_weights* weights, simdattn_mha** layer);
/* From a safetensors file (MultiHeadAttention::from_safetensors): prefix NULL = ""; options NULL
 * or its position and score fields (shape fields ignored). */
SIMDATTN_C_API simdattn_status simdattn_mha_from_safetensors(const char* path, int64_t heads, int64_t kv_heads,
                                                             const char* prefix, simdattn_dtype dtype,
                                                             const simdattn_mha_config* options,
                                                             simdattn_mha** layer);
/* From a Hugging Face model directory (MultiHeadAttention::from_pretrained); options may be NULL. */
SIMDATTN_C_API simdattn_status simdattn_mha_from_pretrained(const char* dir, int64_t layer_index,
                                                            const simdattn_pretrained_options* options,
                                                            simdattn_mha** layer);
/* A diffusers transformer block's attention (MultiHeadAttention::from_diffusers). */
SIMDATTN_C_API simdattn_status simdattn_mha_from_diffusers(const char* path, const char* prefix, int64_t heads,
                                                           const simdattn_pretrained_options* options,
                                                           simdattn_mha** layer);
/* C API 3: one attention layer of a llama.cpp GGUF file (MultiHeadAttention::from_gguf); options
 * may be NULL, else only its dtype applies (stack and attention NULL, "" or "self"). */
SIMDATTN_C_API simdattn_status simdattn_mha_from_gguf(const char* path, int64_t layer_index,
                                                      const simdattn_pretrained_options* options,
                                                      simdattn_mha** layer);
SIMDATTN_C_API void simdattn_mha_free(simdattn_mha* layer);

/* The layer's resolved shape (every 0 of its configuration resolved) and dtype. */
typedef struct simdattn_mha_info {
  size_t struct_size;
  int64_t d_model, heads, kv_heads, head_dim, kdim, vdim;
  simdattn_dtype dtype;
  int causal;
} simdattn_mha_info;

SIMDATTN_C_API simdattn_status simdattn_mha_get_info(const simdattn_mha* layer, simdattn_mha_info* info);

/* A batch of sequences [B, S, E], C order, of the layer's dtype. */
typedef struct simdattn_seq {
  size_t struct_size;
  void* data;
  simdattn_dtype dtype;
  int64_t batch, seq, width;
} simdattn_seq;

SIMDATTN_C_API simdattn_seq simdattn_seq_make(void* data, simdattn_dtype dtype, int64_t batch, int64_t seq,
                                              int64_t width);

/* MhaOptions. */
typedef struct simdattn_mha_options {
  size_t struct_size;
  simdattn_causal causal;
  const uint8_t* key_padding_mask; /* NULL or [B, Sk], nonzero = padding */
  size_t key_padding_mask_count;
  simdattn_tensor attn_mask; /* data NULL: none; additive float */
  const int64_t* positions;  /* NULL or [B, S] */
  size_t positions_count;
  simdattn_tensor attn_weights; /* optional output */
  int threads;
  simdattn_backend backend; /* default native */
} simdattn_mha_options;

SIMDATTN_C_API void simdattn_mha_options_init(simdattn_mha_options* options);

/* Self-attention: out [B, S, d_model] from query [B, S, d_model]. options may be NULL. */
SIMDATTN_C_API simdattn_status simdattn_mha_forward(const simdattn_mha* layer, const simdattn_seq* query,
                                                    const simdattn_seq* out, const simdattn_mha_options* options);
/* Cross-attention: query [B, Sq, d_model], key [B, Sk, kdim], value [B, Sk, vdim]. */
SIMDATTN_C_API simdattn_status simdattn_mha_forward_cross(const simdattn_mha* layer, const simdattn_seq* query,
                                                          const simdattn_seq* key, const simdattn_seq* value,
                                                          const simdattn_seq* out,
                                                          const simdattn_mha_options* options);
/* Incremental self-attention through `cache` (appends the new tokens' K/V; a failed call leaves
 * the cache as it was). */
SIMDATTN_C_API simdattn_status simdattn_mha_forward_cached(const simdattn_mha* layer, const simdattn_seq* query,
                                                           simdattn_kv_cache* cache, const simdattn_seq* out,
                                                           const simdattn_mha_options* options);

/* ---- KV cache ------------------------------------------------------------------------------ */

/* A cache of `capacity` tokens for `batch` sequences, in the layer's dtype. */
SIMDATTN_C_API simdattn_status simdattn_kv_cache_create(const simdattn_mha* layer, int64_t batch, int64_t capacity,
                                                        simdattn_kv_cache** cache);
/* The same in a dtype of its own (f32, f64, bf16, f16, or the 8-bit int8, fp8_e4m3, fp8_e5m2). */
SIMDATTN_C_API simdattn_status simdattn_kv_cache_create_with_dtype(const simdattn_mha* layer, int64_t batch,
                                                                   int64_t capacity, simdattn_dtype dtype,
                                                                   simdattn_kv_cache** cache);
SIMDATTN_C_API void simdattn_kv_cache_free(simdattn_kv_cache* cache);
SIMDATTN_C_API simdattn_status simdattn_kv_cache_reset(simdattn_kv_cache* cache);
/* Keeps the first `length` tokens of sequence `sequence`. */
SIMDATTN_C_API simdattn_status simdattn_kv_cache_truncate(simdattn_kv_cache* cache, int64_t sequence, int64_t length);
/* The tokens cached for sequence `sequence`. */
SIMDATTN_C_API simdattn_status simdattn_kv_cache_length(const simdattn_kv_cache* cache, int64_t sequence,
                                                        int64_t* length);
/* KvCache::bytes_per_token: the bytes one token occupies (an MLA layer's cache: its latent row). */
SIMDATTN_C_API simdattn_status simdattn_kv_cache_bytes_per_token(const simdattn_kv_cache* cache, int64_t* bytes);

/* ---- Gated DeltaNet, Qwen3-Next's linear-attention layer (simdattn/gated_delta_net.hpp; C API 6) - */

typedef struct simdattn_gdn simdattn_gdn;
typedef struct simdattn_gdn_state simdattn_gdn_state;

/* Linear-attention layer layer_index of a qwen3_next model directory (GatedDeltaNet::
 * from_pretrained); has_dtype 0: the checkpoint's dtype, else dtype (F32, BF16 or F16). *layer
 * receives the handle (NULL on failure). */
SIMDATTN_C_API simdattn_status simdattn_gdn_from_pretrained(const char* dir, int64_t layer_index, int has_dtype,
                                                            simdattn_dtype dtype, simdattn_gdn** layer);
SIMDATTN_C_API void simdattn_gdn_free(simdattn_gdn* layer);
/* The layer's shape (hidden_size, key_heads, value_heads, key_head_dim, value_head_dim,
 * conv_kernel; any pointer may be NULL) and dtype. */
SIMDATTN_C_API simdattn_status simdattn_gdn_get_info(const simdattn_gdn* layer, int64_t* hidden_size,
                                                     int64_t* key_heads, int64_t* value_heads, int64_t* key_head_dim,
                                                     int64_t* value_head_dim, int64_t* conv_kernel,
                                                     simdattn_dtype* dtype);
/* x [B, S, hidden] -> out [B, S, hidden] (the layer's dtype); state NULL: from an empty state,
 * else continued from it and updated (unchanged on failure); threads 0: the default. */
SIMDATTN_C_API simdattn_status simdattn_gdn_forward(const simdattn_gdn* layer, const simdattn_seq* x,
                                                    const simdattn_seq* out, simdattn_gdn_state* state, int threads);
/* The conv window and recurrent state of `batch` sequences through the layer (GatedDeltaNetState). */
SIMDATTN_C_API simdattn_status simdattn_gdn_state_create(const simdattn_gdn* layer, int64_t batch,
                                                         simdattn_gdn_state** state);
SIMDATTN_C_API void simdattn_gdn_state_free(simdattn_gdn_state* state);
SIMDATTN_C_API simdattn_status simdattn_gdn_state_reset(simdattn_gdn_state* state);
/* Its bytes (recurrent state and conv window) and the tokens it has seen; NULL pointers skipped. */
SIMDATTN_C_API simdattn_status simdattn_gdn_state_get_info(const simdattn_gdn_state* state, int64_t* bytes,
                                                           int64_t* tokens);

/* ---- the machine and the build ------------------------------------------------------------- */

/* Strings point into the library and stay valid until this thread's next simdattn_get_info. */
typedef struct simdattn_info {
  size_t struct_size;
  const char* version;
  const char* isa;       /* the ISA the kernels dispatch to */
  int isa_forced;        /* chosen by SIMDATTN_ISA */
  const char* isas;      /* the CPU's usable ISAs, best first, comma-separated */
  const char* backends;  /* built in, comma-separated */
  const char* onednn_version; /* "" without the onednn backend */
  int default_threads;
  int thread_budget;
} simdattn_info;

SIMDATTN_C_API simdattn_status simdattn_get_info(simdattn_info* info);
/* simdattn::set_thread_budget: the most threads all concurrent calls use together (0: the CPUs
 * the process may run on). */
SIMDATTN_C_API simdattn_status simdattn_set_thread_budget(int threads);
/* simdattn::set_verbose: nonzero turns verbose mode on (one line per call on stderr, as
 * SIMDATTN_VERBOSE=1 does), zero off. Cannot fail. */
SIMDATTN_C_API void simdattn_set_verbose(int on);
/* 1 when verbose mode is on (set_verbose, else SIMDATTN_VERBOSE), else 0. */
SIMDATTN_C_API int simdattn_get_verbose(void);

/* simdattn::set_thread_runtime: the threads every parallel loop runs on, process-wide. TEAM (the
 * default): the library's own workers per calling thread; OPENMP: OpenMP parallel regions (the
 * host's pool inside an OpenMP program). SIMDATTN_THREAD_RUNTIME=team|openmp sets it too. */
typedef enum simdattn_thread_runtime {
  SIMDATTN_THREAD_RUNTIME_TEAM = 0,
  SIMDATTN_THREAD_RUNTIME_OPENMP = 1
} simdattn_thread_runtime;
SIMDATTN_C_API simdattn_status simdattn_set_thread_runtime(simdattn_thread_runtime runtime);
SIMDATTN_C_API simdattn_thread_runtime simdattn_get_thread_runtime(void);

#ifdef __cplusplus
}
#endif

/* Paged attention, the KV pool and its scheduler. */
#include "c/pool.h"

#endif /* SIMDATTN_SIMDATTN_H */
