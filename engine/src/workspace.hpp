// Per-thread scratch buffers: grown once and reused, so a call allocates nothing once a thread
// has seen its size. 64-byte aligned for the micro-kernels' aligned panel loads.
#pragma once

#include <cstddef>
#include <new>

namespace simdattn::detail {

template <class T>
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
      data = static_cast<T*>(::operator new((n * sizeof(T) + 63) / 64 * 64, kAlign, std::nothrow));
      if (data == nullptr) {
        capacity = 0;  // a later, smaller request must not get the freed buffer
        throw std::bad_alloc();
      }
      capacity = n;
    }
    return data;
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  void release() noexcept {
    if (data != nullptr) ::operator delete(data, kAlign);
    data = nullptr;
    capacity = 0;
  }
};

// Slots of the calling thread's buffers, one set per dtype. A caller may hold one slot while
// calling code that uses another (the attention kernels call the GEMM).
enum BufferSlot : int {
  kGemmPackedB = 0,
  kGemmPackedA = 1,  // packed A block + an edge tile
  kAttention = 2,    // the fused attention kernel's blocks and packed K^T / V
};

template <class T, int kSlot>
AlignedBuffer<T>& thread_buffer() {
  thread_local AlignedBuffer<T> buffer;
  return buffer;
}

}  // namespace simdattn::detail
