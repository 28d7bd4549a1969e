// Array arguments from NumPy and DLPack, and outputs of the inputs' kind (array.hpp).
#include "array.hpp"

#include <dlpack/dlpack.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "convert.hpp"

namespace simdattn::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr std::uint8_t kDLBoolCode = 6;  // DLPack >= 0.8's kDLBool (Debian's header is 0.6)

DType dtype_of_dlpack(const DLDataType& t, const std::string& name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 64) return DType::f64;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if ((t.code == kDLUInt || t.code == kDLBoolCode) && t.bits == 8) return DType::u8;
    if (t.code == kDLInt && t.bits == 8) return DType::int8;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
  }
  throw Error(name, "expected a tensor of float32, float64, float16, bfloat16, bool/uint8, int8, int32 or int64, got "
                    "DLPack type code " + std::to_string(t.code) + " of " + std::to_string(t.bits) + " bits x " +
                        std::to_string(t.lanes) + " lanes");
}

DLDataType dlpack_of(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f64: return {kDLFloat, 64, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::int8: return {kDLInt, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    default: return {kDLUInt, 8, 1};  // u8 and the fp8 codes' bits
  }
}

Array numpy_array(const py::array& a, const std::string& name) {
  Array r;
  r.owner = a;
  r.data = const_cast<void*>(a.data());
  r.dtype = dtype_of_array(a, name);
  r.shape.assign(a.shape(), a.shape() + a.ndim());
  r.strides = element_strides(a, name);
  r.writeable = a.writeable();
  r.kind = py::none();
  return r;
}

// The module that makes arrays of o's kind: the top package of its type (torch for
// torch.Tensor), when it has from_dlpack; None (NumPy) otherwise.
py::object kind_of(const py::handle& o) {
  const std::string module = py::str(py::type::handle_of(o).attr("__module__"));
  const std::string top = module.substr(0, module.find('.'));
  try {
    py::object m = py::module_::import(top.c_str());
    if (py::hasattr(m, "from_dlpack")) return m;
  } catch (const py::error_already_set&) {
  }
  return py::none();
}

// torch's own DLPack entry points, once the process has imported torch (simdattn never imports
// it): torch._C._to_dlpack and _from_dlpack skip Tensor.__dlpack__'s and from_dlpack's Python
// layers (a few microseconds a tensor on every call). Looked up under the GIL; kept for the
// process's life (never released: the interpreter may be finalizing when statics are).
struct Torch {
  PyObject* module = nullptr;
  PyObject* tensor = nullptr;
  PyObject* to_dlpack = nullptr;
  PyObject* from_dlpack = nullptr;
};

const Torch* torch_if_imported() {
  static Torch t;
  if (t.module != nullptr) return &t;
  PyObject* m = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (m == nullptr) return nullptr;
  try {
    py::handle torch(m);
    py::object tensor = torch.attr("Tensor"), c = torch.attr("_C");
    py::object to = c.attr("_to_dlpack"), from = c.attr("_from_dlpack");
    t.tensor = tensor.release().ptr(), t.to_dlpack = to.release().ptr(), t.from_dlpack = from.release().ptr();
    t.module = py::reinterpret_borrow<py::object>(torch).release().ptr();
  } catch (const py::error_already_set&) {
    return nullptr;  // torch still importing, or another torch: the generic protocol serves
  }
  return &t;
}

// An Array over a DLPack capsule (taken from an object of kind `kind`).
Array capsule_array(py::object capsule, py::object kind, const std::string& name) {
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  if (managed == nullptr) {
    PyErr_Clear();
    throw Error(name, "__dlpack__ did not return a 'dltensor' capsule");
  }
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    throw Error(name, "expected a tensor in CPU memory, got DLPack device type " + std::to_string(t.device.device_type));
  Array r;
  r.owner = std::move(capsule);
  r.dtype = dtype_of_dlpack(t.dtype, name);
  r.data = static_cast<char*>(t.data) + t.byte_offset;
  r.shape.assign(t.shape, t.shape + t.ndim);
  r.strides.resize(static_cast<std::size_t>(t.ndim));
  for (int i = t.ndim - 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    if (t.strides != nullptr) r.strides[u] = t.strides[u];
    else r.strides[u] = u + 1 == r.shape.size() ? 1 : r.strides[u + 1] * r.shape[u + 1];
    if (r.strides[u] < 0)
      throw Error(name, "stride " + std::to_string(r.strides[u]) + " of axis " + std::to_string(i) +
                            " is negative (a view cannot express it; pass a copy, e.g. .contiguous())");
  }
  // DLPack before 1.0 has no read-only flag: a tensor that hands out its memory lets it be written.
  r.writeable = true;
  r.kind = std::move(kind);
  return r;
}

Array dlpack_array(const py::handle& o, const std::string& name) {
  const py::tuple device = o.attr("__dlpack_device__")();
  const int device_type = device[0].cast<int>();
  if (device_type != kDLCPU && device_type != kDLCUDAHost)
    throw Error(name, "expected a tensor in CPU memory, got DLPack device type " + std::to_string(device_type));
  return capsule_array(o.attr("__dlpack__")(), kind_of(o), name);
}

// Memory this module allocated for an output, as a DLManagedTensor.
struct Owned {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  void* data = nullptr;
  ~Owned() { std::free(data); }
};

void delete_owned(DLManagedTensor* m) { delete static_cast<Owned*>(m->manager_ctx); }

// A capsule's destructor: a capsule nobody consumed (still named "dltensor") frees its tensor.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (m == nullptr) {
    PyErr_Clear();
    return;
  }
  if (m->deleter != nullptr) m->deleter(m);
}

// What new_array hands to a producer's from_dlpack: an object with __dlpack__ and
// __dlpack_device__, over memory allocated here, taken once.
struct Export {
  py::object capsule;
};

py::object export_capsule(DType dtype, const std::vector<std::int64_t>& shape) {
  auto owned = std::make_unique<Owned>();
  owned->shape = shape;
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  owned->data = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);  // never null for 0 elements
  if (owned->data == nullptr) throw std::bad_alloc();
  DLTensor& t = owned->managed.dl_tensor;
  t.data = owned->data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int>(shape.size());
  t.dtype = dlpack_of(dtype);
  t.shape = owned->shape.data();
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  owned->managed.manager_ctx = owned.get();
  owned->managed.deleter = delete_owned;
  PyObject* c = PyCapsule_New(&owned->managed, kCapsuleName, capsule_destructor);
  if (c == nullptr) throw py::error_already_set();
  owned.release();  // the capsule (then its consumer) owns it now
  return py::reinterpret_steal<py::object>(c);
}

ConstTensorView view4(const Array& a, const std::string& name, int min_ndim) {
  if (a.ndim() < min_ndim || a.ndim() > 4)
    throw Error(name, "expected a " + (min_ndim == 4 ? std::string("4-D") : std::to_string(min_ndim) + "-D to 4-D") +
                          " array, got " + std::to_string(a.ndim()) + "-D");
  ConstTensorView v;
  v.data = a.data;
  v.dtype = a.dtype;
  const int pad = 4 - a.ndim();
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i < pad ? 1 : a.shape[static_cast<std::size_t>(i - pad)];
    v.strides[i] = i < pad ? 0 : a.strides[static_cast<std::size_t>(i - pad)];
  }
  if (v.data == nullptr) v.data = &a;  // an empty array: never read
  return v;
}

double load(const void* p, DType t) {
  switch (t) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::f64: return *static_cast<const double*>(p);
    case DType::f16: return to_float(*static_cast<const float16*>(p));
    case DType::bf16: return to_float(*static_cast<const bfloat16*>(p));
    default: return 0;
  }
}

void store(void* p, DType t, double x) {
  switch (t) {
    case DType::f32: *static_cast<float*>(p) = static_cast<float>(x); break;
    case DType::f64: *static_cast<double*>(p) = x; break;
    case DType::f16: *static_cast<float16*>(p) = to_float16(x); break;
    case DType::bf16: *static_cast<bfloat16*>(p) = to_bfloat16(x); break;
    default: break;
  }
}

// dst[i] = src[i] over an n-D index (element strides), converted between the float dtypes.
void copy_elements(const void* src, DType st, const std::int64_t* ss, void* dst, DType dt, const std::int64_t* ds,
                   const std::int64_t* shape, int n) {
  for (int i = 0; i < n; ++i)
    if (shape[i] == 0) return;
  const auto is = static_cast<std::int64_t>(dtype_size(st)), os = static_cast<std::int64_t>(dtype_size(dt));
  std::vector<std::int64_t> index(static_cast<std::size_t>(n), 0);
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  const std::int64_t inner = n == 0 ? 1 : shape[n - 1], si = n == 0 ? 0 : ss[n - 1], di = n == 0 ? 0 : ds[n - 1];
  for (;;) {
    std::int64_t so = 0, dof = 0;
    for (int i = 0; i + 1 < n; ++i) so += index[static_cast<std::size_t>(i)] * ss[i], dof += index[static_cast<std::size_t>(i)] * ds[i];
    for (std::int64_t j = 0; j < inner; ++j) {
      const char* from = s + (so + j * si) * is;
      char* to = d + (dof + j * di) * os;
      if (st == dt) std::memcpy(to, from, static_cast<std::size_t>(is));
      else store(to, dt, load(from, st));
    }
    int i = n - 2;
    for (; i >= 0; --i) {
      if (++index[static_cast<std::size_t>(i)] < shape[i]) break;
      index[static_cast<std::size_t>(i)] = 0;
    }
    if (i < 0) return;
  }
}

bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

}  // namespace

std::int64_t Array::size() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

bool Array::c_contiguous() const {
  std::int64_t expect = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    if (shape[u] != 1 && strides[u] != expect) return false;
    expect *= shape[u];
  }
  return true;
}

std::string Array::dtype_text() const {
  if (is_numpy()) return py::str(owner.attr("dtype").attr("name"));
  return std::string(dtype_name(dtype));
}

Array array_of(const py::handle& o, const std::string& name) {
  if (py::isinstance<py::array>(o)) return numpy_array(py::reinterpret_borrow<py::array>(o), name);
  const Torch* torch = torch_if_imported();
  const bool is_torch = torch != nullptr && PyObject_TypeCheck(o.ptr(), reinterpret_cast<PyTypeObject*>(torch->tensor));
  if (is_torch || (py::hasattr(o, "__dlpack__") && py::hasattr(o, "__dlpack_device__"))) {
    try {
      if (!is_torch) return dlpack_array(o, name);
      PyObject* capsule = PyObject_CallOneArg(torch->to_dlpack, o.ptr());
      if (capsule == nullptr) throw py::error_already_set();
      return capsule_array(py::reinterpret_steal<py::object>(capsule), py::reinterpret_borrow<py::object>(torch->module),
                           name);
    } catch (const py::error_already_set& e) {
      // torch 1.x refuses to export bool tensors: NumPy reads them (through __array__)
      const py::array a = py::array::ensure(o);
      if (a) return numpy_array(a, name);
      throw Error(name, std::string("could not read it through DLPack: ") + e.what());
    }
  }
  const py::array a = py::array::ensure(o);
  if (!a) throw Error(name, "expected an array (NumPy, an object with __dlpack__, or a nested sequence), got " +
                                std::string(py::str(py::type::handle_of(o).attr("__name__"))));
  return numpy_array(a, name);
}

py::object new_array(const Array& like, DType dtype, const std::vector<std::int64_t>& shape) {
  if (like.is_numpy()) {
    if (dtype == DType::bf16) throw Error("out", "NumPy has no bfloat16");
    return py::array(numpy_dtype(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()));
  }
  const Torch* torch = torch_if_imported();
  if (torch != nullptr && like.kind.ptr() == torch->module) {
    PyObject* t = PyObject_CallOneArg(torch->from_dlpack, export_capsule(dtype, shape).ptr());
    if (t == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(t);
  }
  return like.kind.attr("from_dlpack")(Export{export_capsule(dtype, shape)});
}

ConstTensorView const_view(const Array& a, const std::string& name, int min_ndim) { return view4(a, name, min_ndim); }

TensorView mutable_view(const Array& a, const std::string& name, int min_ndim) {
  if (!a.writeable) throw Error(name, "expected a writeable array");
  const ConstTensorView c = view4(a, name, min_ndim);
  TensorView v;
  v.data = const_cast<void*>(c.data), v.dtype = c.dtype, v.shape = c.shape, v.strides = c.strides;
  return v;
}

void copy_converted(const ConstTensorView& src, const TensorView& dst) {
  copy_elements(src.data, src.dtype, src.strides.data(), dst.data, dst.dtype, dst.strides.data(), src.shape.data(), 4);
}

Converted converted(const Array& a, DType t, const std::string& name) {
  if (t != a.dtype && !(is_float(a.dtype) && is_float(t)))
    throw Error(name, "expected a float array (float32, float64, float16 or bfloat16), got " + a.dtype_text());
  Converted c;
  c.bytes.resize(static_cast<std::size_t>(a.size()) * dtype_size(t) + 1);
  c.array.data = c.bytes.data();
  c.array.dtype = t;
  c.array.shape = a.shape;
  c.array.strides.resize(a.shape.size());
  std::int64_t step = 1;
  for (int i = a.ndim() - 1; i >= 0; --i) c.array.strides[static_cast<std::size_t>(i)] = step, step *= a.shape[static_cast<std::size_t>(i)];
  c.array.kind = a.kind;
  copy_elements(a.data, a.dtype, a.strides.data(), c.array.data, t, c.array.strides.data(), a.shape.data(), a.ndim());
  return c;
}

Output output_of(const py::object& out, const Array& like, DType array_dtype, DType call_dtype,
                 const std::vector<std::int64_t>& shape, bool contiguous, const std::string& name) {
  Output o;
  const int ndim = static_cast<int>(shape.size());
  if (out.is_none()) {
    o.object = new_array(like, array_dtype, shape);
    o.array = array_of(o.object, name);
  } else {
    o.object = out;
    o.array = array_of(out, name);
    std::string want = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    want += "]";
    if (o.array.shape != shape) throw Error(name, "expected shape " + want);
    if (o.array.dtype != array_dtype)
      throw Error(name, "expected dtype " + std::string(dtype_name(array_dtype)) + ", got " + o.array.dtype_text());
    if (contiguous && !o.array.c_contiguous()) throw Error(name, "expected a C-contiguous array");
  }
  o.target = mutable_view(o.array, name, ndim);
  o.view = o.target;
  if (call_dtype != array_dtype) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    o.scratch.resize(static_cast<std::size_t>(n) * dtype_size(call_dtype) + 1);
    o.view = TensorView(o.scratch.data(), call_dtype, o.target.shape);
  }
  return o;
}

void bind_array(py::module_& m) {
  py::class_<Export>(m, "_DLPackExport", "An output's memory on its way to a producer's from_dlpack (taken once).")
      .def("__dlpack__", [](Export& e, const py::args&, const py::kwargs&) {
        if (e.capsule.is_none()) throw Error("__dlpack__", "this export was taken already");
        py::object c = e.capsule;
        e.capsule = py::none();
        return c;
      })
      .def("__dlpack_device__", [](const Export&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); });
  m.def("_array_view", [](const py::object& o) {
    const Array a = array_of(o, "x");
    return py::make_tuple(reinterpret_cast<std::uintptr_t>(a.data), std::string(dtype_name(a.dtype)), a.shape, a.strides);
  }, py::arg("x"), "(data address, dtype, shape, element strides) of the memory a call reads for x (no copy: tests show it).");
}

}  // namespace simdattn::python
