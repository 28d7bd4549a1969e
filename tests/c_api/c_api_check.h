/* The C API tests' checks and tensors (test_c_api*.c): counted checks with the library's last
 * error printed at each failure, deterministic random numbers, and 4-d tensors of any dtype in three
 * memory layouts, written from and read back to doubles. */
#ifndef SIMDATTN_TESTS_C_API_CHECK_H
#define SIMDATTN_TESTS_C_API_CHECK_H

#include <simdattn/simdattn.h>

#include <stddef.h>
#include <stdint.h>

/* ---- checks --------------------------------------------------------------------------------- */

extern int g_checks, g_failures;

/* What is being tested, printed with each failure ("" for nothing). */
void set_context(const char* fmt, ...);
void fail_at(const char* file, int line, const char* fmt, ...);
int check_status(simdattn_status got, simdattn_status expected, const char* expr, const char* file, int line);
int check_streq(const char* got, const char* expected, const char* expr, const char* file, int line);
/* Sets this thread's last error to a known one ("slopes") before a call expected to fail, so that
 * the argument checked afterwards is that call's and not a leftover. */
void prime_error(void);
void check_error(simdattn_status got, simdattn_status expected_status, const char* expected_argument,
                 const char* expr, const char* file, int line);
/* got[i] within tol * (1 + |ref[i]|) of ref[i] for every i (infinities must match exactly). */
int check_close_impl(const double* got, const double* ref, size_t n, double tol, const char* what, const char* file,
                     int line);
/* Prints "<name>: all N checks passed" (exit status 0) or "<name>: F of N checks FAILED" (1). */
int report(const char* name);

#define CHECK(cond)                                               \
  do {                                                            \
    ++g_checks;                                                   \
    if (!(cond)) fail_at(__FILE__, __LINE__, "CHECK(%s)", #cond); \
  } while (0)
#define CHECK_STATUS(call, expected) check_status((call), (expected), #call, __FILE__, __LINE__)
#define CHECK_OK(call) check_status((call), SIMDATTN_OK, #call, __FILE__, __LINE__)
#define CHECK_STREQ(got, expected) check_streq((got), (expected), #got, __FILE__, __LINE__)
/* The call fails with `status`, naming `argument`, with a message. */
#define CHECK_ERROR(call, status, argument)                            \
  do {                                                                 \
    simdattn_status st_;                                               \
    prime_error();                                                     \
    st_ = (call);                                                      \
    check_error(st_, (status), (argument), #call, __FILE__, __LINE__); \
  } while (0)
#define CHECK_CLOSE(got, ref, n, tol, what) check_close_impl((got), (ref), (n), (tol), (what), __FILE__, __LINE__)

/* ---- deterministic random numbers ----------------------------------------------------------- */

double urand(void);  /* [0, 1) */
double srand1(void); /* [-1, 1) */
/* p[i] = amplitude * srand1() */
void fill_floats(float* p, int n, double amplitude);

/* ---- tensors -------------------------------------------------------------------------------- */

size_t dtype_size(simdattn_dtype t);
const char* dtype_name(simdattn_dtype t);
/* Element i of p in dtype t, as a double (bf16/f16 rounded to nearest even when stored; 8-bit
 * codes as their bits). */
void store_elem(void* p, simdattn_dtype t, int64_t i, double x);
double load_elem(const void* p, simdattn_dtype t, int64_t i);
/* Elements from the first to one past the last a view can touch. */
int64_t extent_of(const simdattn_tensor* t);

enum layout {
  LAYOUT_CONTIGUOUS = 0, /* C order [d0, d1, d2, d3] */
  LAYOUT_SEQ_MAJOR = 1,  /* memory [d0, d2, d1, d3] (e.g. q [B, H, S, D] stored as [B, S, H, D]) */
  LAYOUT_PADDED = 2      /* C order with rows of d3 + 3 elements (3 unused at each row's end) */
};
#define ROW_PAD 3

/* A new tensor (free its data) of `shape` in `layout`: every element of its extent set to `fill`,
 * then the view's elements to `logical` (C order [d0, d1, d2, d3]) unless NULL. */
simdattn_tensor new_tensor(simdattn_dtype dtype, const int64_t shape[4], enum layout layout, const double* logical,
                           double fill);
/* The view's elements in C order. */
void read_tensor(const simdattn_tensor* t, double* logical);
/* Every element of the tensor's extent (view and gaps, plus `extra`) equals `fill`. */
int all_fill(const simdattn_tensor* t, double fill, int64_t extra);

#endif
