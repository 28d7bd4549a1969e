/* The C API's errors from C11: attention's (status, the argument named, a message, out untouched),
 * struct versions from older and newer callers, the thread budget and runtime, the verbose switch;
 * the version and machine info; the last error kept per thread. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__STDC_NO_THREADS__)
#include <threads.h>
#endif

#include "c_api_cases.h"
#include "c_api_check.h"

#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)

/* ---- errors of attention() and struct versions ---------------------------------------------- */

static int buffer_is(const float* p, int n, float value) {
  int i;
  for (i = 0; i < n; ++i)
    if (p[i] != value) return 0;
  return 1;
}

void test_errors(void) {
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

void test_version_and_info(void) {
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

void test_thread_local_errors(void) {
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
