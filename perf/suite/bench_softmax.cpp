// softmax/<backend>/<workload>/t<threads>: the row softmax of a standard workload's score matrix,
// [B*H*Sq, Sk] f32 in place, no scale and no mask: native's SIMD row kernels as the attention
// kernels call them (softmax_rows: max, exp(x - max) and sum, four rows interleaved; then
// normalize_rows: times 1 / sum) on blocks of rows that stay in L1, against oneDNN's softmax primitive (created once). The causal
// workloads (gpt, long) are left out: their attention never forms a full row. Counter: GB/s
// of the matrix read once and written once.
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "linalg/gemm.hpp"
#include "perf_util.hpp"
#include "simdattn/simd/kernels.hpp"
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"
#include "runtime/threading.hpp"

#ifdef SIMDATTN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

using Matrix = std::vector<float, simdattn::detail::AlignedAllocator<float>>;

Matrix scores(std::int64_t rows, std::int64_t n) {
  Matrix x(static_cast<std::size_t>(rows * n));
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 4.f);  // logits of a trained model's spread
  for (auto& v : x) v = d(rng);
  return x;
}

// Elements per thread below which a parallel region costs more than it saves.
constexpr std::int64_t kMinElementsPerThread = 1 << 16;

void softmax_native(benchmark::State& state, std::int64_t rows, std::int64_t n, int threads) {
  Matrix x = scores(rows, n);
  const simdattn::simd::VectorKernels<float>& vk = simdattn::simd::kernels().vec<float>();
  const std::int64_t min_rows = std::max<std::int64_t>(1, kMinElementsPerThread / n);
  // Rows per kernel call: at most 64 (as the attention kernels take them), and few enough that
  // the block is still in L1 (32 KiB of it) when normalize_rows passes over it again.
  constexpr std::int64_t kBlock = 64;
  const std::int64_t block = std::clamp<std::int64_t>(32768 / (4 * n) / 4 * 4, 4, kBlock);
  simdattn::perf::timed_loop(state, 2.0 * 4.0 * double(rows * n), "GB/s", [&] {
    simdattn::detail::parallel_for(rows, threads, min_rows, [&](std::int64_t r0, std::int64_t r1) {
      float m[kBlock], l[kBlock], alpha[kBlock];
      for (std::int64_t r = r0; r < r1; r += block) {
        const std::int64_t nr = std::min(block, r1 - r);
        float* blk = x.data() + r * n;
        std::fill(m, m + nr, -std::numeric_limits<float>::infinity());
        std::fill(l, l + nr, 0.f);
        vk.softmax_rows(blk, n, nr, n, 1.f, 0.f, nullptr, nullptr, m, l, alpha);  // exp(x - max), sums
        vk.normalize_rows(blk, n, nr, n, l, blk, n);                         // times 1 / sum
      }
    });
  });
}

#ifdef SIMDATTN_HAVE_ONEDNN
void softmax_onednn(benchmark::State& state, std::int64_t rows, std::int64_t n, int threads) {
  using namespace dnnl;
  Matrix x = scores(rows, n);
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc md({rows, n}, memory::data_type::f32, memory::format_tag::ab);
  const softmax_forward::primitive_desc pd(softmax_forward::desc(prop_kind::forward_inference, md, 1), eng);
  const softmax_forward prim(pd);
  memory m(md, eng, x.data());
  omp_set_num_threads(threads);
  simdattn::perf::timed_loop(state, 2.0 * 4.0 * double(rows * n), "GB/s", [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, m}, {DNNL_ARG_DST, m}});
    strm.wait();
  });
  omp_set_num_threads(omp_get_num_procs());
}
#endif

int register_all() {
  for (const auto& w : simdattn::standard_workloads()) {
    if (w.causal != simdattn::Causal::none) continue;
    const std::int64_t rows = w.B * w.H * w.Sq, n = w.Sk;
    for (int t : {1, 2}) {
      const std::string tail = std::string(w.name) + "/t" + std::to_string(t);
      benchmark::RegisterBenchmark(("softmax/native/" + tail).c_str(), softmax_native, rows, n, t)
          ->Unit(benchmark::kMicrosecond);
#ifdef SIMDATTN_HAVE_ONEDNN
      benchmark::RegisterBenchmark(("softmax/onednn/" + tail).c_str(), softmax_onednn, rows, n, t)
          ->Unit(benchmark::kMicrosecond);
#endif
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
