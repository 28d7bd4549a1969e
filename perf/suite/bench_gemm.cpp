// gemm/<backend>/<MxNxK>/t<threads>: docs/design.md's GEMM shapes, row-major C = A B (no
// transposes), native against oneDNN's matmul (one primitive per shape, created once, outside the timing).
// gemm/<backend>/<MxNxK>.bf16/t<threads> and .f16: A and B rounded to bf16 / f16, C in f32; the
// native 16-bit GEMM takes B packed once outside the timing (as a layer packs its weights),
// oneDNN's matmul reads it as it is. oneDNN's rows only where it has the dtype's matmul here.
// gemm/native/<MxNxK>.bf16-pairs/t<threads>: the same on AVX512-BF16's vdpbf16ps kernels (the pair
// layout), where the CPU has them: their speed against the widening .bf16 row (the dispatched one).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>
#include <string>
#include <vector>

#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "perf_util.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/half.hpp"

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

// The operands' A and B rounded to bf16 (or f16) bits.
struct Operands16 {
  std::vector<std::uint16_t, simdattn::detail::AlignedAllocator<std::uint16_t>> a, b;
  Operands16(const Operands& op, bool bf16) : a(op.a.size()), b(op.b.size()) {
    auto round = [bf16](float x) { return bf16 ? simdattn::to_bfloat16(x).bits : simdattn::to_float16(x).bits; };
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = round(op.a[i]);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = round(op.b[i]);
  }
};

// pairs: B packed for the table's vdpbf16ps kernels (gemm_bf16_pairs, AVX512-BF16 only) instead
// of the dispatched bf16 GEMM (which widens B to f32 and runs FMAs where there are no tiles).
void gemm_native16(benchmark::State& state, Shape s, int threads, bool bf16, bool pairs) {
  Operands op(s);
  const Operands16 h(op, bf16);
  const simdattn::detail::Packed16 packed =
      simdattn::detail::pack16_b(h.b.data(), s.N, s.K, s.N, bf16, nullptr, pairs);
  simdattn::detail::Gemm16Args g;
  g.M = s.M, g.N = s.N, g.K = s.K;
  g.A = h.a.data(), g.lda = s.K;
  g.B = &packed;
  g.C = op.c.data(), g.ldc = s.N;
  simdattn::perf::timed_loop(state, flops(s), "GFLOP/s", [&] { simdattn::detail::gemm16(g, threads); });
}

#ifdef SIMDATTN_HAVE_ONEDNN
// dt: the data type of A and B (f32, bf16 or f16); C is f32.
void gemm_onednn(benchmark::State& state, Shape s, int threads, dnnl::memory::data_type dt) {
  using namespace dnnl;
  Operands op(s);
  const Operands16 h(op, dt == memory::data_type::bf16);
  const bool half = dt != memory::data_type::f32;
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc a_md({s.M, s.K}, dt, memory::format_tag::ab);
  const memory::desc b_md({s.K, s.N}, dt, memory::format_tag::ab);
  const memory::desc c_md({s.M, s.N}, memory::data_type::f32, memory::format_tag::ab);
  const matmul::primitive_desc pd(matmul::desc(a_md, b_md, c_md), eng);
  const matmul prim(pd);
  memory a(a_md, eng, half ? static_cast<void*>(const_cast<std::uint16_t*>(h.a.data())) : op.a.data());
  memory b(b_md, eng, half ? static_cast<void*>(const_cast<std::uint16_t*>(h.b.data())) : op.b.data());
  memory c(c_md, eng, op.c.data());
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
      for (bool bf16 : {true, false})
        benchmark::RegisterBenchmark(("gemm/native/" + shape + (bf16 ? ".bf16" : ".f16") + "/t" + std::to_string(t)).c_str(),
                                     gemm_native16, s, t, bf16, false)
            ->Unit(benchmark::kMicrosecond);
      if (simdattn::simd::kernels().gemm_bf16_pairs.ukernel[1] != nullptr)  // vdpbf16ps, against the row above
        benchmark::RegisterBenchmark(("gemm/native/" + shape + ".bf16-pairs/t" + std::to_string(t)).c_str(),
                                     gemm_native16, s, t, true, true)
            ->Unit(benchmark::kMicrosecond);
#ifdef SIMDATTN_HAVE_ONEDNN
      using dt = dnnl::memory::data_type;
      benchmark::RegisterBenchmark(("gemm/onednn/" + shape + "/t" + std::to_string(t)).c_str(), gemm_onednn, s, t, dt::f32)
          ->Unit(benchmark::kMicrosecond);
      for (auto [type, name] : {std::pair{dt::bf16, simdattn::DType::bf16}, std::pair{dt::f16, simdattn::DType::f16}})
        if (simdattn::backend_takes(simdattn::Backend::onednn, name))
          benchmark::RegisterBenchmark(
              ("gemm/onednn/" + shape + "." + std::string(simdattn::dtype_name(name)) + "/t" + std::to_string(t)).c_str(),
              gemm_onednn, s, t, type)
              ->Unit(benchmark::kMicrosecond);
#endif
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
