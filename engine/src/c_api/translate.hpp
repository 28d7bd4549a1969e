// The C API's translation between its structs and the C++ API (c_api.cpp, mha.cpp): struct
// sizes checked against this library's, C enums and tensors converted, and `guarded`, which
// runs a C++ call and turns every exception into a status and this thread's error message.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/simdattn.h"

struct simdattn_mha {
  simdattn::MultiHeadAttention layer;
};

namespace simdattn::c_api {

// A struct_size this library cannot take: the caller's struct is older than the library's, or a
// newer caller set a field this library does not know.
struct VersionError {
  std::string argument, message;
};

// Sets this thread's error message and argument (simdattn_last_error) and returns status.
simdattn_status fail(simdattn_status status, std::string argument, std::string message);

// Runs f() (which may throw anything) and returns its status.
template <class F>
simdattn_status guarded(F&& f) noexcept {
  try {
    f();
    return SIMDATTN_OK;
  } catch (const Error& e) {
    return fail(SIMDATTN_ERROR_INVALID_ARGUMENT, e.argument(), e.what());
  } catch (const VersionError& e) {
    return fail(SIMDATTN_ERROR_VERSION, e.argument, e.argument + ": " + e.message);
  } catch (const std::bad_alloc&) {
    return fail(SIMDATTN_ERROR_OUT_OF_MEMORY, "", "out of memory");
  } catch (const std::exception& e) {
    return fail(SIMDATTN_ERROR_INTERNAL, "", std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(SIMDATTN_ERROR_INTERNAL, "", "internal error: unknown exception");
  }
}

template <class P>
void require(const P* p, const char* name) {
  if (p == nullptr) throw Error(name, "expected a pointer, got NULL");
}

// A caller's struct of `size` bytes at p, this library's being `ours`: smaller is refused, larger
// only when every byte past ours is zero (fields of a newer version left unset).
void check_size(const void* p, std::size_t size, std::size_t ours, const char* name);

template <class S>
const S& checked(const S* p, const char* name) {
  require(p, name);
  check_size(p, p->struct_size, sizeof(S), name);
  return *p;
}

// An options struct of a caller built against this header, or an older one whose struct ends at
// one of `older` bytes (C API 1's, 3's, ...): a copy with the fields past the caller's size zero
// (their defaults).
template <class S>
S checked_options(const S* p, const char* name, std::initializer_list<std::size_t> older) {
  require(p, name);
  if (p->struct_size >= sizeof(S)) return checked(p, name);
  if (std::find(older.begin(), older.end(), p->struct_size) == older.end()) {
    std::string sizes;
    for (std::size_t o : older) sizes += ", " + std::to_string(o);
    throw VersionError{name, "struct_size " + std::to_string(p->struct_size) + " is neither this library's " +
                                 std::to_string(sizeof(S)) + " nor an older version's (" + sizes.substr(2) +
                                 ") (set it with its _init function or sizeof)"};
  }
  S s;
  std::memset(&s, 0, sizeof s);
  std::memcpy(&s, p, p->struct_size);
  return s;
}

DType dtype_of_c(simdattn_dtype t, const std::string& name);

simdattn_dtype dtype_to_c(DType t);

Causal causal_of_c(simdattn_causal c, const char* name);

Backend backend_of_c(simdattn_backend b, const char* name);

// The C++ view of a tensor struct whose size has been checked.
template <class View>
View to_view(const simdattn_tensor& s, const char* name) {
  View v;
  v.data = s.data;
  v.dtype = dtype_of_c(s.dtype, std::string(name) + ".dtype");
  for (int i = 0; i < 4; ++i) v.shape[i] = s.shape[i], v.strides[i] = s.strides[i];
  return v;
}

// A tensor given by pointer (q, k, v, out): required, its struct checked.
template <class View>
View view_of(const simdattn_tensor* t, const char* name) {
  const simdattn_tensor& s = checked(t, name);
  if (s.data == nullptr) throw Error(name, "expected data, got NULL");
  return to_view<View>(s, name);
}

// An optional tensor embedded in an options struct: absent when its data is NULL.
template <class View>
View optional_view(const simdattn_tensor& s, const char* name) {
  if (s.data == nullptr) return {};
  if (s.struct_size != sizeof(simdattn_tensor))
    throw VersionError{name, "struct_size " + std::to_string(s.struct_size) + ", expected " +
                                 std::to_string(sizeof(simdattn_tensor)) + " (an embedded tensor; set it with the options' _init)"};
  return to_view<View>(s, name);
}

// count values at p (p may be NULL only when count is 0).
template <class T>
std::span<const T> span_of(const T* p, std::size_t count, const char* name) {
  if (p == nullptr && count != 0) throw Error(name, "expected " + std::to_string(count) + " values, got NULL");
  if (p == nullptr) return {};
  return {p, count};
}

std::optional<double> optional_double(int has, double value);

simdattn_tensor empty_tensor();

// The fields both options structs (simdattn_attention_options, simdattn_paged_options) name alike,
// as the C++ ScoreOptions they share: the scale, window, softcap, ALiBi slopes, sinks, threads,
// backend and 8-bit scales.
template <class C>
void score_options(const C& s, ScoreOptions& o);

// An options struct given by pointer (NULL: the defaults, and none returned), its size checked
// against base_size (the fields every version has), its shared fields and causal read onto o;
// the struct, for the call's own fields.
template <class C, class O>
std::optional<C> read_options(const C* c, std::initializer_list<std::size_t> older, O& o) {
  if (c == nullptr) return std::nullopt;
  const C s = checked_options(c, "options", older);
  score_options(s, o);
  o.causal = causal_of_c(s.causal, "options.causal");
  return s;
}

template <class C>
void score_options(const C& s, ScoreOptions& o) {
  o.scale = optional_double(s.has_scale, s.scale);
  if (s.has_window) o.window = Window{s.window_left, s.window_right};
  o.softcap = optional_double(s.has_softcap, s.softcap);
  o.alibi_slopes = span_of(s.alibi_slopes, s.alibi_slopes_count, "options.alibi_slopes");
  o.sinks = span_of(s.sinks, s.sinks_count, "options.sinks");
  o.threads = s.threads;
  o.backend = backend_of_c(s.backend, "options.backend");
  o.k_scale = optional_view<ConstTensorView>(s.k_scale, "options.k_scale");
  o.v_scale = optional_view<ConstTensorView>(s.v_scale, "options.v_scale");
}

// Writes an output struct: the caller's struct_size must hold ours; bytes past ours are zeroed.
template <class S>
void write_out(S* out, const S& value, const char* name) {
  require(out, name);
  if (out->struct_size < sizeof(S))
    throw VersionError{name, "struct_size " + std::to_string(out->struct_size) + " is smaller than this library's " +
                                 std::to_string(sizeof(S))};
  const std::size_t size = out->struct_size;
  std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(S), 0, size - sizeof(S));
  *out = value;
  out->struct_size = size;
}

// A sequence batch given by pointer: required, its struct checked.
template <class View>
View seq_of(const simdattn_seq* p, const char* name) {
  const simdattn_seq& s = checked(p, name);
  if (s.data == nullptr) throw Error(name, "expected data, got NULL");
  View v;
  v.data = s.data;
  v.dtype = dtype_of_c(s.dtype, std::string(name) + ".dtype");
  v.B = s.batch, v.S = s.seq, v.E = s.width;
  return v;
}

// The C++ MhaOptions of an options struct (NULL: the defaults).
MhaOptions mha_options(const simdattn_mha_options* c);

}  // namespace simdattn::c_api
