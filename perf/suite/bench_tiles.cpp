// tiles/<part>/<shape>/t1: the bf16 tile path's kernels (TileAttentionKernels: AMX's tiles, or
// vdpbf16ps where the CPU prefers it) alone, one thread, on one step's operands as the fused
// path lays them out (fused/tile_steps.hpp): a query block of 128 rows (four groups of 32)
// against one key block, everything in L1 and L2, no engine around them. Where a step's time
// goes, and what running the parts in one stream saves:
//   tiles/scores/<shape>   S = Q K^T, a block call per group
//   tiles/softmax/<shape>  the softmax step of those scores into P's tiles, the rows' references
//                          held (a long row's later key blocks: no reference moves)
//   tiles/softmax-lse/<shape> the same with the exponential a call with an lse output takes
//                          (softmax_rows_lse)
//   tiles/values/<shape>   O += P V, a block call per group
//   tiles/phased/<shape>   the three, all groups' S products, then all softmax steps, then all PV
//   tiles/pipelined/<shape> the three as step_amx runs them: group g's softmax between group
//                          g + 1's S products and group g - 1's PV products
// Every row's GFLOP/s counts the step's products (2 x 128 x keys x (D + Dv)), so each part's
// rate is the step's had it been that part alone; 1 / phased against the sum of 1 / part is the
// overlap the stream finds by itself, pipelined against phased what the order adds. Shapes: gpt
// (D 64, a 256-key block), long (D 128, 256 keys), sdcross (D 40, its 77 keys). Rows only where
// the kernel table has the tile path (bf16 on AMX or on AMD's vdpbf16ps).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "linalg/gemm.hpp"
#include "perf_util.hpp"
#include "simdattn/half.hpp"
#include "simdattn/simd/kernels.hpp"

namespace {

using simdattn::simd::TileAttentionKernels;
template <class T>
using Aligned = std::vector<T, simdattn::detail::AlignedAllocator<T>>;

constexpr std::int64_t kRows = 128, kGroup = 32;

struct Shape {
  const char* name;
  std::int64_t D, keys;
};
constexpr Shape kShapes[] = {{"gpt", 64, 256}, {"long", 128, 256}, {"sdcross", 40, 77}};

std::int64_t up32(std::int64_t v) { return (v + 31) / 32 * 32; }

// One step's operands in the fused path's layouts (Dv = D).
struct Step {
  const TileAttentionKernels& tk;
  std::int64_t D, dp, keys, kk, dvp;
  Aligned<std::uint16_t> q, k, v, p;
  Aligned<float> s, o;
  std::vector<float> m, l, alpha, m_held;

  Step(const TileAttentionKernels& kernels, const Shape& shape)
      : tk(kernels), D(shape.D), dp(up32(shape.D)), keys(shape.keys), kk(up32(shape.keys)), dvp(up32(shape.D)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto bf16 = [&] { return simdattn::to_bfloat16(nd(rng)).bits; };
    // Q: 32 x 32 tiles per group and step of 32 along D (TileAttentionKernels::pack_a)
    std::vector<std::uint16_t> rows(static_cast<std::size_t>(kRows * D));
    for (auto& x : rows) x = bf16();
    q.assign(static_cast<std::size_t>(kRows * dp), 0);
    for (std::int64_t r0 = 0; r0 < kRows; r0 += kGroup)
      tk.pack_a(rows.data() + r0 * D, D, kGroup, D, q.data() + r0 * dp);
    // K: panels of 32 keys, pairs along D, zeros past D and past the keys
    k.assign(static_cast<std::size_t>(kk * dp), 0);
    for (std::int64_t j = 0; j < keys; ++j)
      for (std::int64_t d = 0; d < D; ++d)
        k[static_cast<std::size_t>((j / 32) * dp * 32 + (d / 2) * 64 + (j % 32) * 2 + d % 2)] = bf16();
    // V: panels of 32 columns, pairs along the keys, zeros past the keys
    v.assign(static_cast<std::size_t>(dvp / 32 * kk * 32), 0);
    for (std::int64_t j = 0; j < keys; ++j)
      for (std::int64_t c = 0; c < D; ++c)
        v[static_cast<std::size_t>((c / 32) * kk * 32 + (j / 2) * 64 + (c % 32) * 2 + j % 2)] = bf16();
    p.assign(static_cast<std::size_t>(kRows * kk), 0);
    s.assign(static_cast<std::size_t>(kRows * kk), 0.f);
    o.assign(static_cast<std::size_t>(kRows * dvp), 0.f);
    m.assign(kRows, 0.f);
    l.assign(kRows, 0.f);
    alpha.assign(kRows, 1.f);
    // held references: each row's max of the scaled scores (the reference after a first block)
    for (std::int64_t r0 = 0; r0 < kRows; r0 += kGroup) scores(r0);
    m_held.assign(kRows, 0.f);
    for (std::int64_t r = 0; r < kRows; ++r) {
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < keys; ++j) mx = std::max(mx, s[static_cast<std::size_t>(r * kk + j)] * scale());
      m_held[static_cast<std::size_t>(r)] = mx;
    }
  }
  float scale() const { return 1.f / std::sqrt(float(D)); }
  double flops() const { return 2.0 * double(kRows) * double(keys) * double(2 * D); }

  void scores(std::int64_t r0) {
    tk.block(D, q.data() + r0 * dp, 1024, 512, 64, kGroup, k.data(), dp * 32, static_cast<int>(kk), s.data() + r0 * kk,
             kk, false, nullptr, 0);
  }
  void weights(std::int64_t r0, bool lse = false) {
    (lse ? tk.softmax_rows_lse : tk.softmax_rows)(s.data() + r0 * kk, kk, kGroup, keys, scale(), nullptr, nullptr,
                                                  m.data() + r0, l.data() + r0, alpha.data() + r0, p.data() + r0 * kk,
                                                  0);
  }
  void values(std::int64_t r0) {
    tk.block(keys, p.data() + r0 * kk, 1024, 512, 64, kGroup, v.data(), kk * 32, static_cast<int>(D),
             o.data() + r0 * dvp, dvp, true, nullptr, 0);
  }
  void hold() {  // the references back where a later block finds them, l from 0
    std::copy(m_held.begin(), m_held.end(), m.begin());
    std::fill(l.begin(), l.end(), 0.f);
  }
};

enum class Part { scores, softmax, softmax_lse, values, phased, pipelined };

void tiles_part(benchmark::State& state, Shape shape, Part part) {
  const TileAttentionKernels& tk = simdattn::simd::kernels().tile_attention;
  Step st(tk, shape);
  constexpr std::int64_t groups = kRows / kGroup;
  simdattn::perf::timed_loop(state, st.flops(), "GFLOP/s", [&] {
    st.hold();
    switch (part) {
      case Part::scores:
        for (std::int64_t g = 0; g < groups; ++g) st.scores(g * kGroup);
        break;
      case Part::softmax:
        for (std::int64_t g = 0; g < groups; ++g) st.weights(g * kGroup);
        break;
      case Part::softmax_lse:
        for (std::int64_t g = 0; g < groups; ++g) st.weights(g * kGroup, true);
        break;
      case Part::values:
        for (std::int64_t g = 0; g < groups; ++g) st.values(g * kGroup);
        break;
      case Part::phased:
        for (std::int64_t g = 0; g < groups; ++g) st.scores(g * kGroup);
        for (std::int64_t g = 0; g < groups; ++g) st.weights(g * kGroup);
        for (std::int64_t g = 0; g < groups; ++g) st.values(g * kGroup);
        break;
      case Part::pipelined:
        st.scores(0);
        for (std::int64_t g = 0; g < groups; ++g) {
          if (g + 1 < groups) st.scores((g + 1) * kGroup);
          st.weights(g * kGroup);
          if (g > 0) st.values((g - 1) * kGroup);
        }
        st.values((groups - 1) * kGroup);
        break;
    }
  });
  tk.done();
}

int register_all() {
  const TileAttentionKernels& tk = simdattn::simd::kernels().tile_attention;
  if (tk.block == nullptr || tk.softmax_rows == nullptr || tk.softmax_rows_lse == nullptr) return 0;
  const std::pair<const char*, Part> parts[] = {{"scores", Part::scores},           {"softmax", Part::softmax},
                                                {"softmax-lse", Part::softmax_lse}, {"values", Part::values},
                                                {"phased", Part::phased},           {"pipelined", Part::pipelined}};
  for (const Shape& shape : kShapes)
    for (const auto& [name, part] : parts)
      benchmark::RegisterBenchmark((std::string("tiles/") + name + "/" + shape.name + "/t1").c_str(), tiles_part, shape,
                                   part)
          ->Unit(benchmark::kMicrosecond);
  return 0;
}

const int registered = register_all();

}  // namespace
