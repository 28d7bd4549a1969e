/* The C API's paged attention and KV pool from C11, against the installed library.
 *
 * simdattn_attention_paged on a shuffled block table against simdattn_attention (reference
 * backend) on each sequence's gathered keys; its errors (status, argument, output untouched); the
 * pool's sequences and simdattn_mha_forward_pool against simdattn_mha_forward_cached step by step;
 * running out of blocks; 8-bit K/V codes (C API 2: simdattn_quantize_kv / _dequantize_kv, attention
 * over the codes with k_scale / v_scale against the reference on their values, an options struct
 * of C API 1's size still taken); tree masks, lse and merge_attention_states (C API 4). Exits 0
 * only if every check passes.
 *
 * Build: cc -std=c11 -Wall -Wextra -pedantic -Werror test_c_api_paged.c c_api_check.c $(pkg-config
 * --cflags --libs simdattn) -lm
 */
#include <simdattn/simdattn.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "c_api_check.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { /* [-1, 1) */
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

enum { N = 3, H = 4, HKV = 2, D = 8, BS = 4, NB = 16, MAXB = 5 };

static void random_fill(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = frand();
}
/* [1, 6, H, last]: the 6 query tokens' q, out or lse */
static simdattn_tensor tokens(float* x, int64_t last) { return simdattn_tensor_contiguous(x, SIMDATTN_F32, 1, 6, H, last); }
/* [NB, BS, HKV, D]: a cache */
static simdattn_tensor blocks(float* x) { return simdattn_tensor_contiguous(x, SIMDATTN_F32, NB, BS, HKV, D); }

static void test_attention_paged(void) {
  static const int64_t lens[N] = {9, 1, 17}, qlens[N] = {2, 1, 3};
  const int64_t qstart[N + 1] = {0, 2, 3, 6};
  /* sequence i's block c is block (7 * (i * MAXB + c) + 3) % NB: a shuffled table */
  int32_t table[N * MAXB];
  for (int i = 0; i < N * MAXB; ++i) table[i] = (int32_t)((7 * i + 3) % NB);
  static float q[6 * H * D], k[NB * BS * HKV * D], v[NB * BS * HKV * D], out[6 * H * D];
  random_fill(q, sizeof q / sizeof *q), random_fill(k, sizeof k / sizeof *k), random_fill(v, sizeof v / sizeof *v);
  const simdattn_tensor tq = tokens(q, D), tk = blocks(k), tv = blocks(v), to = tokens(out, D);
  simdattn_paged_options po;
  simdattn_paged_options_init(&po);
  po.query_start = qstart, po.query_start_count = N + 1;
  po.has_softcap = 1, po.softcap = 3.0;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to, &po) == SIMDATTN_OK);
  /* each sequence dense: K, V [1, HKV, L, D], q [1, H, ql, D] from [ql, H, D] by strides */
  for (int i = 0; i < N; ++i) {
    static float kd[HKV * 32 * D], vd[HKV * 32 * D], od[H * 3 * D];
    for (int64_t t = 0; t < lens[i]; ++t)
      for (int h = 0; h < HKV; ++h)
        for (int d = 0; d < D; ++d) {
          const int64_t blk = table[i * MAXB + t / BS], at = ((blk * BS + t % BS) * HKV + h) * D + d;
          kd[(h * lens[i] + t) * D + d] = k[at];
          vd[(h * lens[i] + t) * D + d] = v[at];
        }
    simdattn_tensor qi = simdattn_tensor_contiguous(q + qstart[i] * H * D, SIMDATTN_F32, 1, H, qlens[i], D);
    qi.strides[1] = D, qi.strides[2] = H * D;
    const simdattn_tensor ki = simdattn_tensor_contiguous(kd, SIMDATTN_F32, 1, HKV, lens[i], D);
    const simdattn_tensor vi = simdattn_tensor_contiguous(vd, SIMDATTN_F32, 1, HKV, lens[i], D);
    const simdattn_tensor oi = simdattn_tensor_contiguous(od, SIMDATTN_F32, 1, H, qlens[i], D);
    simdattn_attention_options ao;
    simdattn_attention_options_init(&ao);
    ao.causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT;
    ao.has_softcap = 1, ao.softcap = 3.0;
    ao.backend = SIMDATTN_BACKEND_REFERENCE;
    CHECK(simdattn_attention(&qi, &ki, &vi, &oi, &ao) == SIMDATTN_OK);
    double err = 0;
    for (int64_t t = 0; t < qlens[i]; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d)
          err = fmax(err, fabs((double)out[((qstart[i] + t) * H + h) * D + d] - od[(h * qlens[i] + t) * D + d]));
    CHECK(err <= 1e-5);
  }
  /* errors: a block out of range, a row too short, query_start not increasing */
  for (size_t i = 0; i < sizeof out / sizeof *out; ++i) out[i] = 42.0f;
  table[1] = NB;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to, &po) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "block_table") == 0);
  table[1] = 0;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, 2, lens, &to, &po) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "block_table") == 0);
  const int64_t bad_start[N + 1] = {0, 3, 2, 6};
  po.query_start = bad_start;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to, &po) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "options.query_start") == 0);
  int untouched = 1;
  for (size_t i = 0; i < sizeof out / sizeof *out; ++i) untouched &= out[i] == 42.0f;
  CHECK(untouched);
}

static void test_pool(void) {
  enum { DM = 16, PH = 2, HD = 8 };
  static float w[4][DM * DM];
  for (int m = 0; m < 4; ++m)
    for (int i = 0; i < DM * DM; ++i) w[m][i] = 0.3f * frand();
  simdattn_mha_config cfg;
  simdattn_mha_config_init(&cfg);
  cfg.d_model = DM, cfg.heads = PH;
  simdattn_mha_weights wt;
  simdattn_mha_weights_init(&wt);
  wt.dtype = SIMDATTN_F32;
  wt.wq = w[0], wt.wk = w[1], wt.wv = w[2], wt.wo = w[3];
  simdattn_mha* layer = NULL;
  CHECK(simdattn_mha_create(&cfg, &wt, &layer) == SIMDATTN_OK);
  simdattn_kv_pool* pool = NULL;
  CHECK(simdattn_kv_pool_create(layer, 8, 4, 1, SIMDATTN_F32, &pool) == SIMDATTN_OK);
  simdattn_kv_cache* cache = NULL;
  CHECK(simdattn_kv_cache_create(layer, 1, 32, &cache) == SIMDATTN_OK);
  int64_t s = -1, c = -1, len = 0, free_blocks = 0;
  CHECK(simdattn_kv_pool_add(pool, &s) == SIMDATTN_OK);
  static float x[6 * DM], y[6 * DM], want[6 * DM];
  const int64_t steps[3] = {6, 1, 1};
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < steps[r] * DM; ++i) x[i] = frand();
    const simdattn_seq xs = simdattn_seq_make(x, SIMDATTN_F32, 1, steps[r], DM);
    const simdattn_seq ys = simdattn_seq_make(y, SIMDATTN_F32, 1, steps[r], DM);
    const simdattn_seq ws = simdattn_seq_make(want, SIMDATTN_F32, 1, steps[r], DM);
    simdattn_pool_step st;
    simdattn_pool_step_init(&st);
    st.query = xs, st.out = ys, st.sequence = s;
    CHECK(simdattn_mha_forward_pool(layer, &st, 1, pool, 0, NULL) == SIMDATTN_OK);
    CHECK(simdattn_mha_forward_cached(layer, &xs, cache, &ws, NULL) == SIMDATTN_OK);
    double err = 0;
    for (int i = 0; i < steps[r] * DM; ++i) err = fmax(err, fabs((double)y[i] - want[i]));
    CHECK(err <= 2e-5);
  }
  CHECK(simdattn_kv_pool_length(pool, s, &len) == SIMDATTN_OK && len == 8);
  CHECK(simdattn_kv_pool_free_blocks(pool, &free_blocks) == SIMDATTN_OK && free_blocks == 6);
  int64_t per_token = 0;  /* K and V rows of every head, f32 */
  CHECK(simdattn_kv_pool_bytes_per_token(pool, &per_token) == SIMDATTN_OK && per_token == 2 * DM * 4);
  CHECK(simdattn_kv_cache_bytes_per_token(cache, &per_token) == SIMDATTN_OK && per_token == 2 * DM * 4);
  CHECK(simdattn_kv_pool_bytes_per_token(pool, NULL) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(simdattn_kv_pool_fork(pool, s, &c) == SIMDATTN_OK && c != s);
  CHECK(simdattn_kv_pool_free_blocks(pool, &free_blocks) == SIMDATTN_OK && free_blocks == 6);
  /* 25 more tokens of the child need 7 blocks: 6 are free */
  static float big[25 * DM], big_out[25 * DM];
  simdattn_pool_step st;
  simdattn_pool_step_init(&st);
  st.query = simdattn_seq_make(big, SIMDATTN_F32, 1, 25, DM);
  st.out = simdattn_seq_make(big_out, SIMDATTN_F32, 1, 25, DM);
  st.sequence = c;
  CHECK(simdattn_mha_forward_pool(layer, &st, 1, pool, 0, NULL) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "pool") == 0);
  CHECK(simdattn_kv_pool_length(pool, c, &len) == SIMDATTN_OK && len == 8);
  { /* C API 4: accept keeps drafts 0 and 2 of tokens 5 .. 7; a bad kept changes nothing */
    const int64_t kept[2] = {0, 2}, bad[2] = {2, 1};
    CHECK(simdattn_kv_pool_accept(pool, c, 5, bad, 2) == SIMDATTN_ERROR_INVALID_ARGUMENT);
    CHECK(strcmp(simdattn_last_error_argument(), "kept") == 0);
    CHECK(simdattn_kv_pool_length(pool, c, &len) == SIMDATTN_OK && len == 8);
    CHECK(simdattn_kv_pool_accept(pool, c, 5, kept, 2) == SIMDATTN_OK);
    CHECK(simdattn_kv_pool_length(pool, c, &len) == SIMDATTN_OK && len == 7);
  }
  CHECK(simdattn_kv_pool_release(pool, c) == SIMDATTN_OK);
  CHECK(simdattn_kv_pool_release(pool, s) == SIMDATTN_OK);
  CHECK(simdattn_kv_pool_free_blocks(pool, &free_blocks) == SIMDATTN_OK && free_blocks == 8);
  CHECK(simdattn_kv_pool_release(pool, s) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "sequence") == 0);
  /* the scheduler: a prompt in chunks of 3 tokens, then a decode step, against the cached forward */
  simdattn_pool_scheduler* sched = NULL;
  CHECK(simdattn_pool_scheduler_create(layer, pool, 3, 1, &sched) == SIMDATTN_OK);
  simdattn_kv_cache_reset(cache);
  int64_t q = -1;
  CHECK(simdattn_pool_scheduler_open(sched, -1, &q) == SIMDATTN_OK);
  for (int r = 0; r < 2; ++r) {
    const int64_t t = r == 0 ? 6 : 1;
    for (int i = 0; i < t * DM; ++i) x[i] = frand();
    simdattn_pool_step ps;
    simdattn_pool_step_init(&ps);
    ps.query = simdattn_seq_make(x, SIMDATTN_F32, 1, t, DM);
    ps.out = simdattn_seq_make(y, SIMDATTN_F32, 1, t, DM);
    ps.sequence = q;
    const simdattn_seq ws = simdattn_seq_make(want, SIMDATTN_F32, 1, t, DM);
    CHECK(simdattn_pool_scheduler_step(sched, &ps) == SIMDATTN_OK);
    CHECK(simdattn_mha_forward_cached(layer, &ps.query, cache, &ws, NULL) == SIMDATTN_OK);
    double err = 0;
    for (int i = 0; i < t * DM; ++i) err = fmax(err, fabs((double)y[i] - want[i]));
    CHECK(err <= 1e-4);
  }
  CHECK(simdattn_pool_scheduler_length(sched, q, &len) == SIMDATTN_OK && len == 7);
  CHECK(simdattn_pool_scheduler_close(sched, q) == SIMDATTN_OK);
  CHECK(simdattn_pool_scheduler_close(sched, q) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  simdattn_pool_scheduler_free(sched);
  simdattn_kv_cache_free(cache);
  simdattn_kv_pool_free(pool);
  simdattn_mha_free(layer);
}

static void test_codes(void) {
  enum { SQ = 3, SK = 37 };
  static float q[H * SQ * D], k[HKV * SK * D], v[HKV * SK * D], kh[HKV * SK * D], vh[HKV * SK * D];
  static float ks[HKV * SK], vs[HKV * SK], out[H * SQ * D], want[H * SQ * D];
  static int8_t kc[HKV * SK * D], vc[HKV * SK * D];
  const int64_t qshape[4] = {1, H, SQ, D}, kshape[4] = {1, HKV, SK, D}, sshape[4] = {1, HKV, SK, 1};
  simdattn_tensor tq, tk, tv, tkc, tvc, tks, tvs, tkh, tvh, to, tw;
  simdattn_attention_options o, ref, v1;
  int i;
  for (i = 0; i < H * SQ * D; ++i) q[i] = frand();
  for (i = 0; i < HKV * SK * D; ++i) k[i] = frand(), v[i] = frand();
  tq = simdattn_tensor_contiguous(q, SIMDATTN_F32, qshape[0], qshape[1], qshape[2], qshape[3]);
  tk = simdattn_tensor_contiguous(k, SIMDATTN_F32, kshape[0], kshape[1], kshape[2], kshape[3]);
  tv = simdattn_tensor_contiguous(v, SIMDATTN_F32, kshape[0], kshape[1], kshape[2], kshape[3]);
  tkc = simdattn_tensor_contiguous(kc, SIMDATTN_INT8, kshape[0], kshape[1], kshape[2], kshape[3]);
  tvc = simdattn_tensor_contiguous(vc, SIMDATTN_INT8, kshape[0], kshape[1], kshape[2], kshape[3]);
  tks = simdattn_tensor_contiguous(ks, SIMDATTN_F32, sshape[0], sshape[1], sshape[2], sshape[3]);
  tvs = simdattn_tensor_contiguous(vs, SIMDATTN_F32, sshape[0], sshape[1], sshape[2], sshape[3]);
  tkh = simdattn_tensor_contiguous(kh, SIMDATTN_F32, kshape[0], kshape[1], kshape[2], kshape[3]);
  tvh = simdattn_tensor_contiguous(vh, SIMDATTN_F32, kshape[0], kshape[1], kshape[2], kshape[3]);
  to = simdattn_tensor_contiguous(out, SIMDATTN_F32, qshape[0], qshape[1], qshape[2], qshape[3]);
  tw = simdattn_tensor_contiguous(want, SIMDATTN_F32, qshape[0], qshape[1], qshape[2], qshape[3]);
  CHECK(simdattn_quantize_kv(&tk, SIMDATTN_INT8, &tkc, &tks) == SIMDATTN_OK);
  CHECK(simdattn_quantize_kv(&tv, SIMDATTN_INT8, &tvc, &tvs) == SIMDATTN_OK);
  CHECK(simdattn_dequantize_kv(&tkc, &tks, &tkh) == SIMDATTN_OK);
  CHECK(simdattn_dequantize_kv(&tvc, &tvs, &tvh) == SIMDATTN_OK);
  for (i = 0; i < HKV * SK; ++i) { /* the scales of the formula, and the values within half a step */
    float mx = 0;
    int d;
    for (d = 0; d < D; ++d) mx = fabsf(k[i * D + d]) > mx ? fabsf(k[i * D + d]) : mx;
    CHECK(ks[i] == mx / 127.0f);
    for (d = 0; d < D; ++d) CHECK(fabsf(kh[i * D + d] - k[i * D + d]) <= 0.5f * ks[i] * 1.0001f);
  }
  simdattn_attention_options_init(&o);
  o.causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT;
  o.k_scale = tks, o.v_scale = tvs;
  CHECK(simdattn_attention(&tq, &tkc, &tvc, &to, &o) == SIMDATTN_OK);
  simdattn_attention_options_init(&ref);
  ref.causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT;
  ref.backend = SIMDATTN_BACKEND_REFERENCE;
  CHECK(simdattn_attention(&tq, &tkh, &tvh, &tw, &ref) == SIMDATTN_OK);
  for (i = 0; i < H * SQ * D; ++i) CHECK(fabsf(out[i] - want[i]) <= 1e-5f);
  /* errors: no scales; a negative scale; a NaN row to quantize */
  o.k_scale.data = NULL;
  CHECK(simdattn_attention(&tq, &tkc, &tvc, &to, &o) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "options.k_scale") == 0);
  o.k_scale = tks;
  ks[5] = -1.0f;
  CHECK(simdattn_attention(&tq, &tkc, &tvc, &to, &o) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "options.k_scale") == 0);
  k[3] = NAN;
  CHECK(simdattn_quantize_kv(&tk, SIMDATTN_INT8, &tkc, &tks) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "x") == 0);
  CHECK(ks[5] == -1.0f); /* nothing written */
  /* an options struct of C API 1's size (without k_scale and v_scale) is still taken */
  v1 = ref;
  v1.struct_size = offsetof(simdattn_attention_options, k_scale);
  CHECK(simdattn_attention(&tq, &tkh, &tvh, &to, &v1) == SIMDATTN_OK);
  for (i = 0; i < H * SQ * D; ++i) CHECK(out[i] == want[i]);
  v1.struct_size = offsetof(simdattn_attention_options, k_scale) - 8;
  CHECK(simdattn_attention(&tq, &tkh, &tvh, &to, &v1) == SIMDATTN_ERROR_VERSION);
  CHECK(simdattn_c_api_version() == 7);
}

/* C API 4: tree masks, lse and merge_attention_states. A tree mask showing each new token its
 * predecessors and itself is bottom-right causal; a state merged with itself is itself, its lse
 * + log 2. An options struct of C API 3's size (without the tree mask and lse) is still taken. */
static void test_speculative(void) {
  static const int64_t lens[N] = {9, 1, 17};
  const int64_t qstart[N + 1] = {0, 2, 3, 6};
  /* the sequences' [q_len, q_len] matrices, q_len 2, 1 and 3, lower-triangular */
  static const uint8_t tril[4 + 1 + 9] = {1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1};
  int32_t table[N * MAXB];
  for (int i = 0; i < N * MAXB; ++i) table[i] = (int32_t)((5 * i + 1) % NB);
  static float q[6 * H * D], k[NB * BS * HKV * D], v[NB * BS * HKV * D], out[6 * H * D], out2[6 * H * D];
  static float lse[6 * H], lse2[6 * H], merged[6 * H * D], merged_lse[6 * H];
  random_fill(q, sizeof q / sizeof *q), random_fill(k, sizeof k / sizeof *k), random_fill(v, sizeof v / sizeof *v);
  const simdattn_tensor tq = tokens(q, D), tk = blocks(k), tv = blocks(v), to = tokens(out, D), to2 = tokens(out2, D);
  const simdattn_tensor tl = tokens(lse, 1), tl2 = tokens(lse2, 1), tm = tokens(merged, D), tml = tokens(merged_lse, 1);
  simdattn_paged_options po, tree, v3;
  simdattn_paged_options_init(&po);
  po.query_start = qstart, po.query_start_count = N + 1;
  po.lse = tl;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to, &po) == SIMDATTN_OK);
  tree = po;
  tree.tree_mask = tril, tree.tree_mask_count = sizeof tril;
  tree.lse = tl2;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to2, &tree) == SIMDATTN_OK);
  CHECK(memcmp(out, out2, sizeof out) == 0);
  CHECK(memcmp(lse, lse2, sizeof lse) == 0);
  for (int i = 0; i < 6 * H; ++i) CHECK(isfinite(lse[i]));
  CHECK(simdattn_merge_attention_states(&to, &tl, &to, &tl, &tm, &tml) == SIMDATTN_OK);
  for (int i = 0; i < 6 * H * D; ++i) CHECK(merged[i] == out[i]);
  for (int i = 0; i < 6 * H; ++i) CHECK(fabs((double)merged_lse[i] - (lse[i] + log(2.0))) <= 1e-6);
  /* errors: matrices one element short; tree_mask_start 3^2 apart; a window; merge shapes */
  tree.tree_mask_count = sizeof tril - 1;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to2, &tree) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "tree_mask") == 0);
  tree.tree_mask_count = sizeof tril;
  {
    const int64_t starts[N + 1] = {0, 4, 5, 13};
    tree.tree_mask_start = starts, tree.tree_mask_start_count = N + 1;
    CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to2, &tree) == SIMDATTN_ERROR_INVALID_ARGUMENT);
    CHECK(strcmp(simdattn_last_error_argument(), "tree_mask_start") == 0);
    tree.tree_mask_start = NULL, tree.tree_mask_start_count = 0;
  }
  tree.has_window = 1, tree.window_left = 2, tree.window_right = 0;
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to2, &tree) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "tree_mask") == 0);
  CHECK(simdattn_merge_attention_states(&to, &tl, &to, &to, &tm, &tml) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "lse_b") == 0);
  /* C API 3's struct, without the tree mask and lse: taken, the same output */
  v3 = po;
  v3.struct_size = offsetof(simdattn_paged_options, tree_mask);
  CHECK(simdattn_attention_paged(&tq, &tk, &tv, table, N, MAXB, lens, &to2, &v3) == SIMDATTN_OK);
  CHECK(memcmp(out, out2, sizeof out) == 0);
}

/* C API 5: a pool step's draft tree (simdattn_pool_step's tree_mask): a lower-triangular tree is
 * the causal step, bitwise; a tree of two siblings gives the second what a causal step of it
 * alone gives, and simdattn_pool_scheduler_accept keeps it; an array of C API 4's step size is
 * read at that stride. */
static void test_pool_trees(void) {
  enum { DM = 16, PH = 2 };
  static float w[4][DM * DM];
  for (int m = 0; m < 4; ++m)
    for (int i = 0; i < DM * DM; ++i) w[m][i] = 0.3f * frand();
  simdattn_mha_config cfg;
  simdattn_mha_config_init(&cfg);
  cfg.d_model = DM, cfg.heads = PH;
  simdattn_mha_weights wt;
  simdattn_mha_weights_init(&wt);
  wt.dtype = SIMDATTN_F32;
  wt.wq = w[0], wt.wk = w[1], wt.wv = w[2], wt.wo = w[3];
  simdattn_mha* layer = NULL;
  CHECK(simdattn_mha_create(&cfg, &wt, &layer) == SIMDATTN_OK);
  simdattn_kv_pool* pool = NULL;
  CHECK(simdattn_kv_pool_create(layer, 16, 4, 1, SIMDATTN_F32, &pool) == SIMDATTN_OK);
  int64_t a = -1, b = -1;
  CHECK(simdattn_kv_pool_add(pool, &a) == SIMDATTN_OK && simdattn_kv_pool_add(pool, &b) == SIMDATTN_OK);
  static float x[3 * DM], ya[3 * DM], yb[3 * DM];
  for (int i = 0; i < 3 * DM; ++i) x[i] = frand();
  /* both sequences: the same 3 tokens, a causal and as a lower-triangular tree, in one call */
  const uint8_t tril[9] = {1, 0, 0, 1, 1, 0, 1, 1, 1};
  simdattn_pool_step st[2];
  for (int i = 0; i < 2; ++i) {
    simdattn_pool_step_init(&st[i]);
    st[i].query = simdattn_seq_make(x, SIMDATTN_F32, 1, 3, DM);
    st[i].out = simdattn_seq_make(i == 0 ? ya : yb, SIMDATTN_F32, 1, 3, DM);
    st[i].sequence = i == 0 ? a : b;
  }
  st[1].tree_mask = tril, st[1].tree_mask_count = 9;
  CHECK(simdattn_mha_forward_pool(layer, st, 2, pool, 0, NULL) == SIMDATTN_OK);
  for (int i = 0; i < 3 * DM; ++i) CHECK(ya[i] == yb[i]);
  st[1].tree_mask_count = 8; /* not [T, T] */
  CHECK(simdattn_mha_forward_pool(layer, &st[1], 1, pool, 0, NULL) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "steps[0].tree_mask") == 0);
  /* C API 4's step size: an array read at that stride (no tree mask: causal) */
  static unsigned char old[2 * sizeof(simdattn_pool_step)];
  const size_t v4 = offsetof(simdattn_pool_step, tree_mask);
  static float y4[3 * DM], y4b[DM];
  simdattn_pool_step o0 = st[0], o1 = st[0];
  o0.struct_size = v4, o0.out = simdattn_seq_make(y4, SIMDATTN_F32, 1, 3, DM), o0.sequence = a;
  o1.struct_size = v4, o1.query = simdattn_seq_make(x, SIMDATTN_F32, 1, 1, DM), o1.out = simdattn_seq_make(y4b, SIMDATTN_F32, 1, 1, DM);
  o1.sequence = b;
  memcpy(old, &o0, v4);
  memcpy(old + v4, &o1, v4);
  CHECK(simdattn_mha_forward_pool(layer, (const simdattn_pool_step*)old, 2, pool, 0, NULL) == SIMDATTN_OK);
  int64_t len = 0;
  CHECK(simdattn_kv_pool_length(pool, a, &len) == SIMDATTN_OK && len == 6);
  CHECK(simdattn_kv_pool_length(pool, b, &len) == SIMDATTN_OK && len == 4);
  /* through the scheduler: two sibling drafts over b, the second accepted */
  simdattn_pool_scheduler* sched = NULL;
  CHECK(simdattn_pool_scheduler_create(layer, pool, 0, 1, &sched) == SIMDATTN_OK);
  int64_t c = -1;
  CHECK(simdattn_pool_scheduler_open(sched, b, &c) == SIMDATTN_OK);
  static float d[2 * DM], yd[2 * DM], yc[DM];
  for (int i = 0; i < 2 * DM; ++i) d[i] = frand();
  const uint8_t siblings[4] = {1, 0, 0, 1};
  const int64_t pos[2] = {4, 4};
  simdattn_pool_step t;
  simdattn_pool_step_init(&t);
  t.query = simdattn_seq_make(d, SIMDATTN_F32, 1, 2, DM), t.out = simdattn_seq_make(yd, SIMDATTN_F32, 1, 2, DM);
  t.sequence = b, t.positions = pos, t.positions_count = 2, t.tree_mask = siblings, t.tree_mask_count = 4;
  CHECK(simdattn_pool_scheduler_step(sched, &t) == SIMDATTN_OK);
  const int64_t kept[1] = {1};
  CHECK(simdattn_pool_scheduler_accept(sched, b, 4, kept, 1) == SIMDATTN_OK);
  CHECK(simdattn_pool_scheduler_length(sched, b, &len) == SIMDATTN_OK && len == 5);
  simdattn_pool_step u;
  simdattn_pool_step_init(&u);
  u.query = simdattn_seq_make(d + DM, SIMDATTN_F32, 1, 1, DM), u.out = simdattn_seq_make(yc, SIMDATTN_F32, 1, 1, DM);
  u.sequence = c;
  CHECK(simdattn_pool_scheduler_step(sched, &u) == SIMDATTN_OK);
  double err = 0;
  for (int i = 0; i < DM; ++i) err = fmax(err, fabs((double)yc[i] - yd[DM + i]));
  CHECK(err <= 1e-5);
  const int64_t bad[2] = {1, 0};
  CHECK(simdattn_pool_scheduler_accept(sched, b, 4, bad, 2) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "kept") == 0);
  CHECK(simdattn_pool_scheduler_close(sched, c) == SIMDATTN_OK);
  simdattn_pool_scheduler_free(sched);
  simdattn_kv_pool_free(pool);
  simdattn_mha_free(layer);
}

/* C API 5: simdattn_gated_delta_rule against the recurrence written out in double (T 70: the
 * chunked form past one chunk), the final state, a g > 0 named "g". */
static void test_gated_delta(void) {
  enum { GT = 70, GH = 2, GD = 4, GV = 3 };
  static float q[GT * GH * GD], k[GT * GH * GD], v[GT * GH * GV], g[GT * GH], beta[GT * GH], out[GT * GH * GV],
      fin[GH * GD * GV];
  for (int i = 0; i < GT * GH * GD; ++i) q[i] = frand(), k[i] = 0.3f * frand();
  for (int i = 0; i < GT * GH * GV; ++i) v[i] = frand();
  for (int i = 0; i < GT * GH; ++i) g[i] = -0.2f * fabsf(frand()), beta[i] = 0.5f + 0.4f * frand();
  const simdattn_tensor tq = simdattn_tensor_contiguous(q, SIMDATTN_F32, 1, GT, GH, GD);
  const simdattn_tensor tk = simdattn_tensor_contiguous(k, SIMDATTN_F32, 1, GT, GH, GD);
  const simdattn_tensor tv = simdattn_tensor_contiguous(v, SIMDATTN_F32, 1, GT, GH, GV);
  const simdattn_tensor tg = simdattn_tensor_contiguous(g, SIMDATTN_F32, 1, GT, GH, 1);
  const simdattn_tensor tb = simdattn_tensor_contiguous(beta, SIMDATTN_F32, 1, GT, GH, 1);
  const simdattn_tensor to = simdattn_tensor_contiguous(out, SIMDATTN_F32, 1, GT, GH, GV);
  simdattn_gated_delta_options o;
  simdattn_gated_delta_options_init(&o);
  o.final_state = simdattn_tensor_contiguous(fin, SIMDATTN_F32, 1, GH, GD, GV);
  o.has_scale = 1;
  o.scale = 0.5;
  CHECK(simdattn_gated_delta_rule(&tq, &tk, &tv, &tg, &tb, &to, &o) == SIMDATTN_OK);
  double err = 0;
  for (int h = 0; h < GH; ++h) {
    double S[GD][GV] = {{0}};
    for (int t = 0; t < GT; ++t) {
      const float* qt = q + (t * GH + h) * GD;
      const float* kt = k + (t * GH + h) * GD;
      const double decay = exp((double)g[t * GH + h]), b = beta[t * GH + h];
      for (int d = 0; d < GD; ++d)
        for (int j = 0; j < GV; ++j) S[d][j] *= decay;
      for (int j = 0; j < GV; ++j) {
        double sk = 0;
        for (int d = 0; d < GD; ++d) sk += S[d][j] * kt[d];
        const double u = b * (v[(t * GH + h) * GV + j] - sk);
        for (int d = 0; d < GD; ++d) S[d][j] += kt[d] * u;
      }
      for (int j = 0; j < GV; ++j) {
        double o_ = 0;
        for (int d = 0; d < GD; ++d) o_ += S[d][j] * 0.5 * qt[d];
        err = fmax(err, fabs(o_ - out[(t * GH + h) * GV + j]));
      }
    }
    for (int d = 0; d < GD; ++d)
      for (int j = 0; j < GV; ++j) err = fmax(err, fabs(S[d][j] - fin[(h * GD + d) * GV + j]));
  }
  CHECK(err <= 1e-4);
  /* C API 7: has_scale takes any finite scale, 0 included (the output 0); a struct of C API 5's
   * size (without has_scale) reads scale 0 as the default Dk^-1/2 = 0.5 (the output above) */
  static float out0[GT * GH * GV], out5[GT * GH * GV];
  simdattn_gated_delta_options z = o;
  z.final_state.data = NULL;
  z.scale = 0.0;
  const simdattn_tensor to0 = simdattn_tensor_contiguous(out0, SIMDATTN_F32, 1, GT, GH, GV);
  const simdattn_tensor to5 = simdattn_tensor_contiguous(out5, SIMDATTN_F32, 1, GT, GH, GV);
  for (int i = 0; i < GT * GH * GV; ++i) out0[i] = 1.0f;
  CHECK(simdattn_gated_delta_rule(&tq, &tk, &tv, &tg, &tb, &to0, &z) == SIMDATTN_OK);
  z.struct_size = offsetof(simdattn_gated_delta_options, has_scale);
  CHECK(simdattn_gated_delta_rule(&tq, &tk, &tv, &tg, &tb, &to5, &z) == SIMDATTN_OK);
  int zeros = 1, same = 1;
  for (int i = 0; i < GT * GH * GV; ++i) zeros &= out0[i] == 0.0f, same &= out5[i] == out[i];
  CHECK(zeros && same);
  z.struct_size = sizeof z;
  z.threads = -1;
  CHECK(simdattn_gated_delta_rule(&tq, &tk, &tv, &tg, &tb, &to0, &z) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "options.threads") == 0);
  g[5] = 0.25f;
  CHECK(simdattn_gated_delta_rule(&tq, &tk, &tv, &tg, &tb, &to, NULL) == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(simdattn_last_error_argument(), "g") == 0);
}

int main(void) {
  test_attention_paged();
  test_pool();
  test_codes();
  test_speculative();
  test_pool_trees();
  test_gated_delta();
  return report("test_c_api_paged");
}
