/* simdattn_mha_from_gguf from C11: a qwen2 layer written here in GGUF's layout, loaded and compared
 * bitwise with simdattn_mha_create's layer of the same weights; its errors. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "c_api_cases.h"
#include "c_api_check.h"

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
void test_gguf(void) {
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
