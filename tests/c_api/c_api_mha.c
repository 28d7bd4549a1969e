/* The C API's multi-head attention layer from C11: simdattn_mha_create and its info, the forward
 * (self, causal, cross) against a double-precision reference written here, the KV cache step by step,
 * in chunks, after a truncation and a reset, running out of capacity; every error, outputs untouched. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_api_cases.h"
#include "c_api_check.h"

float g_wq[MH * HD * DM], g_wk[MHKV * HD * DM], g_wv[MHKV * HD * DM], g_wo[DM * MH * HD];
float g_bq[MH * HD], g_bk[MHKV * HD], g_bv[MHKV * HD], g_bo[DM];

/* y [rows, n_out] = x [rows, n_in] W^T + b, W [n_out, n_in] */
static void linear_ref(const double* x, int rows, int n_in, const float* w, const float* bias, int n_out, double* y) {
  int r, o, i;
  for (r = 0; r < rows; ++r)
    for (o = 0; o < n_out; ++o) {
      double s = bias != NULL ? (double)bias[o] : 0.0;
      for (i = 0; i < n_in; ++i) s += x[r * n_in + i] * (double)w[o * n_in + i];
      y[r * n_out + o] = s;
    }
}

/* The layer's self-attention forward in double: y [MB, MS, DM] from x [MB, MS, DM]. */
static void reference_mha(const double* x, int causal, double* y) {
  static double q[MB * MS * MH * HD], k[MB * MS * MHKV * HD], v[MB * MS * MHKV * HD], o[MB * MS * MH * HD];
  int b, h, i, j, d;
  const double scale = 1.0 / sqrt((double)HD);
  linear_ref(x, MB * MS, DM, g_wq, g_bq, MH * HD, q);
  linear_ref(x, MB * MS, DM, g_wk, g_bk, MHKV * HD, k);
  linear_ref(x, MB * MS, DM, g_wv, g_bv, MHKV * HD, v);
  for (b = 0; b < MB; ++b)
    for (h = 0; h < MH; ++h)
      for (i = 0; i < MS; ++i) {
        const int g = h / (MH / MHKV);
        const double* qi = q + (b * MS + i) * MH * HD + h * HD;
        double s[MS], m = -INFINITY, den = 0.0;
        double* oi = o + (b * MS + i) * MH * HD + h * HD;
        const int last = causal ? i : MS - 1;
        for (j = 0; j <= last; ++j) {
          const double* kj = k + (b * MS + j) * MHKV * HD + g * HD;
          s[j] = 0.0;
          for (d = 0; d < HD; ++d) s[j] += qi[d] * kj[d];
          s[j] *= scale;
          if (s[j] > m) m = s[j];
        }
        for (d = 0; d < HD; ++d) oi[d] = 0.0;
        for (j = 0; j <= last; ++j) {
          const double w = exp(s[j] - m);
          const double* vj = v + (b * MS + j) * MHKV * HD + g * HD;
          den += w;
          for (d = 0; d < HD; ++d) oi[d] += w * vj[d];
        }
        for (d = 0; d < HD; ++d) oi[d] /= den;
      }
  linear_ref(o, MB * MS, MH * HD, g_wo, g_bo, DM, y);
}

/* Runs tokens [t0, t0 + T) of every sequence through the cache; out_tokens [MB, T, DM]. */
static simdattn_status cached_step(const simdattn_mha* layer, simdattn_kv_cache* cache, const float* x, int t0, int T,
                                   float* out_tokens, const simdattn_mha_options* options) {
  float chunk[MB * MS * DM];
  int b, t;
  simdattn_seq qs, os;
  for (b = 0; b < MB; ++b)
    for (t = 0; t < T; ++t) memcpy(chunk + (b * T + t) * DM, x + (b * MS + t0 + t) * DM, DM * sizeof(float));
  qs = simdattn_seq_make(chunk, SIMDATTN_F32, MB, T, DM);
  os = simdattn_seq_make(out_tokens, SIMDATTN_F32, MB, T, DM);
  return simdattn_mha_forward_cached(layer, &qs, cache, &os, options);
}

static int64_t cache_length(const simdattn_kv_cache* cache, int64_t sequence) {
  int64_t n = -12345;
  CHECK_OK(simdattn_kv_cache_length(cache, sequence, &n));
  return n;
}

void test_mha(void) {
  simdattn_mha_config cfg;
  simdattn_mha_weights w;
  simdattn_mha_info info;
  simdattn_mha_options opt;
  simdattn_mha* layer = NULL;
  simdattn_kv_cache* cache = NULL;
  static float x[MB * MS * DM], y_full[MB * MS * DM], y_causal[MB * MS * DM];
  static double xd[MB * MS * DM], ref[MB * MS * DM], got[MB * MS * DM];
  float step_out[MB * MS * DM];
  int i, b, t;

  set_context("simdattn_mha_create");
  fill_floats(g_wq, MH * HD * DM, 0.4), fill_floats(g_wk, MHKV * HD * DM, 0.4);
  fill_floats(g_wv, MHKV * HD * DM, 0.4), fill_floats(g_wo, DM * MH * HD, 0.4);
  fill_floats(g_bq, MH * HD, 0.2), fill_floats(g_bk, MHKV * HD, 0.2), fill_floats(g_bv, MHKV * HD, 0.2);
  fill_floats(g_bo, DM, 0.2);
  fill_floats(x, MB * MS * DM, 1.0);
  for (i = 0; i < MB * MS * DM; ++i) xd[i] = x[i];

  simdattn_mha_config_init(&cfg);
  CHECK(cfg.struct_size == sizeof cfg && cfg.rope.struct_size == sizeof cfg.rope && cfg.rope.theta == 10000.0);
  cfg.d_model = DM, cfg.heads = MH, cfg.kv_heads = MHKV;
  simdattn_mha_weights_init(&w);
  CHECK(w.struct_size == sizeof w && w.dtype == SIMDATTN_F32 && w.wq == NULL && w.bo == NULL);
  w.wq = g_wq, w.wk = g_wk, w.wv = g_wv, w.wo = g_wo;
  w.bq = g_bq, w.bk = g_bk, w.bv = g_bv, w.bo = g_bo;
  if (!CHECK_OK(simdattn_mha_create(&cfg, &w, &layer)) || layer == NULL) {
    set_context("");
    return;
  }

  set_context("simdattn_mha_get_info");
  memset(&info, 0xAB, sizeof info);
  info.struct_size = sizeof info;
  if (CHECK_OK(simdattn_mha_get_info(layer, &info))) {
    CHECK(info.struct_size == sizeof info);
    CHECK(info.d_model == DM && info.heads == MH && info.kv_heads == MHKV && info.head_dim == HD);
    CHECK(info.kdim == DM && info.vdim == DM);
    CHECK(info.dtype == SIMDATTN_F32 && info.causal == 0);
  }
  { /* an output struct from a newer caller: the bytes past ours come back zero */
    unsigned char* big = malloc(sizeof(simdattn_mha_info) + 16);
    simdattn_mha_info* bi = (simdattn_mha_info*)(void*)big;
    size_t z;
    int zero = 1;
    memset(big, 0xAB, sizeof(simdattn_mha_info) + 16);
    bi->struct_size = sizeof(simdattn_mha_info) + 16;
    if (CHECK_OK(simdattn_mha_get_info(layer, bi))) {
      CHECK(bi->struct_size == sizeof(simdattn_mha_info) + 16);
      CHECK(bi->d_model == DM && bi->heads == MH && bi->kv_heads == MHKV && bi->head_dim == HD);
      for (z = sizeof(simdattn_mha_info); z < sizeof(simdattn_mha_info) + 16; ++z) zero &= big[z] == 0;
      CHECK(zero);
    }
    free(big);
  }
  info.struct_size = sizeof info - 4;
  info.d_model = -5;
  CHECK_ERROR(simdattn_mha_get_info(layer, &info), SIMDATTN_ERROR_VERSION, "info");
  CHECK(info.d_model == -5);
  CHECK_ERROR(simdattn_mha_get_info(layer, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "info");
  CHECK_ERROR(simdattn_mha_get_info(NULL, &info), SIMDATTN_ERROR_INVALID_ARGUMENT, "layer");

  set_context("simdattn_mha_forward vs. the reference");
  {
    simdattn_seq xs = simdattn_seq_make(x, SIMDATTN_F32, MB, MS, DM);
    simdattn_seq ys = simdattn_seq_make(y_full, SIMDATTN_F32, MB, MS, DM);
    CHECK(xs.struct_size == sizeof xs && xs.data == x && xs.batch == MB && xs.seq == MS && xs.width == DM);
    if (CHECK_OK(simdattn_mha_forward(layer, &xs, &ys, NULL))) {
      reference_mha(xd, 0, ref);
      for (i = 0; i < MB * MS * DM; ++i) got[i] = y_full[i];
      CHECK_CLOSE(got, ref, MB * MS * DM, 1e-4, "forward, no options");
    }
    simdattn_mha_options_init(&opt);
    CHECK(opt.struct_size == sizeof opt && opt.causal == SIMDATTN_CAUSAL_NONE && opt.backend == SIMDATTN_BACKEND_NATIVE);
    opt.causal = SIMDATTN_CAUSAL_TOP_LEFT;
    ys.data = y_causal;
    if (CHECK_OK(simdattn_mha_forward(layer, &xs, &ys, &opt))) {
      reference_mha(xd, 1, ref);
      for (i = 0; i < MB * MS * DM; ++i) got[i] = y_causal[i];
      CHECK_CLOSE(got, ref, MB * MS * DM, 1e-4, "forward, causal top-left");
    }
    /* cross-attention with key = value = query is the self-attention */
    {
      static float y_cross[MB * MS * DM];
      simdattn_seq cs = simdattn_seq_make(y_cross, SIMDATTN_F32, MB, MS, DM);
      if (CHECK_OK(simdattn_mha_forward_cross(layer, &xs, &xs, &xs, &cs, NULL))) {
        for (i = 0; i < MB * MS * DM; ++i) got[i] = y_cross[i], ref[i] = y_full[i];
        CHECK_CLOSE(got, ref, MB * MS * DM, 1e-5, "forward_cross(x, x, x) vs. forward(x)");
      }
      CHECK_ERROR(simdattn_mha_forward_cross(layer, &xs, NULL, &xs, &cs, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "key");
      CHECK_ERROR(simdattn_mha_forward_cross(layer, &xs, &xs, NULL, &cs, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT,
                  "value");
    }
    /* errors: NULL layer, NULL query, NULL out, a wrong width; out untouched */
    for (i = 0; i < MB * MS * DM; ++i) step_out[i] = (float)SENTINEL;
    ys.data = step_out;
    CHECK_ERROR(simdattn_mha_forward(NULL, &xs, &ys, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "layer");
    CHECK_ERROR(simdattn_mha_forward(layer, NULL, &ys, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "query");
    CHECK_ERROR(simdattn_mha_forward(layer, &xs, NULL, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "out");
    xs.width = DM + 1;
    prime_error();
    CHECK_STATUS(simdattn_mha_forward(layer, &xs, &ys, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT);
    CHECK(simdattn_last_error()[0] != '\0');
    xs.width = DM;
    opt.struct_size = sizeof opt - 8;
    CHECK_ERROR(simdattn_mha_forward(layer, &xs, &ys, &opt), SIMDATTN_ERROR_VERSION, "options");
    opt.struct_size = sizeof opt;
    {
      int untouched = 1;
      for (i = 0; i < MB * MS * DM; ++i) untouched &= step_out[i] == (float)SENTINEL;
      CHECK(untouched);
    }
  }

  set_context("KV cache, one token at a time");
  if (CHECK_OK(simdattn_kv_cache_create(layer, MB, MS + 2, &cache)) && cache != NULL) {
    CHECK(cache_length(cache, 0) == 0 && cache_length(cache, 1) == 0);
    for (t = 0; t < MS; ++t) {
      if (!CHECK_OK(cached_step(layer, cache, x, t, 1, step_out, NULL))) break;
      for (b = 0; b < MB; ++b)
        for (i = 0; i < DM; ++i) got[b * DM + i] = step_out[b * DM + i], ref[b * DM + i] = y_causal[(b * MS + t) * DM + i];
      set_context("KV cache, one token at a time, step %d", t);
      CHECK_CLOSE(got, ref, MB * DM, 1e-5, "cached step vs. the causal forward");
      CHECK(cache_length(cache, 0) == t + 1 && cache_length(cache, 1) == t + 1);
    }
    set_context("KV cache: truncate, reset, length errors");
    CHECK(cache_length(cache, 0) == MS && cache_length(cache, 1) == MS);
    CHECK_OK(simdattn_kv_cache_truncate(cache, 0, 3));
    CHECK(cache_length(cache, 0) == 3 && cache_length(cache, 1) == MS);
    /* token 3 of sequence 0 again (sequence 1 gets its token 0 at position MS): as before */
    {
      float two[MB * DM];
      float y1[MB * DM];
      simdattn_seq qs = simdattn_seq_make(two, SIMDATTN_F32, MB, 1, DM), os = simdattn_seq_make(y1, SIMDATTN_F32, MB, 1, DM);
      memcpy(two, x + 3 * DM, DM * sizeof(float));
      memcpy(two + DM, x + MS * DM, DM * sizeof(float));
      if (CHECK_OK(simdattn_mha_forward_cached(layer, &qs, cache, &os, NULL))) {
        for (i = 0; i < DM; ++i) got[i] = y1[i], ref[i] = y_causal[3 * DM + i];
        CHECK_CLOSE(got, ref, DM, 1e-5, "the token after a truncation");
      }
      CHECK(cache_length(cache, 0) == 4 && cache_length(cache, 1) == MS + 1);
    }
    CHECK_ERROR(simdattn_kv_cache_truncate(cache, 0, 5), SIMDATTN_ERROR_INVALID_ARGUMENT, "length");
    CHECK_ERROR(simdattn_kv_cache_truncate(cache, 2, 0), SIMDATTN_ERROR_INVALID_ARGUMENT, "sequence");
    CHECK(cache_length(cache, 0) == 4);
    {
      int64_t n = -7;
      CHECK_ERROR(simdattn_kv_cache_length(cache, MB, &n), SIMDATTN_ERROR_INVALID_ARGUMENT, "sequence");
      CHECK_ERROR(simdattn_kv_cache_length(cache, -1, &n), SIMDATTN_ERROR_INVALID_ARGUMENT, "sequence");
      CHECK(n == -7);
      CHECK_ERROR(simdattn_kv_cache_length(cache, 0, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "length");
      CHECK_ERROR(simdattn_kv_cache_length(NULL, 0, &n), SIMDATTN_ERROR_INVALID_ARGUMENT, "cache");
    }
    CHECK_OK(simdattn_kv_cache_reset(cache));
    CHECK(cache_length(cache, 0) == 0 && cache_length(cache, 1) == 0);
    /* after the reset, a prefill of 3 tokens then 3 more: the causal forward again */
    set_context("KV cache: chunks of 3 tokens after a reset");
    {
      float y3[MB * 3 * DM];
      int c;
      for (c = 0; c < 2; ++c)
        if (CHECK_OK(cached_step(layer, cache, x, 3 * c, 3, y3, NULL))) {
          for (b = 0; b < MB; ++b)
            for (t = 0; t < 3; ++t)
              for (i = 0; i < DM; ++i)
                got[(b * 3 + t) * DM + i] = y3[(b * 3 + t) * DM + i],
                ref[(b * 3 + t) * DM + i] = y_causal[(b * MS + 3 * c + t) * DM + i];
          CHECK_CLOSE(got, ref, MB * 3 * DM, 1e-5, "cached chunk vs. the causal forward");
        }
      CHECK(cache_length(cache, 0) == MS && cache_length(cache, 1) == MS);
    }
    /* top-left is refused by the cached forward; the cache is unchanged */
    opt.causal = SIMDATTN_CAUSAL_TOP_LEFT;
    CHECK_ERROR(cached_step(layer, cache, x, 0, 1, step_out, &opt), SIMDATTN_ERROR_INVALID_ARGUMENT,
                "options.causal");
    CHECK(cache_length(cache, 0) == MS && cache_length(cache, 1) == MS);
    simdattn_kv_cache_free(cache);
    cache = NULL;
  }

  set_context("KV cache: capacity too small");
  if (CHECK_OK(simdattn_kv_cache_create(layer, MB, 4, &cache)) && cache != NULL) {
    float out3[MB * 3 * DM];
    int untouched = 1;
    CHECK_OK(cached_step(layer, cache, x, 0, 2, step_out, NULL));
    CHECK(cache_length(cache, 0) == 2 && cache_length(cache, 1) == 2);
    /* 3 more: neither sequence fits */
    for (i = 0; i < MB * 3 * DM; ++i) out3[i] = (float)SENTINEL;
    CHECK_ERROR(cached_step(layer, cache, x, 2, 3, out3, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "cache");
    CHECK(cache_length(cache, 0) == 2 && cache_length(cache, 1) == 2);
    /* sequence 0 emptied: 3 more fit it but not sequence 1; nothing changes */
    CHECK_OK(simdattn_kv_cache_truncate(cache, 0, 0));
    CHECK_ERROR(cached_step(layer, cache, x, 2, 3, out3, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "cache");
    CHECK(cache_length(cache, 0) == 0 && cache_length(cache, 1) == 2);
    for (i = 0; i < MB * 3 * DM; ++i) untouched &= out3[i] == (float)SENTINEL;
    CHECK(untouched);
    /* 2 more fit both */
    CHECK_OK(cached_step(layer, cache, x, 0, 2, step_out, NULL));
    CHECK(cache_length(cache, 0) == 2 && cache_length(cache, 1) == 4);
    simdattn_kv_cache_free(cache);
    cache = NULL;
  }
  /* a cache of the layer's dtype given explicitly; create errors */
  if (CHECK_OK(simdattn_kv_cache_create_with_dtype(layer, MB, 4, SIMDATTN_F64, &cache))) simdattn_kv_cache_free(cache);
  cache = (simdattn_kv_cache*)(void*)&info; /* a non-NULL junk value: a failed create writes NULL */
  CHECK_ERROR(simdattn_kv_cache_create(layer, MB, 0, &cache), SIMDATTN_ERROR_INVALID_ARGUMENT, "capacity");
  CHECK(cache == NULL);
  cache = (simdattn_kv_cache*)(void*)&info;
  CHECK_ERROR(simdattn_kv_cache_create(NULL, MB, 4, &cache), SIMDATTN_ERROR_INVALID_ARGUMENT, "layer");
  CHECK(cache == NULL);
  CHECK_ERROR(simdattn_kv_cache_create(layer, MB, 4, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "cache");
  cache = (simdattn_kv_cache*)(void*)&info;
  CHECK_ERROR(simdattn_kv_cache_create_with_dtype(layer, MB, 4, (simdattn_dtype)99, &cache),
              SIMDATTN_ERROR_INVALID_ARGUMENT, "dtype");
  CHECK(cache == NULL);
  CHECK_ERROR(simdattn_kv_cache_reset(NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "cache");
  CHECK_ERROR(simdattn_kv_cache_truncate(NULL, 0, 0), SIMDATTN_ERROR_INVALID_ARGUMENT, "cache");

  set_context("simdattn_mha_create errors");
  {
    simdattn_mha* bad = (simdattn_mha*)(void*)&info;
    const void* wq = w.wq;
    w.wq = NULL;
    CHECK_ERROR(simdattn_mha_create(&cfg, &w, &bad), SIMDATTN_ERROR_INVALID_ARGUMENT, "weights.wq");
    CHECK(bad == NULL);
    w.wq = wq;
    CHECK_ERROR(simdattn_mha_create(&cfg, &w, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "layer");
    bad = (simdattn_mha*)(void*)&info;
    CHECK_ERROR(simdattn_mha_create(NULL, &w, &bad), SIMDATTN_ERROR_INVALID_ARGUMENT, "config");
    CHECK(bad == NULL);
    CHECK_ERROR(simdattn_mha_create(&cfg, NULL, &bad), SIMDATTN_ERROR_INVALID_ARGUMENT, "weights");
    w.dtype = (simdattn_dtype)99;
    CHECK_ERROR(simdattn_mha_create(&cfg, &w, &bad), SIMDATTN_ERROR_INVALID_ARGUMENT, "weights.dtype");
    w.dtype = SIMDATTN_F32;
    w.struct_size = sizeof w - 8;
    CHECK_ERROR(simdattn_mha_create(&cfg, &w, &bad), SIMDATTN_ERROR_VERSION, "weights");
    w.struct_size = sizeof w;
    cfg.rope.struct_size = 0;
    cfg.has_rope = 1;
    CHECK_ERROR(simdattn_mha_create(&cfg, &w, &bad), SIMDATTN_ERROR_VERSION, "config.rope");
    cfg.has_rope = 0;
    cfg.rope.struct_size = sizeof cfg.rope;
    /* an invalid value the layer's constructor refuses (not one that changes the weights' sizes:
     * the call would read arrays of those sizes) */
    cfg.qk_norm_eps = -1.0;
    bad = (simdattn_mha*)(void*)&info;
    CHECK_ERROR(simdattn_mha_create(&cfg, &w, &bad), SIMDATTN_ERROR_INVALID_ARGUMENT, "config.qk_norm_eps");
    CHECK(bad == NULL);
    cfg.qk_norm_eps = 1e-6;
  }

  simdattn_mha_free(layer);
  simdattn_mha_free(NULL);      /* no-ops */
  simdattn_kv_cache_free(NULL);
  CHECK(1);
  set_context("");
}
