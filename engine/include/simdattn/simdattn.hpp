// Umbrella header.
#pragma once

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/npy.hpp"
#include "simdattn/runtime.hpp"
#include "simdattn/tensor.hpp"
#include "simdattn/version.hpp"
#include "simdattn/workloads.hpp"
