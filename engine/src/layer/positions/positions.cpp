// QK-norm and RoPE on the layer's projected rows (positions.hpp).
#include "layer/positions/positions.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/element.hpp"
#include "layer/positions/rope_table.hpp"
#include "runtime/threading.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

void check_positions(std::span<const std::int64_t> positions, std::int64_t B, std::int64_t S) {
  if (!positions.empty() && static_cast<std::int64_t>(positions.size()) != B * S)
    throw Error("options.positions", "expected B*S = " + std::to_string(B * S) + " entries, got " +
                                         std::to_string(positions.size()));
  for (std::size_t i = 0; i < positions.size(); ++i)
    if (positions[i] < 0) throw Error("options.positions", "entry " + std::to_string(i) + " is negative");
}

template <class T>
void position_qk(const LayerStorage<T>& layer, T* p, std::int64_t N, std::int64_t k0, std::int64_t B, std::int64_t S,
                 std::span<const std::int64_t> positions, const std::int64_t* start, int threads) {
  const MhaConfig& c = layer.cfg;
  const RopeTable& table = layer.rope;
  const bool norm = !c.q_norm.empty();
  if (!norm && !c.rope) return;
  check_positions(positions, B, S);
  const std::int64_t hd = c.head_dim;
  auto rms = [&](T* x, const std::vector<float>& w) { rms_norm_row(x, hd, w.data(), c.qk_norm_eps); };
  // rows split over the threads (each row's heads share its cosines and sines)
  parallel_for(B * S, threads, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(1, hd * (c.heads + c.kv_heads))),
               [&](std::int64_t m0, std::int64_t m1) {
    thread_local std::vector<double> cs;
    cs.resize(table.inv_freq.size() * 2);
    for (std::int64_t m = m0; m < m1; ++m) {
      const std::int64_t b = m / S, s = m % S;
      T* row = p + m * N;
      const std::int64_t pos = positions.empty() ? (start ? start[b] : 0) + s : positions[static_cast<std::size_t>(m)];
      if (c.rope) rope_angles(table, pos, cs.data());
      for (std::int64_t h = 0; h < c.heads; ++h) {
        if (norm) rms(row + h * hd, c.q_norm);
        if (c.rope) rope_rotate(table, cs.data(), row + h * hd, 1);
      }
      for (std::int64_t h = 0; h < c.kv_heads; ++h) {
        if (norm) rms(row + k0 + h * hd, c.k_norm);
        if (c.rope) rope_rotate(table, cs.data(), row + k0 + h * hd, 1);
      }
    }
  });
}

template void position_qk<float>(const LayerStorage<float>&, float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::span<const std::int64_t>, const std::int64_t*, int);
template void position_qk<double>(const LayerStorage<double>&, double*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::span<const std::int64_t>, const std::int64_t*, int);
template void position_qk<bfloat16>(const LayerStorage<bfloat16>&, bfloat16*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::span<const std::int64_t>, const std::int64_t*, int);
template void position_qk<float16>(const LayerStorage<float16>&, float16*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::span<const std::int64_t>, const std::int64_t*, int);

}  // namespace simdattn::detail
