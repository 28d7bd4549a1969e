// The Python module's parts (module.cpp defines the module and calls each).
#pragma once

#include <pybind11/pybind11.h>

namespace simdattn::python {

void bind_array(pybind11::module_& m);      // array.cpp (the DLPack export of outputs)
void bind_attention(pybind11::module_& m);  // attention.cpp
void bind_layer(pybind11::module_& m);      // layer.cpp
void bind_linear_layer(pybind11::module_& m);  // linear_layer.cpp (GatedDeltaNet)
void bind_paged(pybind11::module_& m);      // paged.cpp (after bind_layer: it adds MultiHeadAttention.forward_pool)

}  // namespace simdattn::python
