// Umbrella header.
#pragma once

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/npy.hpp"
#include "simdattn/runtime.hpp"
#include "simdattn/safetensors.hpp"
#include "simdattn/tensor.hpp"
#include "simdattn/version.hpp"
#include "simdattn/workloads.hpp"
