// libFuzzer target: attention()'s validation and kernels on shapes, strides, dtypes and options
// taken from the input, over small real buffers (views that would reach past a buffer are not
// made: the library cannot know a caller's buffer sizes). The call must compute or throw
// simdattn::Error, and never read or write outside the buffers (AddressSanitizer).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_input.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"

namespace {

constexpr std::size_t kElems = 4096;  // every buffer, in elements of the largest dtype (8 bytes)

// A view of `buf` with shape and strides from the input, or an empty view if it would reach past
// the buffer.
template <class View, class Ptr>
View view(Bytes& in, Ptr buf, simdattn::DType t, const simdattn::Shape4& shape) {
  return fuzz_view<View>(in, buf, kElems, t, shape);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::vector<double> q(kElems, 0.5), k(kElems, -0.25), v(kElems, 1.0), out(kElems), mask(kElems, 0.0),
      lse(kElems), scores(kElems);
  Bytes in{data, size};
  using simdattn::DType;
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::u8, DType::i32};
  const DType t = dtypes[in.next(6)];
  const std::int64_t B = in.next(3) + (in.next(8) == 0 ? 0 : 1), Hkv = in.next(3) + 1, H = Hkv * (in.next(3) + 1);
  const std::int64_t Sq = in.next(12), Sk = in.next(20), D = in.next(9) + (in.next(8) == 0 ? 0 : 1),
                     Dv = in.next(9) + 1;
  simdattn::AttentionOptions o;
  o.backend = in.next(2) ? simdattn::Backend::native : simdattn::Backend::reference;
  o.threads = static_cast<int>(in.next(3));
  o.causal = static_cast<simdattn::Causal>(in.next(3));
  if (in.next(2)) o.scale = static_cast<double>(in.next(9)) - 2.0;
  if (in.next(3) == 0) o.window = simdattn::Window{static_cast<std::int64_t>(in.next(6)) - 2, static_cast<std::int64_t>(in.next(6)) - 2};
  std::vector<std::int64_t> lengths;
  if (in.next(3) == 0) {
    for (std::int64_t b = 0; b < B + static_cast<std::int64_t>(in.next(2)); ++b) lengths.push_back(static_cast<std::int64_t>(in.next(24)) - 2);
    o.key_lengths = lengths;
  }
  if (in.next(4) == 0) o.softcap = static_cast<double>(in.next(5));
  std::vector<float> slopes, sinks;
  if (in.next(4) == 0) {
    slopes.assign(static_cast<std::size_t>(H + in.next(2)), 0.25f);
    o.alibi_slopes = slopes;
  }
  if (in.next(4) == 0) {
    sinks.assign(static_cast<std::size_t>(H), 0.5f);
    o.sinks = sinks;
  }
  if (in.next(4) == 0) o.global_tokens = in.next(5);
  const DType mask_types[] = {DType::u8, DType::f32, DType::f64};
  if (in.next(3) == 0)
    o.mask = view<simdattn::ConstTensorView>(in, mask.data(), mask_types[in.next(3)],
                                             {in.next(2) ? B : 1, in.next(2) ? H : 1, in.next(2) ? Sq : 1, Sk});
  if (in.next(4) == 0) o.lse = view<simdattn::TensorView>(in, lse.data(), DType::f32, {B, H, Sq, 1});
  if (in.next(5) == 0) o.scores = view<simdattn::TensorView>(in, scores.data(), t, {B, H, Sq, Sk});
  const auto qv = view<simdattn::ConstTensorView>(in, q.data(), t, {B, H, Sq, D});
  const auto kv = view<simdattn::ConstTensorView>(in, k.data(), t, {B, Hkv, Sk, D});
  const auto vv = view<simdattn::ConstTensorView>(in, v.data(), t, {B, Hkv, Sk, Dv});
  const auto ov = view<simdattn::TensorView>(in, out.data(), t, {B, H, Sq, Dv});
  if (qv.empty() || kv.empty() || vv.empty() || ov.empty()) return 0;
  try {
    simdattn::attention(qv, kv, vv, ov, o);
  } catch (const simdattn::Error&) {
  }
  return 0;
}
