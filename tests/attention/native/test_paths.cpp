// The native backend's path table (attention/native/native.hpp): which path each standard
// workload takes, and why each path before it did not.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attention/native/native.hpp"
#include "core/validate/validate.hpp"
#include "simdattn/bench.hpp"
#include "simdattn/simd/kernels.hpp"
#include "support/test_util.hpp"

namespace simdattn {
namespace {

// Buffers for a workload's q, k, v and out in `dtype` (zeros: only their shapes matter here).
struct Operands {
  std::vector<std::byte> q, k, v;
  mutable std::vector<std::byte> o;
  Shape4 qs, ks, os;
  DType dtype;
  Operands(const Workload& w, DType dt, std::int64_t k_inner = 1)
      : qs{w.B, w.H, w.Sq, w.D}, ks{w.B, w.Hkv, w.Sk, w.D}, os{w.B, w.H, w.Sq, w.D}, dtype(dt) {
    const std::size_t e = dtype_size(dt);
    q.resize(static_cast<std::size_t>(w.B * w.H * w.Sq * w.D) * e);
    k.resize(static_cast<std::size_t>(w.B * w.Hkv * w.Sk * w.D * k_inner) * e);
    v.resize(k.size());
    o.resize(q.size());
    inner = k_inner;
  }
  std::int64_t inner = 1;
  detail::Problem problem(const AttentionOptions& opt = {}) const {
    const Shape4 kst{ks[1] * ks[2] * ks[3] * inner, ks[2] * ks[3] * inner, ks[3] * inner, inner};
    return detail::make_problem(ConstTensorView(q.data(), dtype, qs), ConstTensorView(k.data(), dtype, ks, kst),
                                ConstTensorView(v.data(), dtype, ks, kst), TensorView(o.data(), dtype, os), opt);
  }
};

// "path" when p takes it, with each path passed over as "name: reason".
struct Taken {
  std::string path;
  std::vector<std::string> passed_over;
};
Taken taken(const detail::Problem& p) {
  const detail::NativeChoice c = detail::choose_native_path(p);
  Taken t{std::string(c.path->name), {}};
  for (const auto& [path, why] : c.passed_over) t.passed_over.push_back(std::string(path->name) + ": " + why.text());
  return t;
}

Workload workload(const char* name) {
  const Workload* w = find_workload(name);
  REQUIRE(w != nullptr);
  return *w;
}

bool has_tiles() {
  const simd::KernelTable& kt = simd::kernels();
  return kt.tile_attention.block != nullptr && kt.tile_attention.softmax_rows != nullptr;
}

TEST_CASE("the native path table lists every path once, the fused path last" * doctest::test_suite(test::every_isa)) {
  std::vector<std::string> names;
  for (const auto& path : detail::native_paths()) names.emplace_back(path.name);
  CHECK(names ==
        std::vector<std::string>{"decode16", "decode.widened", "decode", "decode8", "fused.tiles", "short_keys", "fused"});
  CHECK(runtime_info().native_paths.size() == names.size());
  CHECK(runtime_info().native_paths.front().rfind("decode16: ", 0) == 0);
}

TEST_CASE("standard workloads take their native paths (f32)" * doctest::test_suite(test::every_isa)) {
  for (const char* name : {"bert", "vit", "gpt", "long", "batch"}) {
    CAPTURE(name);
    CHECK(taken(Operands(workload(name), DType::f32).problem()).path == "fused");
  }
  const Taken bert = taken(Operands(workload("bert"), DType::f32).problem());
  CHECK(bert.passed_over == std::vector<std::string>{
                                "decode16: dtype f32 (bf16 and f16 only)", "decode.widened: dtype f32 (bf16 and f16 only)",
                                "decode: 128 query tokens > 16", "decode8: K and V of dtype f32 (8-bit codes only)",
                                "fused.tiles: dtype f32 (bf16 only)",
                                "short_keys: 128 keys (1 to 96 only)"});
  const Taken decode = taken(Operands(workload("decode"), DType::f32).problem());
  CHECK(decode.path == "decode");
  CHECK(decode.passed_over.size() == 2);
  CHECK(taken(Operands(workload("sdcross"), DType::f32).problem()).path == "short_keys");
  CHECK(taken(Operands(workload("sdcross"), DType::f64).problem()).path == "short_keys");
  CHECK(taken(Operands(workload("decode"), DType::f64).problem()).path == "decode");
}

TEST_CASE("standard workloads take their native paths (bf16, f16)" * doctest::test_suite(test::every_isa)) {
  const std::string tiles = has_tiles() ? "fused.tiles" : "fused";
  for (const char* name : {"bert", "vit", "gpt", "batch"}) {
    CAPTURE(name);
    CHECK(taken(Operands(workload(name), DType::bf16).problem()).path == tiles);
    CHECK(taken(Operands(workload(name), DType::f16).problem()).path == "fused");
  }
  // sdcross's 77 keys: one tile block on AMX, else queries on the vector lanes
  CHECK(taken(Operands(workload("sdcross"), DType::bf16).problem()).path == (has_tiles() ? "fused.tiles" : "short_keys"));
  CHECK(taken(Operands(workload("sdcross"), DType::f16).problem()).path == "short_keys");
  for (DType dt : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dt));
    CHECK(taken(Operands(workload("decode"), dt).problem()).path == "decode16");
    // K and V strided along D: the 16-bit GEMV reads rows in place, so dense f32 copies instead
    const Taken strided = taken(Operands(workload("decode"), dt, 2).problem());
    CHECK(strided.path == "decode.widened");
    CHECK(strided.passed_over == std::vector<std::string>{"decode16: K or V strided along D (inner strides 2 and 2)"});
  }
  if (!has_tiles()) {
    const Taken bert = taken(Operands(workload("bert"), DType::bf16).problem());
    CHECK(bert.passed_over.at(4).find("fused.tiles: ISA ") == 0);
    CHECK(bert.passed_over.at(4).find(" has no AMX tiles") != std::string::npos);
  }
}

TEST_CASE("score modifiers take a fused path, sinks and lse the decode paths too" * doctest::test_suite(test::every_isa)) {
  const Operands decode(workload("decode"), DType::f32);
  std::vector<float> lse(32), sinks(32, 0.5f);
  AttentionOptions opt;
  opt.lse = TensorView(lse.data(), {1, 32, 1, 1});
  opt.sinks = sinks;
  CHECK(taken(decode.problem(opt)).path == "decode");
  opt.softcap = 30.0;
  const Taken t = taken(decode.problem(opt));
  CHECK(t.path == "fused");
  CHECK(t.passed_over.at(2) == "decode: score modifiers (the fused paths apply them)");
  opt = {};
  opt.softcap = 30.0;
  CHECK(taken(Operands(workload("sdcross"), DType::f32).problem(opt)).path == "fused");
}

}  // namespace
}  // namespace simdattn
