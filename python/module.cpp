// The Python package `simdattn`'s compiled part, simdattn._simdattn (pybind11): attention, linear
// attention, the MHA layer and its KV caches over NumPy arrays and any object with __dlpack__
// (torch tensors). Arrays are read and written in place through their strides (no copy)
// wherever the C++ API takes strided views; every call releases the GIL while it computes;
// errors raise simdattn.Error (a ValueError) whose `argument` names the argument at fault.
#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "module.hpp"
#include "simdattn/simdattn.hpp"

namespace py = pybind11;
using namespace simdattn;

PYBIND11_MODULE(_simdattn, m) {
  m.doc() =
      "simdattn: SIMD-optimized CPU attention for transformer inference.\n\n"
      "attention() and linear_attention() read and write NumPy arrays and DLPack tensors (torch)\n"
      "in place through their strides (float32, float64, float16, and bfloat16 tensors; dtype='bf16'\n"
      "computes in bfloat16 from float arrays); outputs are of the inputs' kind.\n"
      "MultiHeadAttention is torch.nn.MultiheadAttention's layer (batch_first), with a KvCache\n"
      "for incremental decoding. Every call releases the GIL while it computes; invalid input\n"
      "raises simdattn.Error (a ValueError) whose .argument names the argument at fault.";

  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // The C++ API names option fields (options.mask, config.heads); here they are keyword
      // arguments of the same name.
      std::string argument = e.argument(), message = e.what();
      for (const std::string prefix : {"options.", "config."}) {
        if (argument.rfind(prefix, 0) == 0) argument.erase(0, prefix.size());
        if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
      }
      py::object err = py::reinterpret_borrow<py::object>(error.ptr())(message);
      err.attr("argument") = argument;
      PyErr_SetObject(error.ptr(), err.ptr());
    }
  });
  error.attr("__module__") = "simdattn";
  error.attr("__doc__") = "Invalid input to a simdattn call; .argument names the argument (or file) at fault.";

  m.attr("__version__") = kVersionString;
  m.def("set_verbose", &set_verbose, py::arg("on"),
        "Verbose mode on or off: one 'simdattn: op=... key=value ...' line per call on stderr (as "
        "SIMDATTN_VERBOSE=1 in the environment; docs/design.md, 'Verbose mode').");
  m.def("verbose", &verbose, "Whether verbose mode is on.");

  python::bind_array(m);
  python::bind_attention(m);
  python::bind_layer(m);
  python::bind_linear_layer(m);
  python::bind_paged(m);
}
