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
// (guarded by mha/native/llama-layer, whose q|k|v projection is 1024 x 3072 x 2048 over pre-packed B).
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

// Per-thread scratch buffers are named by slots: an empty type, one per buffer, declared by the
// layer that owns the buffer (`struct GemmPackedB : ScratchSlot {};` beside the GEMM), so that
// this header names no layer above it. thread_buffer<T, Slot>() is the calling thread's buffer
// of T for that slot. A caller may hold one slot while calling code that uses another (the
// attention kernels call the GEMM; the MHA layer calls attention and the GEMM). A slot used by
// several files is declared in a header they share, so that they share its buffer.
struct ScratchSlot {
  static constexpr bool kHugePages = false;
};
// A slot on huge pages: the GEMM's operands that span many MiB (measured; the attention paths'
// scratch is not, and would only grow its resident size).
struct HugePagesSlot {
  static constexpr bool kHugePages = true;
};

template <class T, class Slot>
AlignedBuffer<T, Slot::kHugePages>& thread_buffer() {
  thread_local AlignedBuffer<T, Slot::kHugePages> buffer;
  return buffer;
}

// x rounded up to a multiple of `to` (> 0).
constexpr std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// Elements of T in one 64-byte line: scratch parts are rounded up to it to stay aligned.
template <class T>
constexpr std::int64_t kLineElems = 64 / static_cast<std::int64_t>(sizeof(T));

}  // namespace simdattn::detail
