/* The C API (simdattn/simdattn.h) from C11, against the installed library.
 *
 * Every result is compared with a plain double-precision reference written here (attention with
 * each option, linear attention, the multi-head attention layer); every error path is checked for
 * its status, the argument it names, a message, and outputs left untouched. Exits 0 only if every
 * check passes; each failed check is printed with its file:line and the library's last error.
 *
 * Build: cc -std=c11 -Wall -Wextra -pedantic -Werror test_c_api.c $(pkg-config --cflags --libs
 * simdattn) -lm [-DSIMDATTN_EXPECTED_VERSION=0.1.0]
 */
#include <simdattn/simdattn.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__STDC_NO_THREADS__)
#include <threads.h>
#endif

#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)

/* ---- checks --------------------------------------------------------------------------------- */

static int g_checks = 0, g_failures = 0;
static char g_context[256] = ""; /* what is being tested, printed with each failure */

static void set_context(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_context, sizeof g_context, fmt, ap);
  va_end(ap);
}

static void fail_at(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  ++g_failures;
  fprintf(stderr, "%s:%d: FAILED", file, line);
  if (g_context[0] != '\0') fprintf(stderr, " [%s]", g_context);
  fprintf(stderr, ": ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n    simdattn_last_error() = \"%s\", simdattn_last_error_argument() = \"%s\"\n",
          simdattn_last_error(), simdattn_last_error_argument());
}

#define CHECK(cond)                                                 \
  do {                                                              \
    ++g_checks;                                                     \
    if (!(cond)) fail_at(__FILE__, __LINE__, "CHECK(%s)", #cond);   \
  } while (0)

static int check_status(simdattn_status got, simdattn_status expected, const char* expr, const char* file,
                        int line) {
  ++g_checks;
  if (got != expected) {
    fail_at(file, line, "%s returned %d (%s), expected %d (%s)", expr, (int)got, simdattn_status_string(got),
            (int)expected, simdattn_status_string(expected));
    return 0;
  }
  return 1;
}

static int check_streq(const char* got, const char* expected, const char* expr, const char* file, int line) {
  ++g_checks;
  if (got == NULL || strcmp(got, expected) != 0) {
    fail_at(file, line, "%s is \"%s\", expected \"%s\"", expr, got == NULL ? "(NULL)" : got, expected);
    return 0;
  }
  return 1;
}

/* Sets this thread's last error to a known one ("slopes") before a call expected to fail, so that
 * the argument checked afterwards is that call's and not a leftover. */
static void prime_error(void) { (void)simdattn_standard_alibi_slopes(4, NULL); }

static void check_error(simdattn_status got, simdattn_status expected_status, const char* expected_argument,
                        const char* expr, const char* file, int line) {
  const char* message = simdattn_last_error();
  check_status(got, expected_status, expr, file, line);
  check_streq(simdattn_last_error_argument(), expected_argument, "simdattn_last_error_argument()", file, line);
  ++g_checks;
  if (message == NULL || message[0] == '\0') fail_at(file, line, "%s: simdattn_last_error() is empty", expr);
}

#define CHECK_STATUS(call, expected) check_status((call), (expected), #call, __FILE__, __LINE__)
#define CHECK_OK(call) check_status((call), SIMDATTN_OK, #call, __FILE__, __LINE__)
#define CHECK_STREQ(got, expected) check_streq((got), (expected), #got, __FILE__, __LINE__)
/* The call fails with `status`, naming `argument`, with a message. */
#define CHECK_ERROR(call, status, argument) \
  do {                                      \
    simdattn_status st_;                    \
    prime_error();                          \
    st_ = (call);                           \
    check_error(st_, (status), (argument), #call, __FILE__, __LINE__); \
  } while (0)

/* got[i] within tol * (1 + |ref[i]|) of ref[i] for every i (infinities must match exactly). */
static int check_close_impl(const double* got, const double* ref, size_t n, double tol, const char* what,
                            const char* file, int line) {
  size_t bad = 0, first = 0, i;
  double worst = 0.0;
  ++g_checks;
  for (i = 0; i < n; ++i) {
    int ok;
    if (isinf(ref[i]) || isinf(got[i]))
      ok = got[i] == ref[i];
    else {
      const double d = fabs(got[i] - ref[i]);
      ok = d <= tol * (1.0 + fabs(ref[i]));
      if (d > worst) worst = d;
    }
    if (!ok) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad != 0) {
    fail_at(file, line, "%s: %zu of %zu values off by more than %g (relative); first at [%zu]: got %.17g, expected %.17g; largest difference %g",
            what, bad, n, tol, first, got[first], ref[first], worst);
    return 0;
  }
  return 1;
}
#define CHECK_CLOSE(got, ref, n, tol, what) check_close_impl((got), (ref), (n), (tol), (what), __FILE__, __LINE__)

/* ---- deterministic random numbers ----------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* [0, 1) */
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(g_rng >> 11) / 9007199254740992.0;
}
static double srand1(void) { return 2.0 * urand() - 1.0; } /* [-1, 1) */

/* ---- bfloat16 and float16 stored as uint16_t ------------------------------------------------ */

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even */
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_to_f32(uint16_t h) { return bits_float((uint32_t)h << 16); }

static uint16_t f32_to_f16(float f) { /* round to nearest even */
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t fexp = (u >> 23) & 0xffu;
  uint32_t mant = u & 0x7fffffu;
  const int32_t exp = (int32_t)fexp - 127 + 15;
  uint32_t h, rem, half;
  if (fexp == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant != 0 ? 0x200u : 0u));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) { /* subnormal half (or zero) */
    uint32_t shift;
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    shift = (uint32_t)(14 - exp);
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
  }
  h = ((uint32_t)exp << 10) | (mant >> 13);
  rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; /* a carry into the exponent is right */
  return (uint16_t)(sign | h);
}
static float f16_to_f32(uint16_t h) {
  const uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1fu, m = (uint32_t)h & 0x3ffu;
  if (e == 0) {
    const float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
    return sign != 0 ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

/* ---- tensors -------------------------------------------------------------------------------- */

static size_t dtype_size(simdattn_dtype t) {
  switch (t) {
    case SIMDATTN_F32: return 4;
    case SIMDATTN_F64: return 8;
    case SIMDATTN_U8: return 1;
    case SIMDATTN_I32: return 4;
    case SIMDATTN_I64: return 8;
    case SIMDATTN_BF16: return 2;
    case SIMDATTN_F16: return 2;
    case SIMDATTN_INT8:
    case SIMDATTN_FP8_E4M3:
    case SIMDATTN_FP8_E5M2: return 1;
  }
  return 0;
}

static const char* dtype_name(simdattn_dtype t) {
  switch (t) {
    case SIMDATTN_F32: return "f32";
    case SIMDATTN_F64: return "f64";
    case SIMDATTN_U8: return "u8";
    case SIMDATTN_I32: return "i32";
    case SIMDATTN_I64: return "i64";
    case SIMDATTN_BF16: return "bf16";
    case SIMDATTN_F16: return "f16";
    case SIMDATTN_INT8: return "int8";
    case SIMDATTN_FP8_E4M3: return "fp8_e4m3";
    case SIMDATTN_FP8_E5M2: return "fp8_e5m2";
  }
  return "?";
}

static void store_elem(void* p, simdattn_dtype t, int64_t i, double x) {
  switch (t) {
    case SIMDATTN_F32: ((float*)p)[i] = (float)x; break;
    case SIMDATTN_F64: ((double*)p)[i] = x; break;
    case SIMDATTN_U8: ((uint8_t*)p)[i] = (uint8_t)x; break;
    case SIMDATTN_I32: ((int32_t*)p)[i] = (int32_t)x; break;
    case SIMDATTN_I64: ((int64_t*)p)[i] = (int64_t)x; break;
    case SIMDATTN_BF16: ((uint16_t*)p)[i] = f32_to_bf16((float)x); break;
    case SIMDATTN_F16: ((uint16_t*)p)[i] = f32_to_f16((float)x); break;
    case SIMDATTN_INT8: ((int8_t*)p)[i] = (int8_t)x; break;
    case SIMDATTN_FP8_E4M3:
    case SIMDATTN_FP8_E5M2: ((uint8_t*)p)[i] = (uint8_t)x; break; /* the code's bits */
  }
}

static double load_elem(const void* p, simdattn_dtype t, int64_t i) {
  switch (t) {
    case SIMDATTN_F32: return ((const float*)p)[i];
    case SIMDATTN_F64: return ((const double*)p)[i];
    case SIMDATTN_U8: return ((const uint8_t*)p)[i];
    case SIMDATTN_I32: return ((const int32_t*)p)[i];
    case SIMDATTN_I64: return (double)((const int64_t*)p)[i];
    case SIMDATTN_BF16: return bf16_to_f32(((const uint16_t*)p)[i]);
    case SIMDATTN_F16: return f16_to_f32(((const uint16_t*)p)[i]);
    case SIMDATTN_INT8: return ((const int8_t*)p)[i];
    case SIMDATTN_FP8_E4M3:
    case SIMDATTN_FP8_E5M2: return ((const uint8_t*)p)[i]; /* the code's bits */
  }
  return 0.0;
}

/* Elements from the first to one past the last a view can touch. */
static int64_t extent_of(const simdattn_tensor* t) {
  int64_t e = 1;
  int i;
  for (i = 0; i < 4; ++i) e += (t->shape[i] - 1) * t->strides[i];
  return e;
}

enum layout {
  LAYOUT_CONTIGUOUS = 0, /* C order [d0, d1, d2, d3] */
  LAYOUT_SEQ_MAJOR = 1,  /* memory [d0, d2, d1, d3] (e.g. q [B, H, S, D] stored as [B, S, H, D]) */
  LAYOUT_PADDED = 2      /* C order with rows of d3 + 3 elements (3 unused at each row's end) */
};
#define ROW_PAD 3

/* A new tensor (free its data) of `shape` in `layout`: every element of its extent set to `fill`,
 * then the view's elements to `logical` (C order [d0, d1, d2, d3]) unless NULL. */
static simdattn_tensor new_tensor(simdattn_dtype dtype, const int64_t shape[4], enum layout layout,
                                  const double* logical, double fill) {
  simdattn_tensor t;
  const int64_t r = shape[3] + (layout == LAYOUT_PADDED ? ROW_PAD : 0);
  int64_t e, i, a, b, c, d;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = dtype;
  memcpy(t.shape, shape, sizeof t.shape);
  if (layout == LAYOUT_SEQ_MAJOR) {
    t.strides[0] = shape[1] * shape[2] * r, t.strides[1] = r, t.strides[2] = shape[1] * r, t.strides[3] = 1;
  } else {
    t.strides[0] = shape[1] * shape[2] * r, t.strides[1] = shape[2] * r, t.strides[2] = r, t.strides[3] = 1;
  }
  e = extent_of(&t) + (layout == LAYOUT_PADDED ? ROW_PAD : 0);
  t.data = malloc((size_t)e * dtype_size(dtype));
  if (t.data == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  for (i = 0; i < e; ++i) store_elem(t.data, dtype, i, fill);
  if (logical != NULL)
    for (a = 0, i = 0; a < shape[0]; ++a)
      for (b = 0; b < shape[1]; ++b)
        for (c = 0; c < shape[2]; ++c)
          for (d = 0; d < shape[3]; ++d, ++i)
            store_elem(t.data, dtype, a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d, logical[i]);
  return t;
}

/* The view's elements in C order. */
static void read_tensor(const simdattn_tensor* t, double* logical) {
  int64_t i = 0, a, b, c, d;
  for (a = 0; a < t->shape[0]; ++a)
    for (b = 0; b < t->shape[1]; ++b)
      for (c = 0; c < t->shape[2]; ++c)
        for (d = 0; d < t->shape[3]; ++d, ++i)
          logical[i] = load_elem(t->data, t->dtype,
                                 a * t->strides[0] + b * t->strides[1] + c * t->strides[2] + d * t->strides[3]);
}

/* Every element of the tensor's extent (view and gaps) equals `fill`. */
static int all_fill(const simdattn_tensor* t, double fill, int64_t extra) {
  int64_t i, e = extent_of(t) + extra;
  for (i = 0; i < e; ++i)
    if (load_elem(t->data, t->dtype, i) != fill) return 0;
  return 1;
}

/* ---- the attention reference ---------------------------------------------------------------- */

#define B_ 2
#define H_ 4
#define HKV_ 2
#define SQ_ 5
#define SK_ 7
#define D_ 8
#define DV_ 6
#define NQ (B_ * H_ * SQ_ * D_)
#define NK (B_ * HKV_ * SK_ * D_)
#define NV (B_ * HKV_ * SK_ * DV_)
#define NO (B_ * H_ * SQ_ * DV_)
#define NL (B_ * H_ * SQ_)
#define NW (B_ * H_ * SQ_ * SK_)
#define SENTINEL (-77.0) /* exactly representable in every float dtype */

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

static double g_q[NQ], g_k[NK], g_v[NV];

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

static void test_attention(void) {
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

static void test_output_shape_and_slopes(void) {
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

static void test_linear_attention(void) {
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

/* ---- the multi-head attention layer --------------------------------------------------------- */

#define DM 16
#define MH 4
#define MHKV 2
#define HD (DM / MH)
#define MB 2
#define MS 6
static float g_wq[MH * HD * DM], g_wk[MHKV * HD * DM], g_wv[MHKV * HD * DM], g_wo[DM * MH * HD];
static float g_bq[MH * HD], g_bk[MHKV * HD], g_bv[MHKV * HD], g_bo[DM];

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

static void fill_floats(float* p, int n, double amplitude) {
  int i;
  for (i = 0; i < n; ++i) p[i] = (float)(amplitude * srand1());
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

static void test_mha(void) {
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

/* ---- errors of attention() and struct versions ---------------------------------------------- */

static int buffer_is(const float* p, int n, float value) {
  int i;
  for (i = 0; i < n; ++i)
    if (p[i] != value) return 0;
  return 1;
}

static void test_errors(void) {
  static float qd[NQ], kd[NK], vd[NV], od[NO], kbad[B_ * HKV_ * SK_ * (D_ + 1)];
  static double kd64[NK];
  simdattn_tensor q, k, v, out, kb;
  simdattn_attention_options o;
  int i;
  for (i = 0; i < NQ; ++i) qd[i] = (float)g_q[i];
  for (i = 0; i < NK; ++i) kd[i] = (float)g_k[i], kd64[i] = g_k[i];
  for (i = 0; i < NV; ++i) vd[i] = (float)g_v[i];
  q = simdattn_tensor_contiguous(qd, SIMDATTN_F32, B_, H_, SQ_, D_);
  k = simdattn_tensor_contiguous(kd, SIMDATTN_F32, B_, HKV_, SK_, D_);
  v = simdattn_tensor_contiguous(vd, SIMDATTN_F32, B_, HKV_, SK_, DV_);
  out = simdattn_tensor_contiguous(od, SIMDATTN_F32, B_, H_, SQ_, DV_);
  kb = simdattn_tensor_contiguous(kbad, SIMDATTN_F32, B_, HKV_, SK_, D_ + 1);
  simdattn_attention_options_init(&o);

  set_context("simdattn_attention_options_init");
  CHECK(o.struct_size == sizeof o);
  CHECK(o.has_scale == 0 && o.causal == SIMDATTN_CAUSAL_NONE && o.key_lengths == NULL && o.has_window == 0);
  CHECK(o.window_left == -1 && o.window_right == -1 && o.block_size == 64 && o.global_tokens == 0);
  CHECK(o.mask.data == NULL && o.mask.struct_size == sizeof(simdattn_tensor));
  CHECK(o.lse.data == NULL && o.lse.struct_size == sizeof(simdattn_tensor));
  CHECK(o.relative_bias_bidirectional == 1 && o.relative_bias_max_distance == 128);
  CHECK(o.scores_stage == SIMDATTN_SCORES_SOFTMAX && o.threads == 0 && o.backend == SIMDATTN_BACKEND_NATIVE);

  set_context("attention errors");
  for (i = 0; i < NO; ++i) od[i] = (float)SENTINEL;
  CHECK_ERROR(simdattn_attention(NULL, &k, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "q");
  CHECK_ERROR(simdattn_attention(&q, NULL, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "k");
  CHECK_ERROR(simdattn_attention(&q, &k, NULL, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "v");
  CHECK_ERROR(simdattn_attention(&q, &k, &v, NULL, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "out");
  {
    simdattn_tensor nodata = q;
    nodata.data = NULL;
    CHECK_ERROR(simdattn_attention(&nodata, &k, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "q");
  }
  /* k with the wrong D */
  CHECK_ERROR(simdattn_attention(&q, &kb, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "k");
  CHECK(buffer_is(od, NO, (float)SENTINEL));
  CHECK_ERROR(simdattn_attention(&q, &kb, &v, &out, &o), SIMDATTN_ERROR_INVALID_ARGUMENT, "k");
  CHECK(buffer_is(od, NO, (float)SENTINEL));
  /* a dtype outside the enum */
  {
    simdattn_tensor qbad = q;
    qbad.dtype = (simdattn_dtype)99;
    CHECK_ERROR(simdattn_attention(&qbad, &k, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "q.dtype");
    CHECK(buffer_is(od, NO, (float)SENTINEL));
    qbad.dtype = (simdattn_dtype)-1;
    CHECK_ERROR(simdattn_attention(&qbad, &k, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "q.dtype");
  }
  /* mixed dtypes: k f64 with q f32; out f64 with f32 inputs */
  {
    simdattn_tensor k64 = simdattn_tensor_contiguous(kd64, SIMDATTN_F64, B_, HKV_, SK_, D_);
    prime_error();
    CHECK_STATUS(simdattn_attention(&q, &k64, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT);
    CHECK(strcmp(simdattn_last_error_argument(), "k") == 0 || strcmp(simdattn_last_error_argument(), "k.dtype") == 0);
    CHECK(simdattn_last_error()[0] != '\0');
    CHECK(buffer_is(od, NO, (float)SENTINEL));
  }
  /* an integer dtype for q (all four i32) */
  {
    simdattn_tensor qi = q, ki = k, vi = v, oi = out;
    qi.dtype = ki.dtype = vi.dtype = oi.dtype = SIMDATTN_I32;
    prime_error();
    CHECK_STATUS(simdattn_attention(&qi, &ki, &vi, &oi, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT);
    CHECK(strcmp(simdattn_last_error_argument(), "slopes") != 0);
    CHECK(buffer_is(od, NO, (float)SENTINEL));
  }
  /* bad option values */
  o.causal = (simdattn_causal)9;
  CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, &o), SIMDATTN_ERROR_INVALID_ARGUMENT, "options.causal");
  o.causal = SIMDATTN_CAUSAL_NONE;
  o.backend = (simdattn_backend)9;
  CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, &o), SIMDATTN_ERROR_INVALID_ARGUMENT, "options.backend");
  o.backend = SIMDATTN_BACKEND_NATIVE;
  o.key_lengths_count = B_; /* with key_lengths NULL */
  CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, &o), SIMDATTN_ERROR_INVALID_ARGUMENT, "options.key_lengths");
  o.key_lengths_count = 0;
  CHECK(buffer_is(od, NO, (float)SENTINEL));

  set_context("struct_size");
  /* an older (smaller) struct */
  o.struct_size = sizeof o - 8;
  CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, &o), SIMDATTN_ERROR_VERSION, "options");
  o.struct_size = 0;
  CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, &o), SIMDATTN_ERROR_VERSION, "options");
  o.struct_size = sizeof o;
  {
    simdattn_tensor qs = q;
    qs.struct_size = sizeof qs - 1;
    CHECK_ERROR(simdattn_attention(&qs, &k, &v, &out, NULL), SIMDATTN_ERROR_VERSION, "q");
    qs = out;
    qs.struct_size = 8;
    CHECK_ERROR(simdattn_attention(&q, &k, &v, &qs, NULL), SIMDATTN_ERROR_VERSION, "out");
  }
  /* an embedded tensor with a wrong struct_size */
  {
    static float lsed[NL];
    o.lse = simdattn_tensor_contiguous(lsed, SIMDATTN_F32, B_, H_, SQ_, 1);
    o.lse.struct_size = 0;
    CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, &o), SIMDATTN_ERROR_VERSION, "options.lse");
    o.lse.data = NULL;
    o.lse.struct_size = sizeof(simdattn_tensor);
  }
  CHECK(buffer_is(od, NO, (float)SENTINEL));
  CHECK_STREQ(simdattn_status_string(SIMDATTN_OK), "ok");
  CHECK(simdattn_status_string(SIMDATTN_ERROR_VERSION)[0] != '\0');
  CHECK(simdattn_status_string(SIMDATTN_ERROR_INVALID_ARGUMENT)[0] != '\0');
  CHECK(simdattn_status_string((simdattn_status)42) != NULL);

  /* options from a newer caller: 16 more bytes */
  set_context("struct_size: options from a newer caller");
  {
    const size_t big = sizeof(simdattn_attention_options) + 16;
    unsigned char* buf = calloc(1, big);
    simdattn_attention_options* ob = (simdattn_attention_options*)(void*)buf;
    static float ref_out[NO];
    simdattn_attention_options_init(ob);
    ob->causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT;
    ob->struct_size = big;
    /* the same call with this version's struct, for the expected output */
    o.causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT;
    {
      simdattn_tensor ro = simdattn_tensor_contiguous(ref_out, SIMDATTN_F32, B_, H_, SQ_, DV_);
      CHECK_OK(simdattn_attention(&q, &k, &v, &ro, &o));
    }
    o.causal = SIMDATTN_CAUSAL_NONE;
    if (CHECK_OK(simdattn_attention(&q, &k, &v, &out, ob))) CHECK(memcmp(od, ref_out, sizeof od) == 0);
    for (i = 0; i < NO; ++i) od[i] = (float)SENTINEL;
    buf[sizeof(simdattn_attention_options) + 9] = 1; /* a newer field set */
    CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, ob), SIMDATTN_ERROR_VERSION, "options");
    CHECK(buffer_is(od, NO, (float)SENTINEL));
    buf[sizeof(simdattn_attention_options) + 9] = 0;
    buf[big - 1] = 0x80;
    CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, ob), SIMDATTN_ERROR_VERSION, "options");
    CHECK(buffer_is(od, NO, (float)SENTINEL));
    free(buf);
  }
  /* a tensor from a newer caller, as q */
  set_context("struct_size: q from a newer caller");
  {
    const size_t big = sizeof(simdattn_tensor) + 16;
    unsigned char* buf = calloc(1, big);
    simdattn_tensor* qb = (simdattn_tensor*)(void*)buf;
    static float ref_out[NO];
    simdattn_tensor ro = simdattn_tensor_contiguous(ref_out, SIMDATTN_F32, B_, H_, SQ_, DV_);
    CHECK_OK(simdattn_attention(&q, &k, &v, &ro, NULL));
    memcpy(buf, &q, sizeof q);
    qb->struct_size = big;
    if (CHECK_OK(simdattn_attention(qb, &k, &v, &out, NULL))) CHECK(memcmp(od, ref_out, sizeof od) == 0);
    for (i = 0; i < NO; ++i) od[i] = (float)SENTINEL;
    buf[sizeof(simdattn_tensor)] = 3;
    CHECK_ERROR(simdattn_attention(qb, &k, &v, &out, NULL), SIMDATTN_ERROR_VERSION, "q");
    CHECK(buffer_is(od, NO, (float)SENTINEL));
    {
      int64_t shape[4] = {0, 0, 0, 0};
      CHECK_ERROR(simdattn_attention_output_shape(qb, &k, &v, shape), SIMDATTN_ERROR_VERSION, "q");
      CHECK(shape[0] == 0 && shape[3] == 0);
    }
    free(buf);
  }
  /* get_info with an older and a newer struct */
  set_context("struct_size: simdattn_get_info");
  {
    const size_t big = sizeof(simdattn_info) + 16;
    unsigned char* buf = malloc(big);
    simdattn_info* ib = (simdattn_info*)(void*)buf;
    size_t z;
    int zero = 1;
    memset(buf, 0xCD, big);
    ib->struct_size = big;
    if (CHECK_OK(simdattn_get_info(ib))) {
      CHECK(ib->struct_size == big);
      CHECK(ib->version != NULL && strcmp(ib->version, simdattn_version()) == 0);
      for (z = sizeof(simdattn_info); z < big; ++z) zero &= buf[z] == 0;
      CHECK(zero);
    }
    ib->struct_size = sizeof(simdattn_info) - 8;
    ib->version = NULL;
    CHECK_ERROR(simdattn_get_info(ib), SIMDATTN_ERROR_VERSION, "info");
    CHECK(ib->version == NULL);
    CHECK_ERROR(simdattn_get_info(NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "info");
    free(buf);
  }
  set_context("simdattn_set_thread_budget");
  CHECK_ERROR(simdattn_set_thread_budget(-1), SIMDATTN_ERROR_INVALID_ARGUMENT, "threads");
  CHECK_OK(simdattn_set_thread_budget(0));
  set_context("simdattn_set_thread_runtime");
  {
    const simdattn_thread_runtime before = simdattn_get_thread_runtime();
    CHECK(before == SIMDATTN_THREAD_RUNTIME_TEAM || before == SIMDATTN_THREAD_RUNTIME_OPENMP);
    CHECK_ERROR(simdattn_set_thread_runtime((simdattn_thread_runtime)7), SIMDATTN_ERROR_INVALID_ARGUMENT, "runtime");
    CHECK(simdattn_get_thread_runtime() == before);
    CHECK_OK(simdattn_set_thread_runtime(SIMDATTN_THREAD_RUNTIME_OPENMP));
    CHECK(simdattn_get_thread_runtime() == SIMDATTN_THREAD_RUNTIME_OPENMP);
    CHECK_OK(simdattn_set_thread_runtime(before));
    CHECK(simdattn_get_thread_runtime() == before);
  }

  set_context("simdattn_set_verbose");
  simdattn_set_verbose(1);
  CHECK(simdattn_get_verbose() == 1);
  simdattn_set_verbose(0);
  CHECK(simdattn_get_verbose() == 0);
  set_context("");
}

/* ---- version and machine info --------------------------------------------------------------- */

static int is_version_string(const char* s) { /* digits.digits.digits */
  int parts = 0;
  while (*s != '\0') {
    if (*s < '0' || *s > '9') return 0;
    while (*s >= '0' && *s <= '9') ++s;
    ++parts;
    if (*s == '.') {
      ++s;
      if (*s == '\0') return 0;
    } else if (*s != '\0')
      return 0;
  }
  return parts == 3;
}

static void test_version_and_info(void) {
  simdattn_info info;
  set_context("version and info");
  CHECK(simdattn_version() != NULL);
  CHECK(is_version_string(simdattn_version()));
#ifdef SIMDATTN_EXPECTED_VERSION
  CHECK_STREQ(simdattn_version(), STRINGIFY(SIMDATTN_EXPECTED_VERSION));
#endif
  CHECK(simdattn_c_api_version() == SIMDATTN_C_API_VERSION);
  CHECK(simdattn_c_api_version() >= 1);
  CHECK_STREQ(simdattn_last_error(), ""); /* no call has failed on this thread yet */
  CHECK_STREQ(simdattn_last_error_argument(), "");
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  if (CHECK_OK(simdattn_get_info(&info))) {
    CHECK(info.struct_size == sizeof info);
    CHECK(info.version != NULL && info.isa != NULL && info.isas != NULL && info.backends != NULL &&
          info.onednn_version != NULL);
    if (info.version != NULL) CHECK_STREQ(info.version, simdattn_version());
    CHECK(info.isa != NULL && info.isa[0] != '\0');
    CHECK(info.isas != NULL && info.isa != NULL && strstr(info.isas, info.isa) != NULL);
    CHECK(info.backends != NULL && strstr(info.backends, "native") != NULL &&
          strstr(info.backends, "reference") != NULL);
    CHECK(info.isa_forced == 0 || info.isa_forced == 1);
    CHECK(info.default_threads >= 1 && info.thread_budget >= 1);
    printf("simdattn %s (C API %d): isa %s of [%s], backends [%s], oneDNN \"%s\", %d threads\n", simdattn_version(),
           simdattn_c_api_version(), info.isa != NULL ? info.isa : "?", info.isas != NULL ? info.isas : "?",
           info.backends != NULL ? info.backends : "?", info.onednn_version != NULL ? info.onednn_version : "?",
           info.default_threads);
  }
  set_context("");
}

/* ---- the error message is per thread -------------------------------------------------------- */

#if !defined(__STDC_NO_THREADS__)
typedef struct thread_result {
  char initial_message[64];
  simdattn_status status;
  char argument[64];
  char message[256];
} thread_result;

static int thread_body(void* arg) {
  thread_result* r = arg;
  float slopes[4];
  snprintf(r->initial_message, sizeof r->initial_message, "%s", simdattn_last_error());
  r->status = simdattn_standard_alibi_slopes(0, slopes);
  snprintf(r->argument, sizeof r->argument, "%s", simdattn_last_error_argument());
  snprintf(r->message, sizeof r->message, "%s", simdattn_last_error());
  return 0;
}

static void test_thread_local_errors(void) {
  float qd[NQ], kd[B_ * HKV_ * SK_ * (D_ + 1)], vd[NV], od[NO];
  simdattn_tensor q = simdattn_tensor_contiguous(qd, SIMDATTN_F32, B_, H_, SQ_, D_);
  simdattn_tensor k = simdattn_tensor_contiguous(kd, SIMDATTN_F32, B_, HKV_, SK_, D_ + 1);
  simdattn_tensor v = simdattn_tensor_contiguous(vd, SIMDATTN_F32, B_, HKV_, SK_, DV_);
  simdattn_tensor out = simdattn_tensor_contiguous(od, SIMDATTN_F32, B_, H_, SQ_, DV_);
  char before[512];
  thrd_t thread;
  thread_result r;
  memset(qd, 0, sizeof qd), memset(kd, 0, sizeof kd), memset(vd, 0, sizeof vd);
  memset(&r, 0, sizeof r);
  set_context("errors are per thread");
  CHECK_ERROR(simdattn_attention(&q, &k, &v, &out, NULL), SIMDATTN_ERROR_INVALID_ARGUMENT, "k");
  snprintf(before, sizeof before, "%s", simdattn_last_error());
  if (thrd_create(&thread, thread_body, &r) != thrd_success) {
    printf("note: thrd_create failed; the per-thread error check is skipped\n");
    return;
  }
  thrd_join(thread, NULL);
  CHECK_STREQ(r.initial_message, "");
  CHECK(r.status == SIMDATTN_ERROR_INVALID_ARGUMENT);
  CHECK_STREQ(r.argument, "heads");
  CHECK(r.message[0] != '\0');
  CHECK_STREQ(simdattn_last_error_argument(), "k");
  CHECK_STREQ(simdattn_last_error(), before);
  set_context("");
}
#endif

/* ---- simdattn_mha_from_gguf: a qwen2 layer written here in GGUF's layout ---------------- */

static void put_u32(FILE* f, uint32_t v) {
  unsigned char b[4];
  int i;
  for (i = 0; i < 4; ++i) b[i] = (unsigned char)(v >> (8 * i));
  fwrite(b, 1, 4, f);
}
static void put_u64(FILE* f, uint64_t v) {
  put_u32(f, (uint32_t)v), put_u32(f, (uint32_t)(v >> 32));
}
static void put_str(FILE* f, const char* s) {
  put_u64(f, strlen(s)), fwrite(s, 1, strlen(s), f);
}
static void put_u32_kv(FILE* f, const char* key, uint32_t v) {
  put_str(f, key), put_u32(f, 4), put_u32(f, v);
}
/* F32 data little-endian, as the host lays it out (the test runs on x86-64) */
static const struct {
  const char* name;
  const float* data;
  uint64_t in, out; /* ggml dims {in, out}; in 0: a bias of `out` */
} kGgufTensors[] = {
    {"blk.0.attn_q.weight", g_wq, DM, MH * HD},   {"blk.0.attn_k.weight", g_wk, DM, MHKV * HD},
    {"blk.0.attn_v.weight", g_wv, DM, MHKV * HD}, {"blk.0.attn_output.weight", g_wo, MH * HD, DM},
    {"blk.0.attn_q.bias", g_bq, 0, MH * HD},      {"blk.0.attn_k.bias", g_bk, 0, MHKV * HD},
    {"blk.0.attn_v.bias", g_bv, 0, MHKV * HD},
};

static int write_gguf(const char* path) {
  FILE* f = fopen(path, "wb");
  size_t i, n = sizeof kGgufTensors / sizeof kGgufTensors[0];
  uint64_t offset = 0;
  long pos;
  if (f == NULL) return 0;
  fwrite("GGUF", 1, 4, f), put_u32(f, 3), put_u64(f, n), put_u64(f, 5);
  put_str(f, "general.architecture"), put_u32(f, 8), put_str(f, "qwen2");
  put_u32_kv(f, "qwen2.block_count", 1), put_u32_kv(f, "qwen2.embedding_length", DM);
  put_u32_kv(f, "qwen2.attention.head_count", MH), put_u32_kv(f, "qwen2.attention.head_count_kv", MHKV);
  for (i = 0; i < n; ++i) {
    uint64_t count = kGgufTensors[i].out * (kGgufTensors[i].in ? kGgufTensors[i].in : 1);
    put_str(f, kGgufTensors[i].name);
    put_u32(f, kGgufTensors[i].in ? 2 : 1);
    if (kGgufTensors[i].in) put_u64(f, kGgufTensors[i].in);
    put_u64(f, kGgufTensors[i].out), put_u32(f, 0 /* F32 */), put_u64(f, offset);
    offset += (count * 4 + 31) / 32 * 32;
  }
  for (pos = ftell(f); pos % 32 != 0; ++pos) fputc(0, f);
  for (i = 0; i < n; ++i) {
    uint64_t count = kGgufTensors[i].out * (kGgufTensors[i].in ? kGgufTensors[i].in : 1), b;
    fwrite(kGgufTensors[i].data, 4, (size_t)count, f);
    for (b = count * 4; b % 32 != 0; ++b) fputc(0, f);
  }
  return fclose(f) == 0;
}

/* After test_mha (its weights): the file's layer equals simdattn_mha_create's of the same
 * weights with qwen2's settings (RoPE of base 10000 on rotate_half, causal), bitwise. */
static void test_gguf(void) {
  const char* path = "test_c_api_layer.gguf";
  simdattn_mha_config cfg;
  simdattn_mha_weights w;
  simdattn_mha_info info;
  simdattn_pretrained_options po;
  simdattn_mha *from_file = NULL, *from_memory = NULL;
  static float x[MB * MS * DM], y_file[MB * MS * DM], y_memory[MB * MS * DM];
  simdattn_seq xs, ys;
  int i, same = 1;

  set_context("simdattn_mha_from_gguf");
  if (!write_gguf(path)) {
    CHECK(!"the GGUF file could not be written");
    return;
  }
  fill_floats(x, MB * MS * DM, 1.0);
  if (CHECK_OK(simdattn_mha_from_gguf(path, 0, NULL, &from_file)) && from_file != NULL) {
    info.struct_size = sizeof info;
    if (CHECK_OK(simdattn_mha_get_info(from_file, &info))) {
      CHECK(info.d_model == DM && info.heads == MH && info.kv_heads == MHKV && info.head_dim == HD);
      CHECK(info.dtype == SIMDATTN_F32 && info.causal == 1);
    }
    simdattn_mha_config_init(&cfg);
    cfg.d_model = DM, cfg.heads = MH, cfg.kv_heads = MHKV, cfg.has_rope = 1, cfg.causal = 1;
    simdattn_mha_weights_init(&w);
    w.wq = g_wq, w.wk = g_wk, w.wv = g_wv, w.wo = g_wo, w.bq = g_bq, w.bk = g_bk, w.bv = g_bv;
    if (CHECK_OK(simdattn_mha_create(&cfg, &w, &from_memory))) {
      xs = simdattn_seq_make(x, SIMDATTN_F32, MB, MS, DM);
      ys = simdattn_seq_make(y_file, SIMDATTN_F32, MB, MS, DM);
      CHECK_OK(simdattn_mha_forward(from_file, &xs, &ys, NULL));
      ys.data = y_memory;
      CHECK_OK(simdattn_mha_forward(from_memory, &xs, &ys, NULL));
      for (i = 0; i < MB * MS * DM; ++i) same &= y_file[i] == y_memory[i];
      CHECK(same);
    }
    simdattn_mha_free(from_memory);
    simdattn_mha_free(from_file);
  }
  simdattn_pretrained_options_init(&po);
  po.has_dtype = 1, po.dtype = SIMDATTN_BF16;
  from_file = NULL;
  if (CHECK_OK(simdattn_mha_from_gguf(path, 0, &po, &from_file))) {
    info.struct_size = sizeof info;
    if (CHECK_OK(simdattn_mha_get_info(from_file, &info))) CHECK(info.dtype == SIMDATTN_BF16);
  }
  simdattn_mha_free(from_file);
  po.attention = "cross";
  CHECK_ERROR(simdattn_mha_from_gguf(path, 0, &po, &from_file), SIMDATTN_ERROR_INVALID_ARGUMENT, "options.attention");
  CHECK(from_file == NULL);
  CHECK_ERROR(simdattn_mha_from_gguf(path, 1, NULL, &from_file), SIMDATTN_ERROR_INVALID_ARGUMENT, "layer");
  CHECK_ERROR(simdattn_mha_from_gguf("no-such.gguf", 0, NULL, &from_file), SIMDATTN_ERROR_INVALID_ARGUMENT,
              "no-such.gguf");
  CHECK_ERROR(simdattn_mha_from_gguf(NULL, 0, NULL, &from_file), SIMDATTN_ERROR_INVALID_ARGUMENT, "path");
  remove(path);
  set_context("");
}

int main(void) {
  test_version_and_info(); /* first: nothing has failed on this thread yet */
  test_attention();
  test_output_shape_and_slopes();
  test_linear_attention();
  test_mha();
  test_gguf();
  test_errors();
#if !defined(__STDC_NO_THREADS__)
  test_thread_local_errors();
#else
  printf("note: no C11 threads; the per-thread error check is skipped\n");
#endif
  if (g_failures != 0) {
    fprintf(stderr, "test_c_api: %d of %d checks FAILED\n", g_failures, g_checks);
    return 1;
  }
  printf("test_c_api: all %d checks passed\n", g_checks);
  return 0;
}
