/* The C API tests' checks and tensors: see c_api_check.h. */
#include "c_api_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks --------------------------------------------------------------------------------- */

int g_checks = 0, g_failures = 0;
static char g_context[256] = ""; /* what is being tested, printed with each failure */

void set_context(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_context, sizeof g_context, fmt, ap);
  va_end(ap);
}

void fail_at(const char* file, int line, const char* fmt, ...) {
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

int check_status(simdattn_status got, simdattn_status expected, const char* expr, const char* file, int line) {
  ++g_checks;
  if (got != expected) {
    fail_at(file, line, "%s returned %d (%s), expected %d (%s)", expr, (int)got, simdattn_status_string(got),
            (int)expected, simdattn_status_string(expected));
    return 0;
  }
  return 1;
}

int check_streq(const char* got, const char* expected, const char* expr, const char* file, int line) {
  ++g_checks;
  if (got == NULL || strcmp(got, expected) != 0) {
    fail_at(file, line, "%s is \"%s\", expected \"%s\"", expr, got == NULL ? "(NULL)" : got, expected);
    return 0;
  }
  return 1;
}

void prime_error(void) { (void)simdattn_standard_alibi_slopes(4, NULL); }

void check_error(simdattn_status got, simdattn_status expected_status, const char* expected_argument,
                 const char* expr, const char* file, int line) {
  const char* message = simdattn_last_error();
  check_status(got, expected_status, expr, file, line);
  check_streq(simdattn_last_error_argument(), expected_argument, "simdattn_last_error_argument()", file, line);
  ++g_checks;
  if (message == NULL || message[0] == '\0') fail_at(file, line, "%s: simdattn_last_error() is empty", expr);
}

int check_close_impl(const double* got, const double* ref, size_t n, double tol, const char* what, const char* file,
                     int line) {
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

/* ---- deterministic random numbers ----------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
double urand(void) { /* [0, 1) */
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(g_rng >> 11) / 9007199254740992.0;
}
double srand1(void) { return 2.0 * urand() - 1.0; } /* [-1, 1) */

void fill_floats(float* p, int n, double amplitude) {
  int i;
  for (i = 0; i < n; ++i) p[i] = (float)(amplitude * srand1());
}

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

size_t dtype_size(simdattn_dtype t) {
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

const char* dtype_name(simdattn_dtype t) {
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

void store_elem(void* p, simdattn_dtype t, int64_t i, double x) {
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

double load_elem(const void* p, simdattn_dtype t, int64_t i) {
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

int64_t extent_of(const simdattn_tensor* t) {
  int64_t e = 1;
  int i;
  for (i = 0; i < 4; ++i) e += (t->shape[i] - 1) * t->strides[i];
  return e;
}

simdattn_tensor new_tensor(simdattn_dtype dtype, const int64_t shape[4], enum layout layout, const double* logical,
                           double fill) {
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

void read_tensor(const simdattn_tensor* t, double* logical) {
  int64_t i = 0, a, b, c, d;
  for (a = 0; a < t->shape[0]; ++a)
    for (b = 0; b < t->shape[1]; ++b)
      for (c = 0; c < t->shape[2]; ++c)
        for (d = 0; d < t->shape[3]; ++d, ++i)
          logical[i] = load_elem(t->data, t->dtype,
                                 a * t->strides[0] + b * t->strides[1] + c * t->strides[2] + d * t->strides[3]);
}

int all_fill(const simdattn_tensor* t, double fill, int64_t extra) {
  int64_t i, e = extent_of(t) + extra;
  for (i = 0; i < e; ++i)
    if (load_elem(t->data, t->dtype, i) != fill) return 0;
  return 1;
}

int report(const char* name) {
  if (g_failures != 0) {
    fprintf(stderr, "%s: %d of %d checks FAILED\n", name, g_failures, g_checks);
    return 1;
  }
  printf("%s: all %d checks passed\n", name, g_checks);
  return 0;
}
