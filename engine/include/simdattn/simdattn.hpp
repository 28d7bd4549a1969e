// Umbrella header: the whole public API. Benchmarking aids are in simdattn/bench.hpp.
#pragma once

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"
#include "simdattn/gated_delta_net.hpp"
#include "simdattn/kv_pool.hpp"
#include "simdattn/linear.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/rope.hpp"
#include "simdattn/npy.hpp"
#include "simdattn/paged.hpp"
#include "simdattn/runtime.hpp"
#include "simdattn/safetensors.hpp"
#include "simdattn/pool_scheduler.hpp"
#include "simdattn/scheduler.hpp"
#include "simdattn/tensor.hpp"
#include "simdattn/version.hpp"
