// The Python module's array arguments: NumPy arrays and any object with __dlpack__ (torch tensors,
// NumPy >= 1.22, ...), read and written in place through their strides; new arrays made of the
// kind the inputs are (a torch tensor for torch inputs); element copies between the float dtypes.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"

namespace simdattn::python {

namespace py = pybind11;

// An array argument, viewed in place. `owner` keeps the memory alive: the NumPy array, or the
// DLPack capsule taken from the object (its deleter runs when the last reference to it goes;
// the object itself is the caller's, alive for the call).
struct Array {
  py::object owner;
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape, strides;  // strides in elements, each >= 0
  bool writeable = true;
  // The module whose from_dlpack makes outputs of this array's kind (torch, ...); None: NumPy.
  py::object kind;

  int ndim() const { return static_cast<int>(shape.size()); }
  std::int64_t size() const;
  bool c_contiguous() const;
  bool is_numpy() const { return kind.is_none(); }
  // The dtype as the array's own library names it (e.g. "float32", "torch.bfloat16").
  std::string dtype_text() const;
};

// `o` as an Array: a NumPy array as it is; an object with __dlpack__ through it (CPU memory:
// kDLCPU or kDLCUDAHost; f32, f64, f16, bf16, u8/bool, int8, i32, i64); anything else that
// numpy.asarray takes (nested sequences, objects with __array__, torch's bool tensors, which
// its DLPack export refuses) as a NumPy array. Error(name) for any other object, a dtype the
// library has no name for, or a negative stride.
Array array_of(const py::handle& o, const std::string& name);

// A new C-contiguous array of `dtype` and `shape` of `like`'s kind: a NumPy array, or the
// producer's from_dlpack over memory allocated here (freed when that array goes). bf16 has no
// NumPy dtype: asking NumPy for one is an Error (the callers return float32 there).
py::object new_array(const Array& like, DType dtype, const std::vector<std::int64_t>& shape);

// The 4-D views of an Array (fewer dimensions, at least min_ndim: leading axes of size 1, as
// broadcast masks are read). Error(name) for another number of dimensions, or, for TensorView,
// a read-only array.
ConstTensorView const_view(const Array& a, const std::string& name, int min_ndim = 4);
TensorView mutable_view(const Array& a, const std::string& name, int min_ndim = 4);

// dst = src element by element, each value converted between f32, f64, f16 and bf16 (rounded to
// nearest even; through f64 so a f64 source rounds once). Shapes must be equal.
void copy_converted(const ConstTensorView& src, const TensorView& dst);

// A C-contiguous copy of `a` (any number of dimensions) in the float dtype `t`, described by
// `array` (its views read the copy).
struct Converted {
  std::vector<std::uint8_t> bytes;  // the elements, aligned for any float dtype
  Array array;
};
Converted converted(const Array& a, DType t, const std::string& name);

// An output: the array returned (the caller's `out=` or a new one of the inputs' kind) and the
// view the call writes: the array itself, or, where the call computes in another dtype than the
// array holds (bf16 results returned as float32), a scratch of the call's dtype that finish()
// copies into the array. Error(name) for a given array of another shape or dtype, read-only,
// or (contiguous) not C-contiguous.
struct Output {
  py::object object;
  Array array;
  std::vector<std::uint8_t> scratch;
  TensorView view;    // what the call writes (4-D, leading axes of size 1)
  TensorView target;  // the array's own view
  void finish() const {
    if (!scratch.empty()) copy_converted(view, target);
  }
};
Output output_of(const py::object& out, const Array& like, DType array_dtype, DType call_dtype,
                 const std::vector<std::int64_t>& shape, bool contiguous = false, const std::string& name = "out");

// Registers the DLPack export object new_array hands to from_dlpack (module.cpp calls it).
void bind_array(py::module_& m);

}  // namespace simdattn::python
