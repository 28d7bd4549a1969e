// The C API's conversions (translate.hpp) and this thread's last error.
#include "c_api/translate.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "simdattn/error.hpp"
#include "simdattn/simdattn.h"

namespace simdattn::c_api {
namespace {

thread_local std::string t_error, t_argument;

}  // namespace

simdattn_status fail(simdattn_status status, std::string argument, std::string message) {
  t_argument = std::move(argument);
  t_error = std::move(message);
  return status;
}

// A caller's struct of `size` bytes at p, this library's being `ours`: smaller is refused, larger
// only when every byte past ours is zero (fields of a newer version left unset).
void check_size(const void* p, std::size_t size, std::size_t ours, const char* name) {
  if (size < ours)
    throw VersionError{name, "struct_size " + std::to_string(size) + " is smaller than this library's " +
                                 std::to_string(ours) + " (set it with its _init function or sizeof)"};
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (std::size_t i = ours; i < size; ++i)
    if (bytes[i] != 0)
      throw VersionError{name, "struct_size " + std::to_string(size) + " carries fields this library (C API " +
                                   std::to_string(SIMDATTN_C_API_VERSION) + ", " + std::to_string(ours) +
                                   " bytes) does not know, and one is set"};
}

DType dtype_of_c(simdattn_dtype t, const std::string& name) {
  switch (t) {
    case SIMDATTN_F32: return DType::f32;
    case SIMDATTN_F64: return DType::f64;
    case SIMDATTN_U8: return DType::u8;
    case SIMDATTN_I32: return DType::i32;
    case SIMDATTN_I64: return DType::i64;
    case SIMDATTN_BF16: return DType::bf16;
    case SIMDATTN_F16: return DType::f16;
    case SIMDATTN_INT8: return DType::int8;
    case SIMDATTN_FP8_E4M3: return DType::fp8_e4m3;
    case SIMDATTN_FP8_E5M2: return DType::fp8_e5m2;
  }
  throw Error(name, "expected a simdattn_dtype (0 .. 9), got " + std::to_string(static_cast<long long>(t)));
}

simdattn_dtype dtype_to_c(DType t) {
  switch (t) {
    case DType::f32: return SIMDATTN_F32;
    case DType::f64: return SIMDATTN_F64;
    case DType::u8: return SIMDATTN_U8;
    case DType::i32: return SIMDATTN_I32;
    case DType::i64: return SIMDATTN_I64;
    case DType::bf16: return SIMDATTN_BF16;
    case DType::f16: return SIMDATTN_F16;
    case DType::int8: return SIMDATTN_INT8;
    case DType::fp8_e4m3: return SIMDATTN_FP8_E4M3;
    case DType::fp8_e5m2: return SIMDATTN_FP8_E5M2;
  }
  return SIMDATTN_F32;
}

Causal causal_of_c(simdattn_causal c, const char* name) {
  switch (c) {
    case SIMDATTN_CAUSAL_NONE: return Causal::none;
    case SIMDATTN_CAUSAL_TOP_LEFT: return Causal::top_left;
    case SIMDATTN_CAUSAL_BOTTOM_RIGHT: return Causal::bottom_right;
  }
  throw Error(name, "expected SIMDATTN_CAUSAL_NONE, _TOP_LEFT or _BOTTOM_RIGHT, got " +
                        std::to_string(static_cast<long long>(c)));
}

Backend backend_of_c(simdattn_backend b, const char* name) {
  switch (b) {
    case SIMDATTN_BACKEND_REFERENCE: return Backend::reference;
    case SIMDATTN_BACKEND_NATIVE: return Backend::native;
    case SIMDATTN_BACKEND_ONEDNN: return Backend::onednn;
  }
  throw Error(name, "expected SIMDATTN_BACKEND_REFERENCE, _NATIVE or _ONEDNN, got " +
                        std::to_string(static_cast<long long>(b)));
}

std::optional<double> optional_double(int has, double value) { return has ? std::optional<double>(value) : std::nullopt; }

simdattn_tensor empty_tensor() {
  simdattn_tensor t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  return t;
}

MhaOptions mha_options(const simdattn_mha_options* c) {
  MhaOptions o;
  if (c == nullptr) return o;
  const simdattn_mha_options& s = checked(c, "options");
  o.causal = causal_of_c(s.causal, "options.causal");
  o.key_padding_mask = span_of(s.key_padding_mask, s.key_padding_mask_count, "options.key_padding_mask");
  o.attn_mask = optional_view<ConstTensorView>(s.attn_mask, "options.attn_mask");
  o.positions = span_of(s.positions, s.positions_count, "options.positions");
  o.attn_weights = optional_view<TensorView>(s.attn_weights, "options.attn_weights");
  o.threads = s.threads;
  o.backend = backend_of_c(s.backend, "options.backend");
  return o;
}

}  // namespace simdattn::c_api

extern "C" {

const char* simdattn_last_error(void) { return simdattn::c_api::t_error.c_str(); }
const char* simdattn_last_error_argument(void) { return simdattn::c_api::t_argument.c_str(); }

}  // extern "C"
