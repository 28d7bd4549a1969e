// libFuzzer target: gated_delta_rule()'s validation and kernels on shapes, strides, dtypes, values
// (g > 0, NaN, infinities among them) and state views taken from the input, the final state
// sometimes over the initial one or over out, over small real buffers (views that would reach past
// a buffer are not made). Each call must compute or throw simdattn::Error; an Error leaves out and
// the final state's buffer as they were; a result equals, bit for bit, the same call on one
// thread over copies of its inputs that overlap nothing (the in-place state read before it is
// written, the threads' split not showing). Nothing read or written outside the buffers
// (AddressSanitizer).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "fuzz_input.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"

namespace {

using simdattn::ConstTensorView;
using simdattn::DType;
using simdattn::TensorView;

constexpr std::size_t kElems = 8192;  // every buffer, in elements of 8 bytes

// Fills a buffer of doubles with f32 (or 16-bit) values from a small set and the input.
void fill(Bytes& in, std::vector<double>& buf, float base) {
  auto* f = reinterpret_cast<unsigned char*>(buf.data());
  for (std::size_t i = 0; i < kElems * 2; ++i) {
    const float x = base * static_cast<float>(static_cast<int>(i % 7) - 3);
    std::memcpy(f + i * sizeof(float), &x, sizeof x);
  }
  const float odd[] = {0.5f,  -2.0f,  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                       1e30f, -1e-40f};
  for (unsigned n = in.next(4) == 0 ? in.next(3) : 0; n > 0; --n) {
    const float x = odd[in.next(6)];
    std::memcpy(f + in.next(256) * sizeof(float), &x, sizeof x);
  }
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_linear: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::vector<double> q(kElems), k(kElems), v(kElems), g(kElems), beta(kElems), out(kElems), state(kElems);
  Bytes in{data, size};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  const DType t = dtypes[in.next(4)], gt = in.next(4) == 0 ? dtypes[in.next(4)] : DType::f32;
  const std::int64_t B = in.in(0, 2), T = in.in(0, 40), H = in.in(0, 2), Hv = H * in.in(1, 2) + (in.next(16) == 0),
                     Dk = in.in(0, 9), Dv = in.in(1, 9);
  fill(in, q, 0.25f), fill(in, k, 0.125f), fill(in, v, 0.5f), fill(in, beta, 0.1f), fill(in, state, 0.01f);
  fill(in, g, 0.0f);
  {  // g: log decays <= 0, sometimes one > 0
    auto* f = reinterpret_cast<float*>(g.data());
    for (std::size_t i = 0; i < kElems * 2; ++i) f[i] = -0.03125f * static_cast<float>(i % 5);
    if (in.next(8) == 0) f[in.next(64)] = 0.5f;
  }
  simdattn::GatedDeltaRuleOptions o;
  o.threads = static_cast<int>(in.next(4));
  o.use_qk_l2norm = in.next(2);
  if (in.next(4) == 0) o.scale = static_cast<double>(in.in(-2, 3));
  const simdattn::Shape4 ss{B, Hv, Dk, Dv};
  if (in.next(2))
    o.initial_state = fuzz_view<ConstTensorView>(in, state.data(), kElems, in.next(10) ? DType::f32 : gt, ss);
  if (in.next(2)) {  // the final state: its own buffer, the initial state's own view, or over it or out
    const unsigned where = in.next(4);
    std::vector<double>& buf = where == 1 || where == 2 ? state : where == 3 ? out : g;  // g's tail: apart
    const std::size_t off = where == 0 ? kElems / 2 : where == 2 ? static_cast<std::size_t>(in.in(1, 64)) : 0;
    if (where == 1 && !o.initial_state.empty())
      o.final_state = TensorView(state.data(), DType::f32, o.initial_state.shape, o.initial_state.strides);
    else
      o.final_state = fuzz_view<TensorView>(in, buf.data(), kElems, DType::f32, ss, off);
  }
  const auto qv = fuzz_view<ConstTensorView>(in, q.data(), kElems, t, {B, T, H, Dk});
  const auto kv = fuzz_view<ConstTensorView>(in, k.data(), kElems, in.next(16) ? t : gt, {B, T, H, Dk});
  const auto vv = fuzz_view<ConstTensorView>(in, v.data(), kElems, t, {B, T, Hv, Dv});
  const auto gv = fuzz_view<ConstTensorView>(in, g.data(), kElems / 2, gt, {B, T, Hv, in.next(16) ? 1 : 2});
  const auto bv = fuzz_view<ConstTensorView>(in, beta.data(), kElems, gt, {B, T, Hv, 1});
  const auto ov = fuzz_view<TensorView>(in, out.data(), kElems, t, {B, T, Hv, Dv});
  if (qv.empty() || kv.empty() || vv.empty() || gv.empty() || bv.empty() || ov.empty()) return 0;

  const std::vector<double> out0 = out, state0 = state, g0 = g;
  try {
    simdattn::gated_delta_rule(qv, kv, vv, gv, bv, ov, o);
  } catch (const simdattn::Error&) {
    if (!same_bytes(out, out0) || !same_bytes(state, state0) || !same_bytes(g, g0))
      fail("an Error, and an output written");
    return 0;
  }
  // the same call on one thread over copies of the buffers, the initial state in a copy of its own
  // (read there, the final state written into another: nothing overlaps)
  std::vector<double>* bufs[] = {&q, &k, &v, &g, &beta, &out, &state};
  std::vector<double> copies[7] = {q, k, v, g0, beta, out0, state0};
  std::vector<double> s_in = state0;
  auto moved = [&](const auto& view, std::vector<double>* into = nullptr) {
    using View = std::remove_cvref_t<decltype(view)>;
    for (int i = 0; i < 7; ++i) {
      const auto at = static_cast<std::ptrdiff_t>(reinterpret_cast<std::uintptr_t>(view.data) -
                                                  reinterpret_cast<std::uintptr_t>(bufs[i]->data()));
      if (at >= 0 && static_cast<std::size_t>(at) < kElems * 8)
        return View(reinterpret_cast<char*>((into != nullptr ? into : &copies[i])->data()) + at, view.dtype, view.shape,
                    view.strides);
    }
    fail("a view outside the buffers");
  };
  simdattn::GatedDeltaRuleOptions o1 = o;
  o1.threads = 1;
  if (!o.initial_state.empty()) o1.initial_state = moved(o.initial_state, &s_in);
  if (!o.final_state.empty()) o1.final_state = moved(o.final_state);
  simdattn::gated_delta_rule(moved(qv), moved(kv), moved(vv), moved(gv), moved(bv), moved(ov), o1);
  for (int i = 0; i < 7; ++i)
    if (!same_bytes(*bufs[i], copies[i])) fail("a result differs from one thread's over buffers that overlap nothing");
  return 0;
}
