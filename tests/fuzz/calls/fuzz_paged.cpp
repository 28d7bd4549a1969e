// libFuzzer target: attention_paged()'s and merge_attention_states()'s validation and kernels on
// arguments taken from the input: block tables with any entries, row lengths and strides,
// seq_lens and query_start of any values, tree masks of any size with or without their starts,
// 8-bit caches with or without scales, lse outputs that overlap others, every option, over small
// real buffers (views that would reach past a buffer are not made: the library cannot know a
// caller's buffer sizes). Each call must compute or throw simdattn::Error (writing nothing then),
// and never read or write outside the buffers (AddressSanitizer); attention_paged's result must be
// bitwise the one it gives on one thread.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "fuzz_input.hpp"
#include "simdattn/error.hpp"
#include "simdattn/paged.hpp"

namespace {

constexpr std::size_t kElems = 8192;  // every buffer, in elements of 8 bytes

// A view of `buf + offset` with shape and strides from the input, or an empty view.
template <class View, class Ptr>
View view(Bytes& in, Ptr buf, simdattn::DType t, const simdattn::Shape4& shape, std::size_t offset = 0) {
  return fuzz_view<View>(in, buf, kElems, t, shape, offset, 6);
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_paged: %s\n", what);
  std::abort();
}

// f32 values the library must refuse (scales) or carry through (states), written over a buffer of
// doubles at f32 element i.
const float kBadF32[] = {-1.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
void put_f32(std::vector<double>& buf, std::size_t i, float x) {
  std::memcpy(reinterpret_cast<unsigned char*>(buf.data()) + i * sizeof(float), &x, sizeof x);
}

void fuzz_paged(Bytes& in) {
  static std::vector<double> q(kElems, 0.5), k(kElems, -0.25), v(kElems, 1.0), out(kElems), lse(kElems),
      scales(kElems, 0.03125);
  using simdattn::DType;
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  const DType codes[] = {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2};
  const DType t = dtypes[in.next(4)];
  const DType cache_t = in.next(3) == 0 ? codes[in.next(3)] : (in.next(8) == 0 ? dtypes[in.next(4)] : t);
  const std::int64_t Hkv = in.in(1, 3), H = Hkv * in.in(1, 3) + (in.next(16) == 0 ? 1 : 0);
  const std::int64_t D = in.in(0, 9), Dv = in.in(1, 9), num_blocks = in.in(0, 6), bs = in.in(1, 17);
  const std::int64_t N = in.in(0, 4);

  // the block table: entries mostly in range, sometimes not
  const std::int64_t cols = in.in(0, 5), row_stride = in.next(4) == 0 ? in.in(0, 7) : 0;
  std::vector<std::int32_t> table(static_cast<std::size_t>(N * (cols + 8) + 8));
  for (auto& e : table)
    e = in.next(12) == 0 ? static_cast<std::int32_t>(in.in(-2, 9))
                         : static_cast<std::int32_t>(in.in(0, num_blocks > 0 ? num_blocks - 1 : 0));
  const simdattn::BlockTable bt{in.next(16) == 0 ? nullptr : table.data(), in.next(10) == 0 ? in.in(0, 5) : N, cols,
                                row_stride};
  std::vector<std::int64_t> seq_lens(static_cast<std::size_t>(in.next(10) == 0 ? in.in(0, 5) : N));
  for (auto& l : seq_lens) l = in.next(10) == 0 ? in.in(-3, 100) : in.in(0, cols * bs);

  simdattn::PagedAttentionOptions o;
  std::vector<std::int64_t> query_start;
  std::int64_t total_q = N;
  if (in.next(2)) {  // prompt chunks or trees: q_len_i tokens each
    query_start.push_back(in.next(10) == 0 ? in.in(-1, 2) : 0);
    const std::int64_t rows = N + (in.next(10) == 0 ? 1 : 0);
    for (std::int64_t i = 0; i < rows; ++i)
      query_start.push_back(query_start.back() + (in.next(10) == 0 ? in.in(-2, 3) : in.in(0, 6)));
    total_q = query_start.back();
    if (in.next(10) == 0) total_q += in.in(-1, 1);
    o.query_start = query_start;
  }
  o.backend = in.next(5) == 0 ? simdattn::Backend::reference : simdattn::Backend::native;
  o.threads = static_cast<int>(in.next(4));
  o.causal = static_cast<simdattn::Causal>(in.next(3));
  if (in.next(3) == 0) o.scale = static_cast<double>(in.next(9)) - 2.0;
  if (in.next(6) == 0) o.window = simdattn::Window{in.in(-2, 4), in.in(-2, 4)};
  if (in.next(5) == 0) o.softcap = static_cast<double>(in.next(5));
  std::vector<float> slopes, sinks;
  if (in.next(6) == 0) {
    slopes.assign(static_cast<std::size_t>(H + in.next(2)), 0.25f);
    o.alibi_slopes = slopes;
  }
  if (in.next(4) == 0) {
    sinks.assign(static_cast<std::size_t>(H + (in.next(8) == 0 ? 1 : 0)), in.next(8) == 0 ? -1e30f : 0.5f);
    o.sinks = sinks;
  }
  std::vector<std::uint8_t> mask;
  std::vector<std::int64_t> mask_start;
  if (in.next(2)) {  // a tree mask, its size mostly the sum of q_len_i^2
    std::size_t want = 0;
    for (std::size_t i = 0; i + 1 < query_start.size(); ++i) {
      const std::int64_t len = query_start[i + 1] - query_start[i];
      want += static_cast<std::size_t>(len > 0 ? len * len : 0);
    }
    mask.resize(in.next(8) == 0 ? in.next(40) : want + (in.next(4) == 0 ? in.next(5) : 0));
    for (auto& m : mask) m = static_cast<std::uint8_t>(in.next(3) == 0 ? 0 : in.next(4));
    o.tree_mask = mask;
    if (in.next(3) == 0) {
      mask_start.push_back(in.next(6) == 0 ? in.in(-1, 2) : 0);
      const std::size_t starts =
          (query_start.empty() ? static_cast<std::size_t>(N) : query_start.size() - 1) + (in.next(10) == 0 ? 1 : 0);
      for (std::size_t i = 0; i < starts; ++i) {
        const std::int64_t len = i + 1 < query_start.size() ? query_start[i + 1] - query_start[i] : 1;
        mask_start.push_back(mask_start.back() + (in.next(8) == 0 ? in.in(-1, 5) : len * len));
      }
      o.tree_mask_start = mask_start;
    }
  }
  const simdattn::Shape4 cache_shape{num_blocks, bs, Hkv, D}, vcache_shape{num_blocks, bs, Hkv, Dv};
  if (simdattn::is_kv_code(cache_t) || in.next(16) == 0) {
    if (in.next(8) == 0) put_f32(scales, in.next(128), kBadF32[in.next(4)]);  // a scale < 0 or not finite
    o.k_scale = view<simdattn::ConstTensorView>(in, scales.data(), DType::f32,
                                                {num_blocks, bs, Hkv, in.in(0, 1) + (in.next(8) == 0 ? 1 : 0)});
    if (in.next(10) != 0)
      o.v_scale = view<simdattn::ConstTensorView>(in, scales.data(), DType::f32, {num_blocks, bs, Hkv, 1});
  }
  if (in.next(3) == 0) {  // the lse output, sometimes overlapping out or of the wrong shape
    const bool over = in.next(6) == 0;
    o.lse = view<simdattn::TensorView>(in, over ? out.data() : lse.data(), DType::f32,
                                       {1, total_q + (in.next(10) == 0 ? 1 : 0), H, 1}, over ? in.next(16) : 0);
  }
  const auto qv = view<simdattn::ConstTensorView>(in, q.data(), t, {1, total_q, H, D});
  const auto kv = view<simdattn::ConstTensorView>(in, k.data(), cache_t, cache_shape);
  const auto vv = view<simdattn::ConstTensorView>(in, v.data(), cache_t, vcache_shape);
  const bool out_on_q = in.next(16) == 0;  // out overlapping an input: an Error
  const auto ov = view<simdattn::TensorView>(in, out_on_q ? q.data() : out.data(), t, {1, total_q, H, Dv});
  if ((qv.empty() && total_q * H * D != 0) || ov.empty()) return;
  const std::vector<double> q0 = q, out0 = out, lse0 = lse;
  try {
    simdattn::attention_paged(qv, kv, vv, bt, seq_lens, ov, o);
  } catch (const simdattn::Error&) {
    if (!same_bytes(q, q0) || !same_bytes(out, out0) || !same_bytes(lse, lse0))
      fail("attention_paged: an Error, and an output written");
    if (out_on_q) q.assign(kElems, 0.5);
    scales.assign(kElems, 0.03125);
    return;
  }
  // bitwise the same at any thread count: again on one thread, into copies of out and lse
  if (o.threads != 1 && !out_on_q) {
    std::vector<double> out1 = out0, lse1 = lse0;
    auto moved = [&](const simdattn::TensorView& w) {
      for (auto [from, to] : {std::pair{&out, &out1}, std::pair{&lse, &lse1}}) {
        const auto at = static_cast<std::ptrdiff_t>(reinterpret_cast<std::uintptr_t>(w.data) -
                                                    reinterpret_cast<std::uintptr_t>(from->data()));
        if (at >= 0 && static_cast<std::size_t>(at) < kElems * 8)
          return simdattn::TensorView(reinterpret_cast<char*>(to->data()) + at, w.dtype, w.shape, w.strides);
      }
      return w;
    };
    simdattn::PagedAttentionOptions o1 = o;
    o1.threads = 1;
    if (!o.lse.empty()) o1.lse = moved(o.lse);
    simdattn::attention_paged(qv, kv, vv, bt, seq_lens, moved(ov), o1);
    if (!same_bytes(out, out1) || !same_bytes(lse, lse1)) fail("attention_paged: one thread's result differs");
  }
  if (out_on_q) q.assign(kElems, 0.5);
  scales.assign(kElems, 0.03125);
}

void fuzz_merge(Bytes& in) {
  static std::vector<double> a(kElems, 0.5), b(kElems, -1.0), la(kElems, 0.0), lb(kElems, -2.0), o(kElems), lo(kElems);
  using simdattn::DType;
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  const DType t = dtypes[in.next(4)];
  const std::int64_t T = in.in(0, 9), H = in.in(0, 4), Dv = in.in(0, 9);
  auto shape = [&](std::int64_t last) {
    simdattn::Shape4 s{1, T, H, last};
    if (in.next(12) == 0) s[static_cast<std::size_t>(in.next(4))] += in.in(-1, 1);
    return s;
  };
  const auto ova = view<simdattn::ConstTensorView>(in, a.data(), in.next(12) == 0 ? dtypes[in.next(4)] : t, shape(Dv));
  const auto ovb = view<simdattn::ConstTensorView>(in, b.data(), t, shape(Dv));
  const auto lva = view<simdattn::ConstTensorView>(in, la.data(), in.next(16) == 0 ? DType::f64 : DType::f32, shape(1));
  const auto lvb = view<simdattn::ConstTensorView>(in, lb.data(), DType::f32, shape(1));
  // out and lse: their own buffers, in place over a's or b's, or overlapping them partly
  const unsigned where = in.next(4), lwhere = in.next(4);
  const std::size_t off = in.next(8) == 0 ? in.next(7) + 1 : 0;
  double* obuf = where == 1 ? a.data() : where == 2 ? b.data() : where == 3 ? la.data() : o.data();
  double* lbuf = lwhere == 1 ? la.data() : lwhere == 2 ? lb.data() : lwhere == 3 ? a.data() : lo.data();
  const auto ov = view<simdattn::TensorView>(in, obuf, t, shape(Dv), off);
  const auto lv = view<simdattn::TensorView>(in, lbuf, DType::f32, shape(1), in.next(8) == 0 ? in.next(3) + 1 : 0);
  if (in.next(6) == 0) put_f32(la, in.next(64), kBadF32[in.next(4)]);  // -inf, inf or NaN states
  const std::vector<double> a0 = a, b0 = b, la0 = la, lb0 = lb, o0 = o, lo0 = lo;
  try {
    simdattn::merge_attention_states(ova, lva, ovb, lvb, ov, lv);
  } catch (const simdattn::Error&) {
    if (!same_bytes(a, a0) || !same_bytes(b, b0) || !same_bytes(la, la0) || !same_bytes(lb, lb0) ||
        !same_bytes(o, o0) || !same_bytes(lo, lo0))
      fail("merge_attention_states: an Error, and an output written");
  }
  a.assign(kElems, 0.5);
  b.assign(kElems, -1.0);
  la.assign(kElems, 0.0);
  lb.assign(kElems, -2.0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in{data, size};
  if (in.next(4) == 0)
    fuzz_merge(in);
  else
    fuzz_paged(in);
  return 0;
}
