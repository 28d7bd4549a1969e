// Per-thread scratch buffers: grown once and reused, so a call allocates nothing once a thread
// has seen its size. 64-byte aligned for the micro-kernels' aligned panel loads; large ones on
// huge pages.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>

namespace simdattn::detail {

// Large buffers that ask for it (at least a huge page, 2 MiB) start on a huge-page boundary,
// span whole huge pages and ask the kernel for transparent huge pages (madvise: THP's "madvise"
// mode, Debian's default; only advice, so a kernel without THP changes nothing). A layer's
// pre-packed weights, the GEMM's packed A and the projections span tens of MiB, and with 4 KiB
// pages their panels, thousands of bytes apart, cost more TLB misses than the caches hide
// (1024 x 3072 x 2048 over pre-packed B, one thread: 160-162 GFLOP/s on huge pages against
// 147-153).
inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

inline bool on_huge_pages(std::size_t bytes, bool huge) noexcept { return huge && bytes >= kHugePage; }

inline std::align_val_t buffer_alignment(std::size_t bytes, bool huge) noexcept {
  return on_huge_pages(bytes, huge) ? std::align_val_t{kHugePage} : std::align_val_t{64};
}

inline std::size_t buffer_size(std::size_t bytes, bool huge) noexcept {
  const auto a = static_cast<std::size_t>(buffer_alignment(bytes, huge));
  return (bytes + a - 1) / a * a;
}

// `bytes` of storage aligned to 64 bytes (with `huge`, to a huge page from kHugePage up), or
// nullptr.
inline void* allocate_buffer(std::size_t bytes, bool huge) noexcept {
  if (bytes > std::size_t(-1) / 2) return nullptr;
  void* p = ::operator new(buffer_size(bytes, huge), buffer_alignment(bytes, huge), std::nothrow);
  if (p != nullptr && on_huge_pages(bytes, huge)) (void)madvise(p, buffer_size(bytes, huge), MADV_HUGEPAGE);
  return p;
}

// Frees what allocate_buffer(bytes, huge) returned.
inline void free_buffer(void* p, std::size_t bytes, bool huge) noexcept {
  ::operator delete(p, buffer_alignment(bytes, huge));
}

// allocate_buffer for n elements of T (nullptr also when n * sizeof(T) would overflow).
template <class T>
T* allocate_elements(std::size_t n, bool huge) noexcept {
  if (n > std::size_t(-1) / 2 / sizeof(T)) return nullptr;
  return static_cast<T*>(allocate_buffer(n * sizeof(T), huge));
}

// kHuge: large buffers go on huge pages (allocate_buffer).
template <class T, bool kHuge = false>
struct AlignedBuffer {
  T* data = nullptr;
  std::size_t capacity = 0;  // elements

  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  // At least n elements; the old contents are not kept. Throws std::bad_alloc.
  T* get(std::size_t n) {
    if (n > capacity) {
      release();
      data = allocate_elements<T>(n, kHuge);
      if (data == nullptr) {
        capacity = 0;  // a later, smaller request must not get the freed buffer
        throw std::bad_alloc();
      }
      capacity = n;
    }
    return data;
  }

 private:
  void release() noexcept {
    if (data != nullptr) free_buffer(data, capacity * sizeof(T), kHuge);
    data = nullptr;
    capacity = 0;
  }
};

// Every per-thread scratch buffer of the engine, one name each (one buffer per slot and dtype).
// A caller may hold one slot while calling code that uses another (the attention kernels call
// the GEMM; the MHA layer calls attention and the GEMM).
enum class Scratch : int {
  gemm_packed_b,        // the GEMM's packed B block
  gemm_packed_a,        // the GEMM's packed A block and an edge tile
  gemm_deep_a,          // the GEMM's deep mode: a chunk of rows of A packed over all of K
  gemm_widened_a,       // the 16-bit GEMM: rows of A widened to f32 before packing
  gemm_widened_b,       // the 16-bit GEMM: one kc x nr panel of B widened to f32 for a tall block
  gemm_amx_a,           // the 16-bit GEMM on AMX: 32 rows of A at one depth block, as tiles
  attention,            // the native attention paths' blocks, packed K^T / V, decode rows
  linear,               // the native linear-attention kernel's panels and state
  onednn_scores,        // onednn backend: scores of one step
  onednn_probs,         // onednn backend: a bf16/f16 step's probabilities, rounded for the PV matmul
  onednn_mask,          // onednn backend: the step's mask and empty-row flags
  onednn_scratchpad,    // onednn backend: oneDNN's scratchpads (bytes)
  onednn_dense_q,       // onednn backend: dense copies of inputs whose inner stride is not 1
  onednn_dense_k,
  onednn_dense_v,
  onednn_dense_out,
  mha_projection,       // MHA layer: the q|k|v projection (q alone in cross-attention)
  mha_projection_kv,    // MHA layer: the k and v projections in cross-attention
  mha_attention_out,    // MHA layer: the attention output [B, Sq, H*hd]
  mha_mask,             // MHA layer: key padding combined with an additive mask
  mha_padding_mask,     // MHA layer: key padding as a boolean mask
  mha_linear_f32,       // MHA layer, bf16/f16: a projection's f32 sums before rounding
  mha_cache_q,          // MHA layer, a cache of another dtype: q and the output in the cache's dtype
  mha_cache_out,
  mha_weights,          // MHA layer: per-head attention weights before they are averaged
  mha_batch_rows,       // MHA layer, forward_batch: the steps' query rows gathered, then the output rows
  widened_q,            // native backend, bf16/f16 operands: f32 copies of q, k, v and out
  widened_k,
  widened_v,
  widened_out,
};

// The slots on huge pages: the GEMM's operands that span many MiB (measured; the attention
// paths' scratch is not, and would only grow its resident size).
constexpr bool huge_pages_slot(Scratch slot) {
  return slot == Scratch::gemm_deep_a || slot == Scratch::mha_projection || slot == Scratch::mha_attention_out;
}

template <class T, Scratch kSlot>
AlignedBuffer<T, huge_pages_slot(kSlot)>& thread_buffer() {
  thread_local AlignedBuffer<T, huge_pages_slot(kSlot)> buffer;
  return buffer;
}

// x rounded up to a multiple of `to` (> 0).
constexpr std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// Elements of T in one 64-byte line: scratch parts are rounded up to it to stay aligned.
template <class T>
constexpr std::int64_t kLineElems = 64 / static_cast<std::int64_t>(sizeof(T));

}  // namespace simdattn::detail
