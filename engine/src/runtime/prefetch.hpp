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
  // cursor within one run, none once every line is handed out. Rows apart (a paged block's rows of
  // one kv head, a [S, H, D] layout's rows of one head: 8 lines each for 128 f32) would give a
  // product one row: where the run ends a row before k / 4, the lines of the rows after it, up to
  // k / 2 in all, are prefetched at once (kStridedShare). (Paged f32 K and V of 128-key blocks
  // were a fifth of attention/native/tree32-verify's time, stalled on loads, at one row a product.)
  Run take(std::int64_t k) {
    const std::int64_t lines = k / 4;
    while (cur_ < n_) {
      const std::int64_t avail = row_lines() - line_;
      if (avail > 0) {
        const std::int64_t n = std::min(avail, lines);
        const Run r{line_at(line_), n};
        line_ += n;
        if (n == avail) issue<2>(kStridedShare * lines - n, true);
        return r;
      }
      next_row();
    }
    return {};
  }
  // Up to `lines` lines from the cursor as one run, for products that spread them themselves (the
  // tile path's, TileAttentionKernels::block): a run's last few lines (fewer than lines / 4: a
  // stream's one line past its rows when they start mid-line) prefetched now (into L2) and the
  // next run taken instead, so that a stream's stray line does not use a product's share.
  Run take_run(std::int64_t lines) {
    Run r = take(4 * lines);
    if (r.lines > 0 && r.lines < lines / 4) {
      for (std::int64_t i = 0; i < r.lines; ++i) __builtin_prefetch(static_cast<const char*>(r.at) + 64 * i, 0, 2);
      r = take(4 * lines);
    }
    return r;
  }
  // Up to `lines` lines from the cursor prefetched now (into L1), across rows and streams: for
  // products that do not prefetch (the gated delta rule's chunk on the bf16 pair kernels calls it
  // between them).
  void prefetch_now(std::int64_t lines) { issue<3>(lines, false); }
  void clear() { n_ = cur_ = 0, row_ = line_ = 0; }

 private:
  // K and V rows of a key block: one run each when dense, a run per block of a paged cache
  // (128 keys in blocks of 16: 16 runs; more are not prefetched).
  static constexpr std::size_t kStreams = 16;
  // A product's lines from rows apart: twice its own share (k / 4), measured against one and four
  // times on attention/native/tree32-verify and forks32-cascade (paged f32 and bf16).
  static constexpr std::int64_t kStridedShare = 2;
  struct Stream {
    std::uintptr_t base;
    std::int64_t stride, bytes, rows;
  };
  // The current row's address, its lines, line i of it.
  std::uintptr_t row_at() const { return s_[cur_].base + static_cast<std::uintptr_t>(row_ * s_[cur_].stride); }
  std::int64_t row_lines() const {
    const std::uintptr_t row = row_at();
    return static_cast<std::int64_t>(((row + static_cast<std::uintptr_t>(s_[cur_].bytes) - 1) >> 6) - (row >> 6) + 1);
  }
  const void* line_at(std::int64_t i) const { return reinterpret_cast<const void*>(((row_at() >> 6) + static_cast<std::uintptr_t>(i)) << 6); }
  void next_row() {
    line_ = 0;
    if (++row_ == s_[cur_].rows) {
      row_ = 0;
      ++cur_;
    }
  }
  // Up to `lines` lines from the cursor prefetched at once (kLocality: __builtin_prefetch's), the
  // cursor moved past them; within the current stream's rows only when one_stream.
  template <int kLocality>
  void issue(std::int64_t lines, bool one_stream) {
    while (lines > 0 && cur_ < n_) {
      const std::int64_t n = std::min(row_lines() - line_, lines);
      if (n <= 0) {
        if (one_stream && row_ + 1 == s_[cur_].rows) return;
        next_row();
        continue;
      }
      for (std::int64_t i = 0; i < n; ++i) __builtin_prefetch(line_at(line_ + i), 0, kLocality);
      line_ += n;
      lines -= n;
    }
  }
  std::array<Stream, kStreams> s_{};
  std::size_t n_ = 0, cur_ = 0;
  std::int64_t row_ = 0, line_ = 0;
};

}  // namespace simdattn::detail
