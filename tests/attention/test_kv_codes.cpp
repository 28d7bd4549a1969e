// attention() over 8-bit K and V codes (int8, fp8_e4m3, fp8_e5m2): quantize_kv / dequantize_kv
// against the formats, the native and reference backends against the reference on the
// dequantized K and V (f32, computed in double), decode and prefill shapes, every option, q in
// f32, bf16 and f16, strided codes, 1/2/3 threads bitwise equal, the path each shape takes, and
// every bad argument named.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/native/native.hpp"
#include "core/validate/validate.hpp"
#include "simdattn/simd/kernels.hpp"
#include "simdattn/simdattn.hpp"
#include "support/test_util.hpp"

namespace {

using namespace simdattn;
using test::Buffer;

constexpr DType kCodes[] = {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2};

// Codes of x [B, Hkv, S, D] (laid out with row_pad unused bytes after each row) and their scales.
struct Coded {
  Buffer<std::uint8_t> codes;
  Buffer<float> scales;
  DType dtype;
  ConstTensorView view() const {
    ConstTensorView v = codes.cview();
    v.dtype = dtype;
    return v;
  }
};

Coded quantize(const Buffer<float>& x, DType code, std::int64_t row_pad = 0) {
  Coded c{Buffer<std::uint8_t>(x.shape, false, row_pad), Buffer<float>({x.shape[0], x.shape[1], x.shape[2], 1}), code};
  TensorView cv = c.codes.view();
  cv.dtype = code;
  quantize_kv(x.cview(), code, cv, c.scales.view());
  return c;
}

Buffer<float> dequantize(const Coded& c) {
  Buffer<float> out(c.codes.shape);
  dequantize_kv(c.view(), c.scales.cview(), out.view());
  return out;
}

template <class T>
Buffer<T> run(Backend be, const Buffer<T>& q, const Coded& k, const Coded& v, AttentionOptions opt) {
  opt.backend = be;
  opt.k_scale = k.scales.cview();
  opt.v_scale = v.scales.cview();
  Buffer<T> out({q.shape[0], q.shape[1], q.shape[2], v.codes.shape[3]});
  attention(q.cview(), k.view(), v.view(), out.view(), opt);
  return out;
}

// f() throws Error naming `argument`, its message holding `part`.
template <class F>
void check_error(const std::string& argument, F&& f, const std::string& part = "") {
  try {
    f();
    FAIL("no error; expected one naming ", argument);
  } catch (const Error& e) {
    CHECK_MESSAGE(e.argument() == argument, e.what());
    CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
  }
}

// x in another dtype (rounded to nearest even), the same layout.
template <class T>
Buffer<T> rounded(const Buffer<float>& x) {
  Buffer<T> r;
  r.shape = x.shape, r.strides = x.strides;
  for (float e : x.data) r.data.push_back(detail::narrow<T>(double(e)));
  return r;
}

template <class T>
Buffer<T> random_q(std::mt19937_64& rng, Shape4 s) {
  Buffer<T> q(s);
  q.fill_normal(rng);
  return q;
}

}  // namespace

TEST_CASE("quantize_kv / dequantize_kv: the formats, strided views, a NaN row refused before anything is written") {
  std::mt19937_64 rng(test::base_seed() + 370);
  Buffer<float> x({2, 3, 5, 40});
  x.fill_normal(rng);
  for (DType code : kCodes) {
    CAPTURE(dtype_name(code));
    const Coded c = quantize(x, code, 3);  // rows 43 bytes apart
    const Buffer<float> back = dequantize(c);
    for (std::int64_t a = 0; a < 2; ++a)
      for (std::int64_t b = 0; b < 3; ++b)
        for (std::int64_t s = 0; s < 5; ++s) {
          float mx = 0;
          for (std::int64_t d = 0; d < 40; ++d) mx = std::max(mx, std::fabs(x.at(a, b, s, d)));
          const float sc = mx / (code == DType::int8 ? 127.0f : code == DType::fp8_e4m3 ? 448.0f : 57344.0f);
          CHECK(c.scales.at(a, b, s, 0) == sc);
          double worst = 0;
          for (std::int64_t d = 0; d < 40; ++d) worst = std::max(worst, std::fabs(double(back.at(a, b, s, d)) - x.at(a, b, s, d)));
          // half a step of the code grid at the row's largest value, at most
          CHECK(worst <= mx * (code == DType::int8 ? 0.5 / 127 : code == DType::fp8_e4m3 ? 1.0 / 16 : 1.0 / 8) + 1e-30);
        }
    // bf16 input: quantized as the f32 values it holds
    const Buffer<bfloat16> xb = rounded<bfloat16>(x);
    Buffer<float> xf({2, 3, 5, 40});
    xf.for_each([&](float& e, auto a, auto b, auto s, auto d) { e = to_float(xb.at(a, b, s, d)); });
    Coded cb{Buffer<std::uint8_t>(x.shape), Buffer<float>({2, 3, 5, 1}), code};
    TensorView cbv = cb.codes.view();
    cbv.dtype = code;
    quantize_kv(xb.cview(), code, cbv, cb.scales.view());
    const Coded cf = quantize(xf, code);
    CHECK(cb.codes.data == cf.codes.data);
    CHECK(cb.scales.data == cf.scales.data);
    // NaN / inf: Error("x") naming the row, codes and scales untouched
    for (float poison : {NAN, INFINITY}) {
      Buffer<float> y = x;
      y.at(1, 2, 4, 7) = poison;
      Coded d{Buffer<std::uint8_t>(x.shape), Buffer<float>({2, 3, 5, 1}), code};
      std::fill(d.codes.data.begin(), d.codes.data.end(), std::uint8_t{0xaa});
      std::fill(d.scales.data.begin(), d.scales.data.end(), -1.0f);
      TensorView dv = d.codes.view();
      dv.dtype = code;
      check_error("x", [&] { quantize_kv(y.cview(), code, dv, d.scales.view()); }, "[1, 2, 4]");
      CHECK(std::all_of(d.codes.data.begin(), d.codes.data.end(), [](std::uint8_t e) { return e == 0xaa; }));
      CHECK(std::all_of(d.scales.data.begin(), d.scales.data.end(), [](float e) { return e == -1.0f; }));
    }
    // bad arguments
    Buffer<float> bad_scales({2, 3, 5, 2}), scales({2, 3, 5, 1});
    Buffer<std::uint8_t> codes(x.shape);
    TensorView codes_v = codes.view();
    codes_v.dtype = code;
    check_error("code", [&] { quantize_kv(x.cview(), DType::f32, codes_v, scales.view()); });
    check_error("codes", [&] { quantize_kv(x.cview(), code, codes.view(), scales.view()); });
    check_error("scales", [&] { quantize_kv(x.cview(), code, codes_v, bad_scales.view()); });
    Buffer<float> neg({2, 3, 5, 1});
    neg.at(0, 1, 2, 0) = -0.5f;
    Buffer<float> out(x.shape);
    check_error("scales", [&] { dequantize_kv(c.view(), neg.cview(), out.view()); }, "[0, 1, 2]");
  }
}

TEST_CASE("attention over 8-bit K/V codes: native and reference against the dequantized K/V, every option, q dtypes") {
  std::mt19937_64 rng(test::base_seed() + 371);
  struct Shape {
    std::int64_t B, H, Hkv, Sq, Sk, D, Dv;
  };
  const Shape shapes[] = {{2, 4, 2, 1, 300, 64, 64}, {1, 8, 8, 1, 77, 40, 24}, {1, 4, 1, 3, 129, 128, 128},
                          {2, 2, 2, 70, 200, 32, 48}, {1, 4, 2, 33, 33, 64, 64}};
  for (DType code : kCodes) {
    CAPTURE(dtype_name(code));
    for (const Shape& s : shapes) {
      CAPTURE(s.Sq);
      CAPTURE(s.Sk);
      CAPTURE(s.D);
      Buffer<float> k({s.B, s.Hkv, s.Sk, s.D}), v({s.B, s.Hkv, s.Sk, s.Dv});
      k.fill_normal(rng), v.fill_normal(rng);
      const Coded kc = quantize(k, code, s.Sk % 2), vc = quantize(v, code);
      const Buffer<float> kh = dequantize(kc), vh = dequantize(vc);
      const Buffer<float> q = random_q<float>(rng, {s.B, s.H, s.Sq, s.D});
      std::vector<float> slopes = standard_alibi_slopes(s.H), sinks(static_cast<std::size_t>(s.H), 0.5f);
      std::vector<std::int64_t> lens(static_cast<std::size_t>(s.B), s.Sk - 5);
      for (int option = 0; option < 6; ++option) {
        CAPTURE(option);
        AttentionOptions o;
        if (option == 1) o.causal = Causal::bottom_right;
        if (option == 2) o.window = Window{40, 0}, o.key_lengths = lens;
        if (option == 3) o.softcap = 20.0, o.alibi_slopes = slopes, o.sinks = sinks, o.causal = Causal::bottom_right;
        Buffer<float> lse({s.B, s.H, s.Sq, 1});
        if (option == 4) o.lse = lse.view(), o.scale = 0.3;
        Buffer<std::uint8_t> mask({1, 1, s.Sq, s.Sk});
        if (option == 5) {
          for (auto& m : mask.data) m = (rng() % 5) != 0;
          o.mask = mask.cview();
        }
        const Buffer<float> want = test::run_attention(Backend::reference, q, kh, vh, o);
        const double tol = test::tolerance<float>(test::max_abs(vh));
        const Buffer<float> ref = run(Backend::reference, q, kc, vc, o);
        CHECK(test::max_abs_diff(ref, want) <= tol);
        AttentionOptions o1 = o, o2 = o, o3 = o;
        o1.threads = 1, o2.threads = 2, o3.threads = 3;
        Buffer<float> lse2({s.B, s.H, s.Sq, 1}), lse3({s.B, s.H, s.Sq, 1});
        if (option == 4) o2.lse = lse2.view(), o3.lse = lse3.view();
        const Buffer<float> n1 = run(Backend::native, q, kc, vc, o1), n2 = run(Backend::native, q, kc, vc, o2),
                            n3 = run(Backend::native, q, kc, vc, o3);
        CHECK(test::max_abs_diff(n1, want) <= tol);
        CHECK(n1.data == n2.data);
        CHECK(n1.data == n3.data);
        if (option == 4) CHECK(lse2.data == lse3.data);
      }
      // q in bf16 and f16: against the reference on the same q and the dequantized K/V
      const Buffer<bfloat16> qbb = rounded<bfloat16>(q);
      const Buffer<float16> qh = rounded<float16>(q);
      Buffer<float> qbf(q.shape), qhf(q.shape);
      for (std::size_t i = 0; i < q.data.size(); ++i) qbf.data[i] = to_float(qbb.data[i]), qhf.data[i] = to_float(qh.data[i]);
      const Buffer<float> wb = test::run_attention(Backend::reference, qbf, kh, vh), wh = test::run_attention(Backend::reference, qhf, kh, vh);
      CHECK(test::max_abs_diff(run(Backend::native, qbb, kc, vc, {}), wb) <= test::tolerance<bfloat16>(test::max_abs(vh)));
      CHECK(test::max_abs_diff(run(Backend::native, qh, kc, vc, {}), wh) <= test::tolerance<float16>(test::max_abs(vh)));
    }
  }
}

TEST_CASE("attention over 8-bit K/V codes: the native path of each shape") {
  std::mt19937_64 rng(test::base_seed() + 372);
  Buffer<float> k({1, 2, 100, 64}), v({1, 2, 100, 64});
  k.fill_normal(rng), v.fill_normal(rng);
  const Coded kc = quantize(k, DType::int8), vc = quantize(v, DType::int8), kp = quantize(k, DType::int8, 5);
  auto path = [&](std::int64_t Sq, const Coded& kk, const AttentionOptions& o = {}) {
    const Buffer<float> q = random_q<float>(rng, {1, 4, Sq, 64});
    Buffer<float> out({1, 4, Sq, 64});
    AttentionOptions oo = o;
    oo.k_scale = kk.scales.cview(), oo.v_scale = vc.scales.cview();
    const detail::Problem p = detail::make_problem(q.cview(), kk.view(), vc.view(), out.view(), oo);
    return std::string(detail::choose_native_path(p).path->name);
  };
  CHECK(path(1, kc) == "decode8");
  CHECK(path(1, kp) == "decode8");  // padded rows: the row stride is free
  CHECK(path(64, kc) == "fused");
  {  // bf16 q: the block's codes dequantized into the tiles' bf16 pairs where the table has tile kernels
    const Buffer<bfloat16> q = rounded<bfloat16>(random_q<float>(rng, {1, 4, 64, 64}));
    Buffer<bfloat16> out({1, 4, 64, 64});
    AttentionOptions o;
    o.k_scale = kc.scales.cview(), o.v_scale = vc.scales.cview();
    const detail::Problem p = detail::make_problem(q.cview(), kc.view(), vc.view(), out.view(), o);
    const simd::KernelTable& kt = simd::kernels();
    const bool tiles = kt.tile_attention.block != nullptr && kt.tile_attention.softmax_rows != nullptr;
    CHECK(std::string(detail::choose_native_path(p).path->name) == (tiles ? "fused.tiles" : "fused"));
  }
  AttentionOptions sinks;
  const std::vector<float> s(4, 0.0f);
  sinks.sinks = s;
  CHECK(path(1, kc, sinks) == "decode8");  // the decode paths apply sinks (and lse)
  AttentionOptions capped;
  capped.softcap = 20.0;
  CHECK(path(1, kc, capped) == "fused");  // not score modifiers
}

TEST_CASE("attention over 8-bit K/V codes: bad arguments named") {
  std::mt19937_64 rng(test::base_seed() + 373);
  Buffer<float> k({1, 2, 10, 16}), v({1, 2, 10, 16});
  k.fill_normal(rng), v.fill_normal(rng);
  const Coded kc = quantize(k, DType::int8), vc = quantize(v, DType::int8), v8 = quantize(v, DType::fp8_e4m3);
  const Buffer<float> q = random_q<float>(rng, {1, 2, 1, 16});
  Buffer<float> out({1, 2, 1, 16});
  auto call = [&](const ConstTensorView& kk, const ConstTensorView& vv, AttentionOptions o) {
    attention(q.cview(), kk, vv, out.view(), o);
  };
  AttentionOptions ok;
  ok.k_scale = kc.scales.cview(), ok.v_scale = vc.scales.cview();
  AttentionOptions no_k = ok, no_v = ok;
  no_k.k_scale = {}, no_v.v_scale = {};
  check_error("options.k_scale", [&] { call(kc.view(), vc.view(), no_k); }, "required");
  check_error("options.v_scale", [&] { call(kc.view(), vc.view(), no_v); }, "required");
  check_error("v", [&] { call(kc.view(), v8.view(), ok); }, "differs");
  check_error("options.k_scale", [&] { call(k.cview(), v.cview(), ok); }, "only 8-bit");
  Buffer<float> wrong({1, 2, 9, 1});
  AttentionOptions bad_shape = ok;
  bad_shape.k_scale = wrong.cview();
  check_error("options.k_scale", [&] { call(kc.view(), vc.view(), bad_shape); }, "shape");
  for (float x : {-1.0f, NAN, INFINITY}) {
    Buffer<float> sc = vc.scales;
    sc.at(0, 1, 3, 0) = x;
    AttentionOptions o = ok;
    o.v_scale = sc.cview();
    std::fill(out.data.begin(), out.data.end(), 7.0f);
    check_error("options.v_scale", [&] { call(kc.view(), vc.view(), o); }, "[0, 1, 3]");
    CHECK(std::all_of(out.data.begin(), out.data.end(), [](float e) { return e == 7.0f; }));
  }
  const Buffer<double> q64 = rounded<double>(q);
  Buffer<double> out64({1, 2, 1, 16});
  check_error("q", [&] { attention(q64.cview(), kc.view(), vc.view(), out64.view(), ok); }, "f64");
  CHECK_FALSE(backend_takes(Backend::onednn, DType::int8));
  if (backend_available(Backend::onednn)) {
    AttentionOptions o = ok;
    o.backend = Backend::onednn;
    check_error("options.backend", [&] { call(kc.view(), vc.view(), o); }, "8-bit");
  }
}
