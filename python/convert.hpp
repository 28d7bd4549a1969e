// The Python module's conversions: NumPy dtypes and strides, 8-bit codes and their scales, layer
// inputs, and the keyword arguments' Python values to the C++ options. Shared by the bindings.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "array.hpp"
#include "simdattn/simdattn.hpp"

namespace simdattn::python {

namespace py = pybind11;

// The dtype of a NumPy array as the library names it; Error(name) for any other.
inline DType dtype_of_array(const py::array& a, const std::string& name) {
  const py::dtype d = a.dtype();
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'f' && size == 2) return DType::f16;
  if ((kind == 'b' || kind == 'u') && size == 1) return DType::u8;
  if (kind == 'i' && size == 1) return DType::int8;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  throw Error(name, "expected an array of float32, float64, float16, bool/uint8 or int8, got dtype " +
                        d.attr("name").cast<std::string>());
}

// Element strides of `a` (its byte strides divided by the item size): Error(name) for a negative
// or unaligned stride, which a view cannot express without a copy.
inline std::vector<std::int64_t> element_strides(const py::array& a, const std::string& name) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(a.ndim()));
  const auto item = static_cast<std::int64_t>(a.itemsize());
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    const auto b = static_cast<std::int64_t>(a.strides(i));
    if (b < 0 || b % item != 0)
      throw Error(name, "stride " + std::to_string(b) + " bytes of axis " + std::to_string(i) +
                            " is negative or not a multiple of the item size " + std::to_string(item) +
                            " (a view cannot express it; pass a copy, e.g. numpy.ascontiguousarray)");
    s[static_cast<std::size_t>(i)] = b / item;
  }
  return s;
}

inline std::string string_arg(const py::handle& h, const std::string& name) {
  if (!py::isinstance<py::str>(h)) throw Error(name, "expected a string");
  return h.cast<std::string>();
}

inline Backend backend_of(const std::string& s) {
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn})
    if (s == backend_name(b)) return b;
  throw Error("backend", "expected 'reference', 'native' or 'onednn', got '" + s + "'");
}

// causal: None/False (none), True or "top_left", "bottom_right", "none".
inline Causal causal_of(const py::object& c) {
  if (c.is_none()) return Causal::none;
  if (py::isinstance<py::bool_>(c)) return c.cast<bool>() ? Causal::top_left : Causal::none;
  const std::string s = string_arg(c, "causal");
  if (s == "none") return Causal::none;
  if (s == "top_left" || s == "top-left") return Causal::top_left;
  if (s == "bottom_right" || s == "bottom-right") return Causal::bottom_right;
  throw Error("causal", "expected None, a bool, 'none', 'top_left' or 'bottom_right', got '" + s + "'");
}

// A file or directory path: a str, bytes or os.PathLike (pathlib.Path), as os.fsdecode reads it.
inline std::string path_arg(const py::object& o, const char* name) {
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  try {
    return py::module_::import("os").attr("fsdecode")(o).cast<std::string>();
  } catch (const py::error_already_set&) {
    throw Error(name, "expected a path (str, bytes or os.PathLike), got " +
                          py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>());
  }
}

// A 1-D sequence (array, tensor, list) of T; for integral T, of integers (or bools) only: floats
// refused, not truncated (an empty sequence has no entries to be anything).
template <class T>
std::vector<T> vector_of(const py::object& o, const std::string& name) {
  if (o.is_none()) return {};
  if constexpr (std::is_integral_v<T>) {
    const py::array raw = py::array::ensure(o);
    const char kind = raw ? raw.dtype().kind() : 'i';
    if (raw && raw.size() > 0 && kind != 'i' && kind != 'u' && kind != 'b')
      throw Error(name, "expected integers, got dtype " + raw.dtype().attr("name").cast<std::string>());
  }
  try {
    const py::array_t<T, py::array::c_style | py::array::forcecast> a(o);
    if (a.ndim() != 1) throw Error(name, "expected a sequence (1-D), got " + std::to_string(a.ndim()) + "-D");
    return std::vector<T>(a.data(), a.data() + a.size());
  } catch (const py::error_already_set&) {
    throw Error(name, "expected a sequence of numbers");
  }
}

inline std::optional<Window> window_of(const py::object& w) {
  if (w.is_none()) return std::nullopt;
  std::vector<std::int64_t> v;
  try {
    v = w.cast<std::vector<std::int64_t>>();
  } catch (const py::cast_error&) {
    throw Error("window", "expected (left, right), -1 for an unbounded side");
  }
  if (v.size() != 2) throw Error("window", "expected (left, right), got " + std::to_string(v.size()) + " values");
  return Window{v[0], v[1]};
}

inline DType dtype_named(const std::string& s, const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    if (s == dtype_name(t)) return t;
  if (s == "float32") return DType::f32;
  if (s == "float64") return DType::f64;
  if (s == "float16") return DType::f16;
  if (s == "bfloat16") return DType::bf16;
  throw Error(name, "expected 'f32', 'f64', 'bf16' or 'f16', got '" + s + "'");
}

// An 8-bit K/V code dtype by name: 'int8', 'fp8_e4m3' or 'fp8_e5m2'.
inline DType code_dtype_named(const py::object& o, const std::string& name) {
  const std::string s = string_arg(o, name);
  for (DType t : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2})
    if (s == dtype_name(t)) return t;
  throw Error(name, "expected 'int8', 'fp8_e4m3' or 'fp8_e5m2', got '" + s + "'");
}

// The view of an array of 8-bit codes of dtype `code`: int8 arrays for int8, uint8 arrays (the
// bits) for the fp8 formats.
inline ConstTensorView code_view_of(const Array& a, DType code, const std::string& name) {
  ConstTensorView v = const_view(a, name);
  const DType want = code == DType::int8 ? DType::int8 : DType::u8;
  if (v.dtype != want)
    throw Error(name, std::string("expected ") + (code == DType::int8 ? "an int8" : "a uint8") + " array of " +
                          std::string(dtype_name(code)) + " codes, got dtype " + a.dtype_text());
  v.dtype = code;
  return v;
}

// A 4-D view [a, b, c, 1] of a 3-D f32 array [a, b, c] (the scales of codes [a, b, c, D]).
inline ConstTensorView scale_view_of(const Array& a, const std::string& name) {
  if (a.ndim() != 3) throw Error(name, "expected a 3-D float32 array (the codes' shape without D), got " + std::to_string(a.ndim()) + "-D");
  ConstTensorView v(a.data, a.dtype, Shape4{a.shape[0], a.shape[1], a.shape[2], 1},
                    Shape4{a.strides[0], a.strides[1], a.strides[2], 1});
  if (v.data == nullptr) v.data = &a;  // an empty array: never read
  return v;
}

// kv_dtype, k_scale and v_scale of attention() and attention_paged(): with kv_dtype, k and v
// (named kname, vname) are its codes, viewed into kv and vv, and both scales ([..] float32 of the
// codes' shape without D, written scale_shape in messages) are required and set into o (their
// Arrays kept in `scales`); without it, neither scale may be given (kv and vv are left to the caller).
template <class Options>
void set_kv_codes(const py::object& kv_dtype, const Array& k, const Array& v, const char* kname, const char* vname,
                  const py::object& k_scale, const py::object& v_scale, const char* scale_shape, ConstTensorView& kv,
                  ConstTensorView& vv, std::vector<Array>& scales, Options& o) {
  if (kv_dtype.is_none()) {
    if (!k_scale.is_none() || !v_scale.is_none())
      throw Error(k_scale.is_none() ? "v_scale" : "k_scale", "given without kv_dtype (scales go with 8-bit K and V codes)");
    return;
  }
  const DType code = code_dtype_named(kv_dtype, "kv_dtype");
  kv = code_view_of(k, code, kname), vv = code_view_of(v, code, vname);
  for (const auto& [scale, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}})
    if (scale->is_none()) throw Error(name, std::string("required with kv_dtype (float32 ") + scale_shape + ")");
  scales = {array_of(k_scale, "k_scale"), array_of(v_scale, "v_scale")};
  o.k_scale = scale_view_of(scales[0], "k_scale");
  o.v_scale = scale_view_of(scales[1], "v_scale");
}

inline std::optional<DType> optional_dtype(const py::object& o, const std::string& name) {
  if (o.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(o)) return dtype_named(o.cast<std::string>(), name);
  const std::string text = py::str(o);  // torch's dtypes print as torch.float32, torch.bfloat16, ...
  if (text.rfind("torch.", 0) == 0) return dtype_named(text.substr(6), name);
  return dtype_named(py::dtype::from_args(o).attr("name").cast<std::string>(), name);
}

// A cache's dtype (KvCache, KvPool): optional_dtype's, or 'int8', 'fp8_e4m3', 'fp8_e5m2'.
inline std::optional<DType> cache_dtype_of(const py::object& o, const std::string& name) {
  if (py::isinstance<py::str>(o)) {
    const std::string s = o.cast<std::string>();
    if (s == "int8" || s == "fp8_e4m3" || s == "fp8_e5m2") return code_dtype_named(o, name);
  }
  return optional_dtype(o, name);
}

inline py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::f32: return py::dtype("float32");
    case DType::f64: return py::dtype("float64");
    case DType::f16: return py::dtype("float16");
    case DType::u8: return py::dtype("uint8");
    case DType::i32: return py::dtype("int32");
    case DType::i64: return py::dtype("int64");
    case DType::bf16: return py::dtype("float32");  // returned converted
    case DType::int8: return py::dtype("int8");
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return py::dtype("uint8");  // fp8 codes: uint8 holding the bits
  }
  return py::dtype("float32");
}

// A [B, S, E] sequence batch of the layer's dtype `t`: the array itself when it already is one
// (C-contiguous), else a C-contiguous copy (bf16 layers: float arrays rounded to bf16).
struct SeqInput {
  Array array;
  Converted copy;
  ConstSeqView view;
};

inline SeqInput seq_input(const Array& a, DType t, const char* name) {
  if (a.ndim() != 3) throw Error(name, "expected a 3-D array [B, S, E], got " + std::to_string(a.ndim()) + "-D");
  if (t != DType::bf16 && a.dtype != t)
    throw Error(name, "expected the layer's dtype " + std::string(dtype_name(t)) + ", got " + a.dtype_text());
  SeqInput s;
  s.array = a;
  s.view.data = a.data, s.view.dtype = t, s.view.B = a.shape[0], s.view.S = a.shape[1], s.view.E = a.shape[2];
  if (a.dtype != t || !a.c_contiguous()) {
    s.copy = converted(a, t, name);
    s.view.data = s.copy.array.data;
  }
  if (s.view.data == nullptr) s.view.data = &s;
  return s;
}

// The dtype of a layer's outputs for `query`: the layer's, but float32 for a bf16 layer given
// float arrays of another dtype (NumPy has no bfloat16: a bf16 layer takes and returns float32).
inline DType layer_output_dtype(DType layer, const Array& query) {
  return layer == DType::bf16 && query.dtype != DType::bf16 ? DType::f32 : layer;
}

}  // namespace simdattn::python
