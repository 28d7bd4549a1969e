/* What test_c_api's parts share: the attention shapes and inputs (filled by test_attention, read
 * by test_linear_attention and test_errors), the layer shapes and weights (filled by test_mha,
 * written to a GGUF file by test_gguf), and the parts themselves, run in main's order. */
#ifndef SIMDATTN_TESTS_C_API_CASES_H
#define SIMDATTN_TESTS_C_API_CASES_H

/* ---- attention: q [B_, H_, SQ_, D_], k [B_, HKV_, SK_, D_], v [B_, HKV_, SK_, DV_] ------------ */

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

extern double g_q[NQ], g_k[NK], g_v[NV]; /* test_attention's random inputs */

/* ---- the multi-head attention layer: d_model DM, MH heads over MHKV K/V heads; x [MB, MS, DM] -- */

#define DM 16
#define MH 4
#define MHKV 2
#define HD (DM / MH)
#define MB 2
#define MS 6
/* test_mha's random weights and biases (wq [MH * HD, DM], ...) */
extern float g_wq[MH * HD * DM], g_wk[MHKV * HD * DM], g_wv[MHKV * HD * DM], g_wo[DM * MH * HD];
extern float g_bq[MH * HD], g_bk[MHKV * HD], g_bv[MHKV * HD], g_bo[DM];

/* ---- the parts -------------------------------------------------------------------------------- */

void test_version_and_info(void);      /* c_api_errors.c */
void test_attention(void);             /* c_api_attention.c */
void test_output_shape_and_slopes(void);
void test_linear_attention(void);
void test_mha(void);                   /* c_api_mha.c */
void test_gguf(void);                  /* c_api_gguf.c */
void test_errors(void);                /* c_api_errors.c */
#if !defined(__STDC_NO_THREADS__)
void test_thread_local_errors(void);
#endif

#endif
