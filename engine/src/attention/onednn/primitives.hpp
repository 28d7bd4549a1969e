// The onednn backend's primitives (onednn.cpp): one step's three primitives (QK matmul with its
// scale, softcap and mask post-ops, softmax, PV matmul), created once per step geometry and
// cached for the process.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <memory>

namespace simdattn::detail::onednn_attention {

using dnnl::memory;

// Strides of a [heads, rows, inner] view of one batch (elements).
struct ViewStrides {
  std::int64_t head = 0, row = 0, inner = 0;
  bool operator==(const ViewStrides&) const = default;
};

// Everything one step's primitives depend on.
struct StepKey {
  std::int64_t heads = 0, kv_heads = 0;  // query heads of the step, K/V heads it reads (1 or heads)
  std::int64_t rows = 0, keys = 0;       // query rows, keys handed to oneDNN
  std::int64_t D = 0, Dv = 0;
  ViewStrides q, k, v, out;
  std::int64_t mask_heads = 0, mask_rows = 0;  // the mask's [heads, rows, keys]; 0: no mask
  std::uint32_t scale_bits = 0;                // the f32 scale
  std::uint32_t softcap_bits = 0;              // the f32 softcap (0: none)
  int threads = 0;
  memory::data_type dt = memory::data_type::f32;  // q, k, v and out
  bool operator==(const StepKey&) const = default;
};

struct StepPrims {
  memory::desc q, kt, v, o, scores, mask;
  int mask_post_op = 0;  // the mask's index among the QK matmul's post-ops (after a softcap's two)
  memory::desc probs;  // 16-bit operands: the probabilities in their dtype, and the reorder to it
  dnnl::reorder round_probs;
  // Scratchpads are the caller's (scratchpad_mode::user): oneDNN's own is one buffer shared by
  // every primitive of the process unless the library is built for concurrent execution, and
  // Debian's is not, so two calls running at once would overwrite each other's.
  memory::desc qk_scratch, softmax_scratch, pv_scratch;
  dnnl::matmul qk;
  dnnl::softmax_forward softmax;
  dnnl::matmul pv;
};

// The primitives of a step geometry: cached (a second call with the same key creates nothing;
// the cache is cleared past kCacheCapacity geometries). Throws dnnl::error if oneDNN has none.
std::shared_ptr<const StepPrims> get_prims(const StepKey& key);

}  // namespace simdattn::detail::onednn_attention
