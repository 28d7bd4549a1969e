// The validated form of one attention_paged() call (simdattn/paged.hpp) and its two backends.
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "simdattn/paged.hpp"

namespace simdattn::detail {

struct PagedProblem {
  DType dtype = DType::f32;     // of q and out (and of the caches unless they hold codes)
  DType kv_dtype = DType::f32;  // of the caches: dtype, or 8-bit codes
  // 8-bit caches: each row's scale at k_scale[blk * s0 + slot * s1 + hk * s2] (element strides)
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  std::int64_t k_scale_strides[3] = {0, 0, 0}, v_scale_strides[3] = {0, 0, 0};
  bool kv_codes() const { return is_kv_code(kv_dtype); }
  std::int64_t N = 0, H = 0, Hkv = 0, D = 0, Dv = 0, total_q = 0;
  std::int64_t num_blocks = 0, block_size = 0;
  // Element strides: q and out over [1, total_q, H, D], the caches over [num_blocks,
  // block_size, Hkv, D].
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  Shape4 q_strides{}, k_strides{}, v_strides{}, o_strides{};
  const std::int32_t* table = nullptr;
  std::int64_t table_stride = 0;
  const std::int64_t* seq_lens = nullptr;
  // [N + 1]: the caller's, or for decode steps 0 .. N from the calling thread's buffer (a call
  // allocates nothing once a thread has seen its N)
  const std::int64_t* query_start = nullptr;
  Causal causal = Causal::bottom_right;
  bool has_window = false;
  std::int64_t window_left = -1, window_right = -1;
  double scale = 1.0, softcap = 0.0;
  const float* alibi = nullptr;
  const float* sinks = nullptr;
  int threads = 0;

  std::int64_t query_len(std::int64_t i) const { return query_start[i + 1] - query_start[i]; }
  // Block index of sequence i's key t.
  std::int64_t block_of(std::int64_t i, std::int64_t t) const { return table[i * table_stride + t / block_size]; }
  // Sequence i as a batch of one for the position rule and the score modifiers (no data).
  Problem sequence(std::int64_t i) const;
};

// Validates the arguments and builds the problem. Throws Error.
PagedProblem make_paged_problem(const ConstTensorView& q, const ConstTensorView& k_cache, const ConstTensorView& v_cache,
                                const BlockTable& block_table, std::span<const std::int64_t> seq_lens,
                                const TensorView& out, const PagedAttentionOptions& options);

// Each sequence's keys gathered into dense views, through attention()'s reference backend.
void paged_reference(const PagedProblem& p);
void paged_native(const PagedProblem& p);

}  // namespace simdattn::detail
