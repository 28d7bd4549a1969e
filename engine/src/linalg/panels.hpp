// Packing a row-major operand into the micro-kernels' B panels.
#pragma once

#include <cstdint>
#include <cstring>

namespace simdattn::detail {

// Copies rows [0, rows) of a matrix (row stride rs, column stride cs) into `panels` column
// panels of width w: panel c holds columns c*w .. c*w + w - 1 as `total_rows` rows w apart, at
// dst + c * panel_stride (default: total_rows * w, panels back to back). Columns past `cols` and
// rows past `rows` are zero (rows past `rows` of src are never read).
template <class T>
void pack_row_panels(const T* src, std::int64_t rs, std::int64_t cs, std::int64_t rows, std::int64_t total_rows,
                     std::int64_t cols, std::int64_t w, std::int64_t panels, T* dst, std::int64_t panel_stride = -1) {
  if (panel_stride < 0) panel_stride = total_rows * w;
  for (std::int64_t c = 0; c < panels; ++c) {
    const std::int64_t c0 = c * w;
    const std::int64_t nc = c0 < cols ? (cols - c0 < w ? cols - c0 : w) : 0;
    for (std::int64_t r = 0; r < total_rows; ++r) {
      T* d = dst + c * panel_stride + r * w;
      std::int64_t e = 0;
      if (r < rows) {
        const T* s = src + r * rs + c0 * cs;
        if (cs == 1) {
          std::memcpy(d, s, sizeof(T) * static_cast<std::size_t>(nc));
          e = nc;
        } else {
          for (; e < nc; ++e) d[e] = s[e * cs];
        }
      }
      for (; e < w; ++e) d[e] = T(0);
    }
  }
}

}  // namespace simdattn::detail
