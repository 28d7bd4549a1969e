/* simdattn C API: paged attention, the KV pool and its scheduler (simdattn/paged.hpp,
 * simdattn/kv_pool.hpp). Part of simdattn/simdattn.h, which includes it; the conventions (status,
 * errors, struct versions, handles) are that header's. */
#ifndef SIMDATTN_C_POOL_H
#define SIMDATTN_C_POOL_H

#include "../simdattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- paged attention and the KV pool (simdattn/paged.hpp, simdattn/kv_pool.hpp) -------------- */

/* PagedAttentionOptions. */
typedef struct simdattn_paged_options {
  size_t struct_size;
  const int64_t* query_start; /* NULL (one token per sequence) or N + 1 offsets */
  size_t query_start_count;
  simdattn_causal causal; /* default SIMDATTN_CAUSAL_BOTTOM_RIGHT; or SIMDATTN_CAUSAL_NONE */
  int has_scale;
  double scale;
  int has_window;
  int64_t window_left, window_right;
  int has_softcap;
  double softcap;
  const float* alibi_slopes; /* NULL or H slopes */
  size_t alibi_slopes_count;
  const float* sinks; /* NULL or H logits */
  size_t sinks_count;
  int threads;
  simdattn_backend backend; /* native (default) or reference */
  /* C API 2: 8-bit caches: the rows' scales, [num_blocks, block_size, Hkv, 1] f32; data NULL otherwise */
  simdattn_tensor k_scale;
  simdattn_tensor v_scale;
  /* C API 4: speculative decoding (simdattn/paged.hpp). tree_mask: the sequences' [q_len_i,
   * q_len_i] matrices (nonzero: sees), NULL for none (a given empty mask: any non-NULL pointer and
   * count 0); tree_mask_start NULL (the prefix sums of q_len_i^2) or N + 1 offsets. lse: [1,
   * total_q, H, 1] f32 written where data is not NULL. */
  const uint8_t* tree_mask;
  size_t tree_mask_count;
  const int64_t* tree_mask_start;
  size_t tree_mask_start_count;
  simdattn_tensor lse;
} simdattn_paged_options;

SIMDATTN_C_API void simdattn_paged_options_init(simdattn_paged_options* options);

/* attention_paged: q [1, total_q, H, D], k_cache [num_blocks, block_size, Hkv, D], v_cache
 * [num_blocks, block_size, Hkv, Dv], block_table [num_sequences, max_blocks] int32 row-major,
 * seq_lens [num_sequences], out [1, total_q, H, Dv]. options may be NULL. */
SIMDATTN_C_API simdattn_status simdattn_attention_paged(const simdattn_tensor* q, const simdattn_tensor* k_cache,
                                                        const simdattn_tensor* v_cache, const int32_t* block_table,
                                                        int64_t num_sequences, int64_t max_blocks,
                                                        const int64_t* seq_lens, const simdattn_tensor* out,
                                                        const simdattn_paged_options* options);

/* C API 4: merge_attention_states: out_a, out_b, out [1, T, H, Dv] (f32, bf16 or f16), lse_a, lse_b,
 * lse [1, T, H, 1] f32; out and lse may be out_a's and lse_a's (or b's) very tensors. */
SIMDATTN_C_API simdattn_status simdattn_merge_attention_states(const simdattn_tensor* out_a, const simdattn_tensor* lse_a,
                                                               const simdattn_tensor* out_b, const simdattn_tensor* lse_b,
                                                               const simdattn_tensor* out, const simdattn_tensor* lse);

typedef struct simdattn_kv_pool simdattn_kv_pool;

/* A pool of num_blocks blocks of block_size tokens (0: kDefaultBlockSize) for `layers` layers like
 * `layer`, in `dtype` (f32, bf16, f16, or the 8-bit int8, fp8_e4m3, fp8_e5m2). */
SIMDATTN_C_API simdattn_status simdattn_kv_pool_create(const simdattn_mha* layer, int64_t num_blocks,
                                                       int64_t block_size, int64_t layers, simdattn_dtype dtype,
                                                       simdattn_kv_pool** pool);
SIMDATTN_C_API void simdattn_kv_pool_free(simdattn_kv_pool* pool);
SIMDATTN_C_API simdattn_status simdattn_kv_pool_add(simdattn_kv_pool* pool, int64_t* sequence);
SIMDATTN_C_API simdattn_status simdattn_kv_pool_fork(simdattn_kv_pool* pool, int64_t parent, int64_t* sequence);
SIMDATTN_C_API simdattn_status simdattn_kv_pool_truncate(simdattn_kv_pool* pool, int64_t sequence, int64_t length);
SIMDATTN_C_API simdattn_status simdattn_kv_pool_release(simdattn_kv_pool* pool, int64_t sequence);
/* C API 4: KvPool::accept: of the tokens from `first` on, keeps those at relative indices kept[0 ..
 * kept_count) (strictly increasing), moved to positions first, first + 1, ... */
SIMDATTN_C_API simdattn_status simdattn_kv_pool_accept(simdattn_kv_pool* pool, int64_t seq, int64_t first,
                                                       const int64_t* kept, size_t kept_count);
/* The tokens of `sequence` in its longest layer. */
SIMDATTN_C_API simdattn_status simdattn_kv_pool_length(const simdattn_kv_pool* pool, int64_t sequence,
                                                       int64_t* length);
SIMDATTN_C_API simdattn_status simdattn_kv_pool_free_blocks(const simdattn_kv_pool* pool, int64_t* free_blocks);
/* KvPool::bytes_per_token: the bytes one token occupies per layer (an MLA layer's pool: its latent row). */
SIMDATTN_C_API simdattn_status simdattn_kv_pool_bytes_per_token(const simdattn_kv_pool* pool, int64_t* bytes);

/* PoolStep: query [1, T, d_model] of sequence `sequence`, out of the same shape. */
typedef struct simdattn_pool_step {
  size_t struct_size;
  simdattn_seq query;
  int64_t sequence;
  simdattn_seq out;
  const int64_t* positions; /* NULL or T positions */
  size_t positions_count;
  /* C API 5: the step's draft tree, [T, T] row-major, nonzero = token j sees token j' (PoolStep::
   * tree_mask); NULL: causal. A step struct of C API 4's size (ending before it) is taken, and an
   * array of them is read at its struct_size's stride. */
  const uint8_t* tree_mask;
  size_t tree_mask_count;
} simdattn_pool_step;

SIMDATTN_C_API void simdattn_pool_step_init(simdattn_pool_step* step);

/* MultiHeadAttention::forward_pool over steps[0 .. count-1] at layer `layer_index` of `pool`. */
SIMDATTN_C_API simdattn_status simdattn_mha_forward_pool(const simdattn_mha* layer, const simdattn_pool_step* steps,
                                                         size_t count, simdattn_kv_pool* pool, int64_t layer_index,
                                                         const simdattn_mha_options* options);

/* PoolScheduler over `pool` (which it then changes alone): a batch costs at most token_budget
 * tokens (0: PoolSchedulerOptions's default, 24), each batch on `threads` threads (0: OpenMP's
 * default). */
typedef struct simdattn_pool_scheduler simdattn_pool_scheduler;
SIMDATTN_C_API simdattn_status simdattn_pool_scheduler_create(const simdattn_mha* layer, simdattn_kv_pool* pool,
                                                              int64_t token_budget, int threads,
                                                              simdattn_pool_scheduler** scheduler);
/* Must not run while a step is in progress; the layer and the pool outlive it. */
SIMDATTN_C_API void simdattn_pool_scheduler_free(simdattn_pool_scheduler* scheduler);
/* A new sequence: empty (prefix < 0) or forked from `prefix`. Thread-safe, as every call below. */
SIMDATTN_C_API simdattn_status simdattn_pool_scheduler_open(simdattn_pool_scheduler* scheduler, int64_t prefix,
                                                            int64_t* sequence);
SIMDATTN_C_API simdattn_status simdattn_pool_scheduler_close(simdattn_pool_scheduler* scheduler, int64_t sequence);
/* Runs the step in batches with the other threads' steps; returns when step->out holds every row. */
SIMDATTN_C_API simdattn_status simdattn_pool_scheduler_step(simdattn_pool_scheduler* scheduler,
                                                            const simdattn_pool_step* step);
SIMDATTN_C_API simdattn_status simdattn_pool_scheduler_length(const simdattn_pool_scheduler* scheduler,
                                                              int64_t sequence, int64_t* length);
/* PoolScheduler::accept: of `sequence`'s drafts from position `first` on, keeps kept[0 .. count-1]. */
SIMDATTN_C_API simdattn_status simdattn_pool_scheduler_accept(simdattn_pool_scheduler* scheduler, int64_t sequence,
                                                              int64_t first, const int64_t* kept, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* SIMDATTN_C_POOL_H */
