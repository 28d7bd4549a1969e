// Software prefetch of the rows a kernel will read next, spread over its arithmetic.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace simdattn::detail {

// The rows a kernel reads (or writes) next, handed out as contiguous runs of cache lines to
// the prefetching micro-kernel (GemmKernels::ukernel_a_in_place_pf), which spreads them over its
// k loop: the data then arrives in L2 while the FMA units work. (One burst of prefetches per
// call stalls on the core's line-fill buffers; with none, the passes that read the rows first
// stall on demand misses: guarded by attention/native/gpt, attention/native/sdcross and
// linear/native/long.) Rows with a non-unit inner stride are not prefetched.
class NextRows {
 public:
  template <class T>
  void add(const T* base, std::int64_t rs, std::int64_t cs, std::int64_t rows, std::int64_t cols) {
    if (cs != 1 || rows <= 0 || cols <= 0 || n_ == kStreams) return;
    Stream st{reinterpret_cast<std::uintptr_t>(base), rs * std::int64_t(sizeof(T)), cols * std::int64_t(sizeof(T)), rows};
    if (st.stride == st.bytes) {  // dense rows: one run
      st.bytes *= rows;
      st.rows = 1;
    }
    s_[n_++] = st;
  }
  struct Run {
    const void* at = nullptr;
    std::int64_t lines = 0;
  };
  // The lines a product of depth k prefetches (one per four k steps): up to k / 4 lines from the
  // cursor within one run, none once every line is handed out.
  Run take(std::int64_t k) {
    const std::int64_t lines = k / 4;
    while (cur_ < n_) {
      const Stream& st = s_[cur_];
      const std::uintptr_t row = st.base + static_cast<std::uintptr_t>(row_ * st.stride);
      const std::uintptr_t first = row >> 6, last = (row + static_cast<std::uintptr_t>(st.bytes) - 1) >> 6;
      const auto avail = static_cast<std::int64_t>(last - first + 1) - line_;
      if (avail > 0) {
        const std::int64_t n = std::min(avail, lines);
        const Run r{reinterpret_cast<const void*>((first + static_cast<std::uintptr_t>(line_)) << 6), n};
        line_ += n;
        return r;
      }
      line_ = 0;
      if (++row_ == st.rows) {
        row_ = 0;
        ++cur_;
      }
    }
    return {};
  }
  void clear() { n_ = cur_ = 0, row_ = line_ = 0; }

 private:
  // K and V rows of a key block: one run each when dense, a run per block of a paged cache
  // (128 keys in blocks of 16: 16 runs; more are not prefetched).
  static constexpr std::size_t kStreams = 16;
  struct Stream {
    std::uintptr_t base;
    std::int64_t stride, bytes, rows;
  };
  std::array<Stream, kStreams> s_{};
  std::size_t n_ = 0, cur_ = 0;
  std::int64_t row_ = 0, line_ = 0;
};

}  // namespace simdattn::detail
