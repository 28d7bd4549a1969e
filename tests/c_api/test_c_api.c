/* The C API (simdattn/simdattn.h) from C11, against the installed library.
 *
 * Every result is compared with a plain double-precision reference written here (attention with
 * each option, linear attention, the multi-head attention layer); every error path is checked for
 * its status, the argument it names, a message, and outputs left untouched. Exits 0 only if every
 * check passes; each failed check is printed with its file:line and the library's last error.
 *
 * The parts: c_api_attention.c (attention, output shape, ALiBi slopes, linear attention), c_api_mha.c
 * (the layer and its KV cache), c_api_gguf.c (a layer from a GGUF file), c_api_errors.c (errors,
 * struct versions, version and info, per-thread errors); c_api_check.c (checks, tensors).
 *
 * Build: cc -std=c11 -Wall -Wextra -pedantic -Werror test_c_api.c c_api_*.c $(pkg-config --cflags
 * --libs simdattn) -lm [-DSIMDATTN_EXPECTED_VERSION=0.1.0]
 */
#include <stdio.h>

#include "c_api_cases.h"
#include "c_api_check.h"

/* The parts' order matters: test_attention fills the inputs test_linear_attention and test_errors
 * read, test_mha the weights test_gguf writes. */
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
  return report("test_c_api");
}
