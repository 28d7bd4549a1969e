// gemm/<backend>/<MxNxK>/t<threads>: docs/design.md's GEMM shapes, row-major C = A B (no
// transposes), native against oneDNN's matmul (one primitive per shape, created once, outside the timing).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>
#include <string>
#include <vector>

#include "gemm.hpp"
#include "perf_util.hpp"

#ifdef SIMDATTN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

struct Shape {
  std::int64_t M, N, K;
};
constexpr Shape kShapes[] = {{1024, 1024, 1024}, {2048, 2048, 64}, {2048, 64, 2048},
                             {128, 768, 768},    {1, 4096, 128},   {1024, 3072, 1024}};

// Operands 64-byte aligned, as a framework allocates its tensors (PyTorch's CPU allocator aligns
// to 64 bytes), not at malloc's 16 bytes.
struct Operands {
  std::vector<float, simdattn::detail::AlignedAllocator<float>> a, b, c;
  explicit Operands(const Shape& s)
      : a(std::size_t(s.M * s.K)), b(std::size_t(s.K * s.N)), c(std::size_t(s.M * s.N)) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
  }
};

double flops(const Shape& s) { return 2.0 * double(s.M) * double(s.N) * double(s.K); }

void gemm_native(benchmark::State& state, Shape s, int threads) {
  Operands op(s);
  simdattn::detail::GemmArgs<float> g;
  g.M = s.M, g.N = s.N, g.K = s.K;
  g.A = op.a.data(), g.lda = s.K;
  g.B = op.b.data(), g.ldb = s.N;
  g.C = op.c.data(), g.ldc = s.N;
  simdattn::perf::timed_loop(state, flops(s), "GFLOP/s", [&] { simdattn::detail::gemm(g, threads); });
}

#ifdef SIMDATTN_HAVE_ONEDNN
void gemm_onednn(benchmark::State& state, Shape s, int threads) {
  using namespace dnnl;
  Operands op(s);
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc a_md({s.M, s.K}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc b_md({s.K, s.N}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc c_md({s.M, s.N}, memory::data_type::f32, memory::format_tag::ab);
  const matmul::primitive_desc pd(matmul::desc(a_md, b_md, c_md), eng);
  const matmul prim(pd);
  memory a(a_md, eng, op.a.data()), b(b_md, eng, op.b.data()), c(c_md, eng, op.c.data());
  omp_set_num_threads(threads);
  simdattn::perf::timed_loop(state, flops(s), "GFLOP/s", [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
  });
  omp_set_num_threads(omp_get_num_procs());
}
#endif

int register_all() {
  for (const Shape& s : kShapes) {
    const std::string shape = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
    for (int t : {1, 2}) {
      benchmark::RegisterBenchmark(("gemm/native/" + shape + "/t" + std::to_string(t)).c_str(), gemm_native, s, t)
          ->Unit(benchmark::kMicrosecond);
#ifdef SIMDATTN_HAVE_ONEDNN
      benchmark::RegisterBenchmark(("gemm/onednn/" + shape + "/t" + std::to_string(t)).c_str(), gemm_onednn, s, t)
          ->Unit(benchmark::kMicrosecond);
#endif
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
