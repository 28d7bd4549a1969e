/* The C API's attention from C11: simdattn_attention with each option, in each float dtype, on the
 * native and reference backends, against a double-precision reference written here (out, lse, the
 * softmax weights, padding left unwritten); the output shape and ALiBi slopes; linear attention. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "c_api_cases.h"
#include "c_api_check.h"

typedef struct attn_case {
  const char* name;
  int null_options; /* pass options = NULL */
  simdattn_causal causal;
  const int64_t* key_lengths; /* B values or NULL */
  int has_window;
  int64_t window_left, window_right;
  int bool_mask; /* the u8 mask [B, 1, Sq, Sk] */
  int add_mask;  /* the f32 additive mask [1, H, Sq, Sk] */
  int has_scale;
  double scale;
  int has_softcap;
  double softcap;
  int alibi; /* standard slopes */
  int sinks;
  const int64_t* query_offsets; /* B values or NULL */
  int strided; /* q, k in [B, S, H, D] memory; v, out with padded rows */
  int lse;
  int scores; /* the softmax weights [B, H, Sq, Sk], f32 */
} attn_case;

static uint8_t g_bool_mask[B_ * 1 * SQ_ * SK_];
static float g_add_mask[1 * H_ * SQ_ * SK_];
static float g_alibi[H_];
static const float g_sinks[H_] = {0.5f, -1.0f, 2.0f, 0.0f};

/* out [B, H, Sq, Dv], lse [B, H, Sq] and the weights [B, H, Sq, Sk] (the sink's share left out,
 * zeros at hidden keys) of attention(q, k, v) with the case's options, in double. */
static void reference_attention(const attn_case* c, const double* q, const double* k, const double* v, double* out,
                                double* lse, double* weights) {
  int b, h, i, j, d;
  const double scale = c->has_scale ? c->scale : 1.0 / sqrt((double)D_);
  for (b = 0; b < B_; ++b)
    for (h = 0; h < H_; ++h)
      for (i = 0; i < SQ_; ++i) {
        const int hk = h / (H_ / HKV_);
        const int64_t L = c->key_lengths != NULL ? c->key_lengths[b] : SK_;
        const int64_t p = i + (c->query_offsets != NULL                 ? c->query_offsets[b]
                               : c->causal == SIMDATTN_CAUSAL_TOP_LEFT ? 0
                                                                       : L - SQ_);
        double* wi = weights + (((size_t)b * H_ + h) * SQ_ + i) * SK_;
        const double* qi = q + (((size_t)b * H_ + h) * SQ_ + i) * D_;
        double s[SK_], m = -INFINITY, den = 0.0;
        int any = 0;
        double* o = out + (((size_t)b * H_ + h) * SQ_ + i) * DV_;
        for (j = 0; j < SK_; ++j) {
          int visible = j < L;
          if (c->causal != SIMDATTN_CAUSAL_NONE && j > p) visible = 0;
          if (c->has_window) {
            if (c->window_left >= 0 && j < p - c->window_left) visible = 0;
            if (c->window_right >= 0 && j > p + c->window_right) visible = 0;
          }
          if (c->bool_mask && g_bool_mask[(b * SQ_ + i) * SK_ + j] == 0) visible = 0;
          s[j] = -INFINITY;
          if (!visible) continue;
          {
            const double* kj = k + (((size_t)b * HKV_ + hk) * SK_ + j) * D_;
            double x = 0.0;
            for (d = 0; d < D_; ++d) x += qi[d] * kj[d];
            x *= scale;
            if (c->has_softcap) x = c->softcap * tanh(x / c->softcap);
            if (c->alibi) x += (double)g_alibi[h] * (double)(j - p);
            if (c->add_mask) x += (double)g_add_mask[(h * SQ_ + i) * SK_ + j];
            s[j] = x;
            if (x > m) m = x;
            if (x != -INFINITY) any = 1;
          }
        }
        for (d = 0; d < DV_; ++d) o[d] = 0.0;
        for (j = 0; j < SK_; ++j) wi[j] = 0.0;
        if (!any) { /* no visible key: zeros (lse: the sink alone, or -inf) */
          lse[((size_t)b * H_ + h) * SQ_ + i] = c->sinks ? (double)g_sinks[h] : -INFINITY;
          continue;
        }
        if (c->sinks && (double)g_sinks[h] > m) m = g_sinks[h];
        for (j = 0; j < SK_; ++j)
          if (s[j] != -INFINITY) {
            const double w = exp(s[j] - m);
            const double* vj = v + (((size_t)b * HKV_ + hk) * SK_ + j) * DV_;
            wi[j] = w;
            den += w;
            for (d = 0; d < DV_; ++d) o[d] += w * vj[d];
          }
        if (c->sinks) den += exp((double)g_sinks[h] - m);
        for (d = 0; d < DV_; ++d) o[d] /= den;
        for (j = 0; j < SK_; ++j) wi[j] /= den;
        lse[((size_t)b * H_ + h) * SQ_ + i] = m + log(den);
      }
}

double g_q[NQ], g_k[NK], g_v[NV];

/* Runs one case in one dtype on one backend and compares it with the reference. */
static void run_attention_case(const attn_case* c, simdattn_dtype dt, simdattn_backend backend, double tol,
                               double lse_tol) {
  static const int64_t qs[4] = {B_, H_, SQ_, D_}, ks[4] = {B_, HKV_, SK_, D_}, vs[4] = {B_, HKV_, SK_, DV_},
                       os[4] = {B_, H_, SQ_, DV_}, ls[4] = {B_, H_, SQ_, 1}, bms[4] = {B_, 1, SQ_, SK_},
                       ams[4] = {1, H_, SQ_, SK_}, ss[4] = {B_, H_, SQ_, SK_};
  const enum layout lqk = c->strided ? LAYOUT_SEQ_MAJOR : LAYOUT_CONTIGUOUS;
  const enum layout lvo = c->strided ? LAYOUT_PADDED : LAYOUT_CONTIGUOUS;
  simdattn_tensor q = new_tensor(dt, qs, lqk, g_q, 0.0), k = new_tensor(dt, ks, lqk, g_k, 0.0),
                  v = new_tensor(dt, vs, lvo, g_v, 0.0), out = new_tensor(dt, os, lvo, NULL, SENTINEL);
  simdattn_tensor lse = new_tensor(SIMDATTN_F32, ls, LAYOUT_CONTIGUOUS, NULL, SENTINEL);
  simdattn_tensor scores = new_tensor(SIMDATTN_F32, ss, LAYOUT_CONTIGUOUS, NULL, SENTINEL);
  simdattn_tensor bmask, amask;
  simdattn_attention_options o;
  static double rq[NQ], rk[NK], rv[NV], ro[NO], rl[NL], go[NO], gl[NL], rw[NW], gw[NW];
  simdattn_status st;
  int i, pads_ok = 1;

  set_context("attention, case \"%s\", %s, %s backend", c->name, dtype_name(dt),
              backend == SIMDATTN_BACKEND_NATIVE ? "native" : backend == SIMDATTN_BACKEND_REFERENCE ? "reference" : "onednn");
  /* the reference reads the inputs as stored (rounded to the dtype) */
  read_tensor(&q, rq);
  read_tensor(&k, rk);
  read_tensor(&v, rv);
  reference_attention(c, rq, rk, rv, ro, rl, rw);

  {
    double bm[B_ * SQ_ * SK_], am[H_ * SQ_ * SK_];
    for (i = 0; i < B_ * SQ_ * SK_; ++i) bm[i] = g_bool_mask[i];
    for (i = 0; i < H_ * SQ_ * SK_; ++i) am[i] = g_add_mask[i];
    bmask = new_tensor(SIMDATTN_U8, bms, LAYOUT_CONTIGUOUS, bm, 0.0);
    amask = new_tensor(SIMDATTN_F32, ams, LAYOUT_CONTIGUOUS, am, 0.0);
  }

  simdattn_attention_options_init(&o);
  o.backend = backend;
  o.causal = c->causal;
  if (c->key_lengths != NULL) o.key_lengths = c->key_lengths, o.key_lengths_count = B_;
  if (c->has_window) o.has_window = 1, o.window_left = c->window_left, o.window_right = c->window_right;
  if (c->bool_mask) o.mask = bmask;
  if (c->add_mask) o.mask = amask;
  if (c->has_scale) o.has_scale = 1, o.scale = c->scale;
  if (c->has_softcap) o.has_softcap = 1, o.softcap = c->softcap;
  if (c->alibi) o.alibi_slopes = g_alibi, o.alibi_slopes_count = H_;
  if (c->sinks) o.sinks = g_sinks, o.sinks_count = H_;
  if (c->lse) o.lse = lse;
  if (c->scores) o.scores = scores;
  if (c->query_offsets != NULL) o.query_offsets = c->query_offsets, o.query_offsets_count = B_;

  st = simdattn_attention(&q, &k, &v, &out, c->null_options && backend == SIMDATTN_BACKEND_NATIVE ? NULL : &o);
  if (CHECK_STATUS(st, SIMDATTN_OK)) {
    read_tensor(&out, go);
    CHECK_CLOSE(go, ro, NO, tol, "out");
    if (c->lse) {
      read_tensor(&lse, gl);
      CHECK_CLOSE(gl, rl, NL, lse_tol, "lse");
    } else {
      CHECK(all_fill(&lse, SENTINEL, 0));
    }
    if (c->scores) { /* computed in double and rounded once to f32, whatever the inputs' dtype */
      read_tensor(&scores, gw);
      CHECK_CLOSE(gw, rw, NW, 1e-6, "scores (softmax)");
    }
    if (lvo == LAYOUT_PADDED) { /* the gaps between out's rows are not written */
      const int64_t r = DV_ + ROW_PAD, e = extent_of(&out) + ROW_PAD;
      int64_t x;
      for (x = 0; x < e; ++x)
        if (x % r >= DV_ && load_elem(out.data, dt, x) != SENTINEL) pads_ok = 0;
      CHECK(pads_ok);
    }
  }
  free(q.data), free(k.data), free(v.data), free(out.data), free(lse.data), free(scores.data), free(bmask.data), free(amask.data);
}

void test_attention(void) {
  static const int64_t lengths_full[B_] = {7, 4}, lengths_short[B_] = {5, 3}, offsets[B_] = {3, -1};
  static const attn_case cases[] = {
      {.name = "no options", .null_options = 1},
      {.name = "defaults with lse", .lse = 1},
      {.name = "causal top-left", .causal = SIMDATTN_CAUSAL_TOP_LEFT, .lse = 1},
      {.name = "causal bottom-right", .causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT, .lse = 1, .scores = 1},
      {.name = "query offsets, causal", .query_offsets = offsets, .causal = SIMDATTN_CAUSAL_TOP_LEFT, .lse = 1},
      {.name = "key lengths", .key_lengths = lengths_full, .lse = 1},
      {.name = "key lengths, bottom-right (empty rows)", .key_lengths = lengths_short,
       .causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT, .lse = 1},
      {.name = "window 2/1", .has_window = 1, .window_left = 2, .window_right = 1, .lse = 1},
      {.name = "window 3/unbounded, top-left", .has_window = 1, .window_left = 3, .window_right = -1,
       .causal = SIMDATTN_CAUSAL_TOP_LEFT, .lse = 1},
      {.name = "boolean u8 mask [B,1,Sq,Sk]", .bool_mask = 1, .lse = 1},
      {.name = "additive f32 mask [1,H,Sq,Sk]", .add_mask = 1, .lse = 1},
      {.name = "scale 0.3", .has_scale = 1, .scale = 0.3, .lse = 1},
      {.name = "softcap 0.5, scale 2", .has_softcap = 1, .softcap = 0.5, .has_scale = 1, .scale = 2.0, .lse = 1},
      {.name = "alibi", .alibi = 1, .lse = 1},
      {.name = "alibi, top-left", .alibi = 1, .causal = SIMDATTN_CAUSAL_TOP_LEFT, .lse = 1},
      {.name = "sinks", .sinks = 1, .lse = 1},
      {.name = "strided, no options", .strided = 1, .null_options = 1},
      {.name = "strided, bottom-right", .strided = 1, .causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT, .lse = 1},
      {.name = "everything", .strided = 1, .causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT, .key_lengths = lengths_full,
       .has_window = 1, .window_left = 3, .window_right = 0, .add_mask = 1, .has_scale = 1, .scale = 0.5,
       .has_softcap = 1, .softcap = 1.5, .alibi = 1, .sinks = 1, .lse = 1, .scores = 1},
  };
  static const simdattn_dtype dtypes[] = {SIMDATTN_F32, SIMDATTN_F64, SIMDATTN_BF16, SIMDATTN_F16};
  size_t c, t;
  int i;
  for (i = 0; i < NQ; ++i) g_q[i] = srand1();
  for (i = 0; i < NK; ++i) g_k[i] = srand1();
  for (i = 0; i < NV; ++i) g_v[i] = srand1();
  for (i = 0; i < B_ * SQ_ * SK_; ++i) g_bool_mask[i] = urand() < 0.3 ? 0 : (uint8_t)(1 + (i % 3));
  for (i = 0; i < H_ * SQ_ * SK_; ++i) g_add_mask[i] = urand() < 0.15 ? -INFINITY : (float)(2.0 * srand1());
  for (i = 0; i < SK_; ++i) g_add_mask[(1 * SQ_ + 2) * SK_ + i] = -INFINITY; /* a row with every key hidden */
  for (i = 0; i < H_; ++i) g_alibi[i] = (float)pow(2.0, -8.0 * (i + 1) / H_);
  for (t = 0; t < sizeof dtypes / sizeof dtypes[0]; ++t)
    for (c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
      const simdattn_dtype dt = dtypes[t];
      const double tol = dt == SIMDATTN_F32 ? 1e-5 : dt == SIMDATTN_F64 ? 1e-12 : dt == SIMDATTN_F16 ? 4e-3 : 2e-2;
      const double lse_tol = dt == SIMDATTN_F32 || dt == SIMDATTN_F64 ? 1e-5 : 1e-2;
      run_attention_case(&cases[c], dt, SIMDATTN_BACKEND_NATIVE, tol, lse_tol);
      if (dt == SIMDATTN_F32 || dt == SIMDATTN_F64)
        run_attention_case(&cases[c], dt, SIMDATTN_BACKEND_REFERENCE, tol, lse_tol);
    }
  set_context("");
}

/* ---- output shape and ALiBi slopes ---------------------------------------------------------- */

void test_output_shape_and_slopes(void) {
  float qd[NQ], kd[NK], vd[NV];
  simdattn_tensor q = simdattn_tensor_contiguous(qd, SIMDATTN_F32, B_, H_, SQ_, D_);
  simdattn_tensor k = simdattn_tensor_contiguous(kd, SIMDATTN_F32, B_, HKV_, SK_, D_);
  simdattn_tensor v = simdattn_tensor_contiguous(vd, SIMDATTN_F32, B_, HKV_, SK_, DV_);
  int64_t shape[4] = {-1, -1, -1, -1};
  float slopes[16];
  int i;
  set_context("simdattn_tensor_contiguous / simdattn_attention_output_shape");
  CHECK(q.struct_size == sizeof(simdattn_tensor));
  CHECK(q.data == qd && q.dtype == SIMDATTN_F32);
  CHECK(q.shape[0] == B_ && q.shape[1] == H_ && q.shape[2] == SQ_ && q.shape[3] == D_);
  CHECK(q.strides[0] == H_ * SQ_ * D_ && q.strides[1] == SQ_ * D_ && q.strides[2] == D_ && q.strides[3] == 1);
  if (CHECK_OK(simdattn_attention_output_shape(&q, &k, &v, shape)))
    CHECK(shape[0] == B_ && shape[1] == H_ && shape[2] == SQ_ && shape[3] == DV_);
  /* a bad shape: the error, and shape untouched */
  shape[0] = shape[1] = shape[2] = shape[3] = -1;
  k.shape[3] = D_ + 1;
  CHECK_ERROR(simdattn_attention_output_shape(&q, &k, &v, shape), SIMDATTN_ERROR_INVALID_ARGUMENT, "k");
  CHECK(shape[0] == -1 && shape[1] == -1 && shape[2] == -1 && shape[3] == -1);
  k.shape[3] = D_;
  CHECK_ERROR(simdattn_attention_output_shape(&q, &k, &v, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "shape");
  CHECK_ERROR(simdattn_attention_output_shape(NULL, &k, &v, shape), SIMDATTN_ERROR_INVALID_ARGUMENT, "q");

  set_context("simdattn_standard_alibi_slopes");
  {
    static const int64_t counts[] = {1, 2, 4, 8, 16};
    size_t c;
    for (c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
      const int64_t n = counts[c];
      double got[16], want[16];
      for (i = 0; i < 16; ++i) slopes[i] = -1.0f;
      if (!CHECK_OK(simdattn_standard_alibi_slopes(n, slopes))) continue;
      for (i = 0; i < n; ++i) got[i] = slopes[i], want[i] = pow(2.0, -8.0 * (i + 1) / (double)n);
      CHECK_CLOSE(got, want, (size_t)n, 1e-6, "slopes (power-of-two heads)");
      for (i = (int)n; i < 16; ++i) CHECK(slopes[i] == -1.0f); /* nothing written past `heads` */
    }
    /* 6 heads: 2^(-8k/4) for k = 1..4, then 2^(-4k/4) for k = 1, 3 */
    if (CHECK_OK(simdattn_standard_alibi_slopes(6, slopes))) {
      double got[6], want[6] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
      for (i = 0; i < 6; ++i) got[i] = slopes[i];
      CHECK_CLOSE(got, want, 6, 1e-6, "slopes (6 heads)");
    }
  }
  slopes[0] = 42.0f;
  CHECK_ERROR(simdattn_standard_alibi_slopes(0, slopes), SIMDATTN_ERROR_INVALID_ARGUMENT, "heads");
  CHECK(slopes[0] == 42.0f);
  CHECK_ERROR(simdattn_standard_alibi_slopes(-3, slopes), SIMDATTN_ERROR_INVALID_ARGUMENT, "heads");
  CHECK_ERROR(simdattn_standard_alibi_slopes(4, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "slopes");
  set_context("");
}

/* ---- linear attention ----------------------------------------------------------------------- */

static double elu1(double x) { return x > 0.0 ? x + 1.0 : exp(x); }

/* out [B, H, Sq, Dv] of linear attention with elu1; causal needs Sq == Sk. */
static void reference_linear(const double* q, const double* k, const double* v, int64_t sq, int64_t sk, int causal,
                             double eps, double* out) {
  int64_t b, h, i, j, d;
  for (b = 0; b < B_; ++b)
    for (h = 0; h < H_; ++h)
      for (i = 0; i < sq; ++i) {
        const int64_t hk = h / (H_ / HKV_);
        const double* qi = q + ((b * H_ + h) * sq + i) * D_;
        double num[DV_] = {0}, den = 0.0;
        for (j = 0; j < sk; ++j) {
          const double* kj = k + ((b * HKV_ + hk) * sk + j) * D_;
          const double* vj = v + ((b * HKV_ + hk) * sk + j) * DV_;
          double w = 0.0;
          if (causal && j > i) continue;
          for (d = 0; d < D_; ++d) w += elu1(qi[d]) * elu1(kj[d]);
          den += w;
          for (d = 0; d < DV_; ++d) num[d] += w * vj[d];
        }
        for (d = 0; d < DV_; ++d) out[((b * H_ + h) * sq + i) * DV_ + d] = num[d] / (den + eps);
      }
}

void test_linear_attention(void) {
  static const simdattn_dtype dtypes[] = {SIMDATTN_F32, SIMDATTN_F64};
  static double rq[B_ * H_ * SK_ * D_], rk[NK], rv[NV], ro[B_ * H_ * SK_ * DV_], go[B_ * H_ * SK_ * DV_];
  size_t t;
  for (t = 0; t < 2; ++t) {
    const simdattn_dtype dt = dtypes[t];
    const double tol = dt == SIMDATTN_F32 ? 1e-5 : 1e-12;
    int causal;
    for (causal = 0; causal < 2; ++causal) {
      /* non-causal: Sq = 5, Sk = 7; causal: Sq = Sk = 7 (q from the first rows of g_k's values) */
      const int64_t sq = causal ? SK_ : SQ_;
      const int64_t qs[4] = {B_, H_, sq, D_}, ks[4] = {B_, HKV_, SK_, D_}, vs[4] = {B_, HKV_, SK_, DV_},
                    os[4] = {B_, H_, sq, DV_};
      double qv[B_ * H_ * SK_ * D_];
      simdattn_tensor q, k, v, out;
      simdattn_linear_options o;
      simdattn_status st;
      int64_t i;
      for (i = 0; i < B_ * H_ * sq * D_; ++i) qv[i] = 1.5 * srand1();
      q = new_tensor(dt, qs, LAYOUT_CONTIGUOUS, qv, 0.0);
      k = new_tensor(dt, ks, causal ? LAYOUT_SEQ_MAJOR : LAYOUT_CONTIGUOUS, g_k, 0.0);
      v = new_tensor(dt, vs, LAYOUT_CONTIGUOUS, g_v, 0.0);
      out = new_tensor(dt, os, LAYOUT_CONTIGUOUS, NULL, SENTINEL);
      set_context("linear attention, %s, %s", dtype_name(dt), causal ? "causal, chunk 3" : "non-causal elu1, options NULL");
      read_tensor(&q, rq);
      read_tensor(&k, rk);
      read_tensor(&v, rv);
      reference_linear(rq, rk, rv, sq, SK_, causal, 1e-6, ro);
      simdattn_linear_options_init(&o);
      CHECK(o.struct_size == sizeof o && o.feature_map == SIMDATTN_FEATURE_ELU1 && o.eps == 1e-6 && o.chunk == 64 &&
            o.causal == 0 && o.backend == SIMDATTN_BACKEND_NATIVE);
      o.causal = causal;
      o.chunk = 3;
      st = simdattn_linear_attention(&q, &k, &v, &out, causal ? &o : NULL);
      if (CHECK_STATUS(st, SIMDATTN_OK)) {
        read_tensor(&out, go);
        CHECK_CLOSE(go, ro, (size_t)(B_ * H_ * sq * DV_), tol, "out");
      }
      if (!causal) { /* errors: causal with Sq != Sk, a bad feature map */
        simdattn_tensor out2 = new_tensor(dt, os, LAYOUT_CONTIGUOUS, NULL, SENTINEL);
        o.causal = 0;
        o.feature_map = (simdattn_feature_map)7;
        CHECK_ERROR(simdattn_linear_attention(&q, &k, &v, &out2, &o), SIMDATTN_ERROR_INVALID_ARGUMENT,
                    "options.feature_map");
        o.feature_map = SIMDATTN_FEATURE_ELU1;
        o.struct_size = sizeof o - 1;
        CHECK_ERROR(simdattn_linear_attention(&q, &k, &v, &out2, &o), SIMDATTN_ERROR_VERSION, "options");
        CHECK(all_fill(&out2, SENTINEL, 0));
        free(out2.data);
      }
      free(q.data), free(k.data), free(v.data), free(out.data);
    }
  }
  set_context("");
}
