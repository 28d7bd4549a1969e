// One engine over every key source (core/problem.hpp's KeyBlocks; docs/architecture.md, "Key
// sources"): the decode paths take a group's query rows as one matrix (GQA, MQA, MLA-shaped with V
// a view of K, a speculative step's few tokens) in every dtype and 8-bit code; a problem with
// few units splits its keys on every path (work.hpp); and keys in blocks of a paged cache give
// the same bits as the same keys dense, on the same path. Each against the reference backend
// (float64 sums), bitwise identical at 1, 2 and 3 threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/native/native.hpp"
#include "core/validate/validate.hpp"
#include "support/test_util.hpp"

namespace simdattn::test {
namespace {

struct Shape {
  std::int64_t H, Hkv, Sq, Sk, D, Dv;
  bool v_of_k = false;  // V a view of K's first Dv columns (MLA's latent cache)
};

template <class T>
bool same_bits(const Buffer<T>& a, const Buffer<T>& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(T)) == 0;
}

std::string path_of(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const TensorView& o,
                    const AttentionOptions& opt) {
  return std::string(detail::choose_native_path(detail::make_problem(q, k, v, o, opt)).path->name);
}

// Inputs of a shape in T (or, with code, 8-bit K and V codes and their scales, q f32), B = 2.
template <class T>
struct Inputs {
  Shape s;
  Buffer<T> q, k, v;                     // K and V in T (code: their f32 values before quantizing)
  std::vector<std::uint8_t> kc, vc;      // 8-bit codes
  Buffer<float> ks, vs;                  // their scales
  DType code = DType::f32;
  Inputs(const Shape& shape, std::mt19937_64& rng, DType c = DType::f32) : s(shape), code(c) {
    q = Buffer<T>({2, s.H, s.Sq, s.D});
    k = Buffer<T>({2, s.Hkv, s.Sk, s.D});
    v = Buffer<T>({2, s.Hkv, s.Sk, s.Dv});
    q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng);
    if (!is_kv_code(code)) return;
    kc.resize(k.data.size()), vc.resize(v.data.size());
    ks = Buffer<float>({2, s.Hkv, s.Sk, 1}), vs = Buffer<float>({2, s.Hkv, s.Sk, 1});
    quantize_kv(k.cview(), code, TensorView(kc.data(), code, k.shape), ks.view());
    quantize_kv(v.cview(), code, TensorView(vc.data(), code, v.shape), vs.view());
  }
  ConstTensorView kview() const { return is_kv_code(code) ? ConstTensorView(kc.data(), code, k.shape) : k.cview(); }
  ConstTensorView vview() const {
    const ConstTensorView kv = kview();
    if (s.v_of_k) return ConstTensorView(kv.data, kv.dtype, {2, s.Hkv, s.Sk, s.Dv}, kv.strides);
    return is_kv_code(code) ? ConstTensorView(vc.data(), code, v.shape) : v.cview();
  }
  void add_scales(AttentionOptions& opt) const {
    if (!is_kv_code(code)) return;
    opt.k_scale = ks.cview();
    opt.v_scale = s.v_of_k ? ks.cview() : vs.cview();
  }
  double max_v() const { return s.v_of_k ? max_abs(k) : max_abs(v); }
};

// The option sets a decode step is checked with: bottom-right causal with sinks and lse; a
// window; the second sequence shorter (key lengths).
struct Options {
  AttentionOptions opt;
  std::vector<float> sinks, lse;
  std::vector<std::int64_t> lengths;
};
std::vector<Options> option_sets(const Shape& s, std::mt19937_64& rng) {
  std::vector<Options> out(3);
  out[0].sinks = normal(rng, static_cast<std::size_t>(s.H), 1.0f);
  out[0].lse.resize(static_cast<std::size_t>(2 * s.H * s.Sq));
  out[1].lengths = {s.Sk, std::max<std::int64_t>(s.Sq, s.Sk - 37)};
  for (Options& o : out) {
    o.opt.causal = Causal::bottom_right;
    if (!o.sinks.empty()) o.opt.sinks = o.sinks, o.opt.lse = TensorView(o.lse.data(), {2, s.H, s.Sq, 1});
    if (!o.lengths.empty()) o.opt.key_lengths = o.lengths;
  }
  out[2].opt.window = Window{50, 0};
  return out;
}

// Every option set: native against the reference, the same bits at 1, 2 and 3 threads, on `path`.
template <class T>
void check_shape(const Inputs<T>& in, const std::string& path, std::mt19937_64& rng) {
  const Shape& s = in.s;
  int set = 0;
  for (Options o : option_sets(s, rng)) {
    CAPTURE(set++);
    if (!o.lse.empty()) o.opt.lse = TensorView(o.lse.data(), {2, s.H, s.Sq, 1});
    in.add_scales(o.opt);
    const std::vector<float> lse_native = o.lse;
    Buffer<T> ref({2, s.H, s.Sq, s.Dv});
    o.opt.backend = Backend::reference;
    attention(in.q.cview(), in.kview(), in.vview(), ref.view(), o.opt);
    const std::vector<float> lse_ref = o.lse;
    o.opt.backend = Backend::native;
    Buffer<T> one({2, s.H, s.Sq, s.Dv});
    o.opt.threads = 1;
    CHECK(path_of(in.q.cview(), in.kview(), in.vview(), one.view(), o.opt) == path);
    attention(in.q.cview(), in.kview(), in.vview(), one.view(), o.opt);
    CHECK(max_abs_diff(one, ref) <= tolerance<T>(in.max_v()));
    for (std::size_t i = 0; i < o.lse.size(); ++i) CHECK(std::abs(o.lse[i] - lse_ref[i]) <= 1e-4 * (1.0 + std::abs(lse_ref[i])));
    for (int threads : {2, 3}) {
      Buffer<T> again({2, s.H, s.Sq, s.Dv});
      o.opt.threads = threads;
      attention(in.q.cview(), in.kview(), in.vview(), again.view(), o.opt);
      CHECK(same_bits(again, one));
    }
  }
}

// Grouped heads of a few tokens: GQA (8 rows a kv head: the few-rows kernels), MQA (16 rows: the
// stacked tile path), MLA-shaped (D 576, Dv 512, V a view of K), a speculative step's tokens (rows
// = heads x tokens), odd sizes, 128 heads of one kv head, 16 tokens of 4 heads.
const Shape kShapes[] = {
    {32, 8, 1, 700, 64, 64},  {16, 1, 1, 1500, 64, 48}, {16, 1, 1, 300, 576, 512, true}, {12, 4, 3, 257, 32, 32},
    {8, 2, 2, 130, 40, 24},   {6, 3, 5, 90, 17, 33},     {128, 1, 1, 200, 32, 32},        {4, 1, 16, 80, 16, 16},
};

template <class T>
void check_decode_shapes(const char* path, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (const Shape& s : kShapes) {
    CAPTURE(s.H); CAPTURE(s.Hkv); CAPTURE(s.Sq); CAPTURE(s.Sk); CAPTURE(s.D);
    check_shape(Inputs<T>(s, rng), path, rng);
  }
}

TEST_CASE("decode paths: a group's query rows as one matrix (GQA, MQA, MLA with V a view of K, draft tokens), f32 and f64") {
  check_decode_shapes<float>("decode", base_seed() + 301);
  check_decode_shapes<double>("decode", base_seed() + 302);
}

TEST_CASE("decode paths: grouped rows over bf16 and f16 K and V") {
  check_decode_shapes<bfloat16>("decode16", base_seed() + 303);
  check_decode_shapes<float16>("decode16", base_seed() + 304);
}

TEST_CASE("decode paths: grouped rows over 8-bit K and V codes (int8, fp8_e4m3, fp8_e5m2)") {
  std::mt19937_64 rng(base_seed() + 305);
  for (DType code : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    CAPTURE(dtype_name(code));
    for (const Shape& s : kShapes) {
      CAPTURE(s.H); CAPTURE(s.Hkv); CAPTURE(s.Sq); CAPTURE(s.Sk); CAPTURE(s.D);
      check_shape(Inputs<float>(s, rng, code), "decode8", rng);
    }
  }
}

// A few tokens (17 to 32) of grouped heads on the fused path, the group's heads stacked into units
// (work.hpp's add_stacked_units): 4 heads of 17 tokens one unit of 68 rows; 8 of 24 two of 96; 6 of
// 32 two of 96; MQA's 64 heads of 32 sixteen of 128; 2 of 20 one of 40.
const Shape kStackedShapes[] = {
    {32, 8, 17, 400, 64, 64}, {16, 2, 24, 300, 40, 24}, {12, 2, 32, 257, 32, 48}, {64, 1, 32, 200, 32, 32}, {6, 3, 20, 90, 17, 33},
};

template <class T>
detail::Problem problem_of(const Inputs<T>& in, AttentionOptions opt = {}) {
  static thread_local std::vector<T> out;
  out.assign(static_cast<std::size_t>(2 * in.s.H * in.s.Sq * in.s.Dv), T{});
  in.add_scales(opt);
  return detail::make_problem(in.q.cview(), in.kview(), in.vview(), TensorView(out.data(), {2, in.s.H, in.s.Sq, in.s.Dv}), opt);
}

// The fused path's name for these inputs: bf16 runs on AMX tiles where the CPU has them, one
// head's rows a block there.
template <class T>
std::string fused_name(const Inputs<T>& in) {
  return std::string(detail::choose_native_path(problem_of(in)).path->name);
}

TEST_CASE("fused path: a few tokens of grouped heads stacked (17 to 32 tokens), every dtype and 8-bit code") {
  std::mt19937_64 rng(base_seed() + 308);
  for (const Shape& s : kStackedShapes) {
    CAPTURE(s.H); CAPTURE(s.Hkv); CAPTURE(s.Sq); CAPTURE(s.Sk); CAPTURE(s.D);
    const Inputs<float> f(s, rng);
    CHECK(detail::fused_stacks_heads(problem_of(f)));
    check_shape(f, "fused", rng);
    const Inputs<bfloat16> b(s, rng);
    CHECK(detail::fused_stacks_heads(problem_of(b)) == (fused_name(b) == "fused"));
    check_shape(b, fused_name(b), rng);
    if (s.H == 6) {  // f64 and f16 on the odd sizes
      check_shape(Inputs<double>(s, rng), "fused", rng);
      check_shape(Inputs<float16>(s, rng), "fused", rng);
    }
    for (DType code : {DType::int8, DType::fp8_e4m3}) {
      CAPTURE(dtype_name(code));
      const Inputs<float> c(s, rng, code);
      CHECK(detail::fused_stacks_heads(problem_of(c)));
      check_shape(c, "fused", rng);
    }
  }
  // one head's rows a block: 33 tokens, heads that share no kv head, score modifiers
  const Inputs<float> grouped(Shape{8, 2, 24, 100, 32, 32}, rng), longer(Shape{8, 2, 33, 100, 32, 32}, rng),
      mha(Shape{8, 8, 24, 100, 32, 32}, rng);
  AttentionOptions capped;
  capped.softcap = 30.0;
  CHECK(detail::fused_stacks_heads(problem_of(grouped)));
  CHECK_FALSE(detail::fused_stacks_heads(problem_of(grouped, capped)));
  CHECK_FALSE(detail::fused_stacks_heads(problem_of(longer)));
  CHECK_FALSE(detail::fused_stacks_heads(problem_of(mha)));
}

// The inputs with batch 1's K and V rows (or codes) past key L set to NaN (nan) or zeros.
template <class T>
Inputs<T> with_tail(const Inputs<T>& in, std::int64_t L, bool nan) {
  Inputs<T> out = in;
  const Shape& s = in.s;
  for (std::int64_t hk = 0; hk < s.Hkv; ++hk)
    for (std::int64_t j = L; j < s.Sk; ++j) {
      for (std::int64_t d = 0; d < s.D; ++d) {
        out.k.at(1, hk, j, d) = value<T>(nan ? std::nan("") : 0.0);
        if (is_kv_code(in.code)) out.kc[static_cast<std::size_t>(((s.Hkv + hk) * s.Sk + j) * s.D + d)] = nan ? 0x7F : 0;
      }
      for (std::int64_t d = 0; d < s.Dv; ++d) {
        out.v.at(1, hk, j, d) = value<T>(nan ? std::nan("") : 0.0);
        if (is_kv_code(in.code)) out.vc[static_cast<std::size_t>(((s.Hkv + hk) * s.Sk + j) * s.Dv + d)] = nan ? 0x7F : 0;
      }
    }
  return out;
}

// Keys past a batch's key length are never read, on the paths few query tokens take (decode,
// decode16, decode8; fused with a group's heads stacked, and with one head's rows): K and V NaN
// there (0x7F: fp8_e4m3's NaN) give the bits of the same call with zeros there, at 1 and 2 threads.
template <class T>
void check_tails_unread(const Inputs<T>& in, std::int64_t L) {
  const Shape& s = in.s;
  const Inputs<T> poisoned = with_tail(in, L, true), clean = with_tail(in, L, false);
  const std::vector<std::int64_t> lengths = {s.Sk, L};
  AttentionOptions opt;  // no causal rule: the key lengths alone end the keys
  opt.key_lengths = lengths;
  clean.add_scales(opt);
  for (int threads : {1, 2}) {
    opt.threads = threads;
    Buffer<T> a({2, s.H, s.Sq, s.Dv}), b({2, s.H, s.Sq, s.Dv});
    attention(poisoned.q.cview(), poisoned.kview(), poisoned.vview(), a.view(), opt);
    attention(clean.q.cview(), clean.kview(), clean.vview(), b.view(), opt);
    CHECK(same_bits(a, b));
  }
  // the tails poison what reads them: batch 1 at its full length gives NaN
  const std::vector<std::int64_t> full = {s.Sk, s.Sk};
  opt.key_lengths = full;
  Buffer<T> c({2, s.H, s.Sq, s.Dv});
  attention(poisoned.q.cview(), poisoned.kview(), poisoned.vview(), c.view(), opt);
  CHECK(std::isnan(as_double(c.at(1, 0, 0, 0))));
}

TEST_CASE("key lengths: K and V past a batch's length are never read (NaN there), every path of few query tokens") {
  std::mt19937_64 rng(base_seed() + 309);
  const Shape shapes[] = {{8, 2, 1, 300, 32, 32}, {8, 2, 3, 300, 32, 40}, {8, 2, 24, 300, 32, 32}, {8, 2, 40, 300, 32, 32}};
  for (const Shape& s : shapes) {
    CAPTURE(s.Sq);
    check_tails_unread(Inputs<float>(s, rng), 170);
    check_tails_unread(Inputs<bfloat16>(s, rng), 170);
    check_tails_unread(Inputs<float>(s, rng, DType::fp8_e4m3), 170);
  }
}

TEST_CASE("split keys: a prompt block of two heads over 3000 keys splits on the fused path, every option, any thread count") {
  // 2 (head, query block) units: fewer than kSplitUnits, so each unit's keys go in parts that
  // merge in key order
  std::mt19937_64 rng(base_seed() + 306);
  const Qkv<float> t = random_qkv<float>(rng, 1, 2, 1, 40, 3000, 32, 24);
  std::vector<float> sinks = normal(rng, 2, 1.0f), lse(80), slopes = standard_alibi_slopes(2);
  Buffer<float> mask({1, 1, 40, 3000});
  mask.fill_normal(rng);
  std::vector<AttentionOptions> sets(4);
  sets[0].causal = Causal::bottom_right, sets[0].sinks = sinks, sets[0].lse = TensorView(lse.data(), {1, 2, 40, 1});
  sets[1].softcap = 20.0, sets[1].alibi_slopes = slopes;
  sets[2].mask = mask.cview();
  sets[3].window = Window{700, 30};
  for (AttentionOptions opt : sets) {
    Buffer<float> one({1, 2, 40, 24});
    CHECK(path_of(t.q.cview(), t.k.cview(), t.v.cview(), one.view(), opt) == "fused");
    const Buffer<float> ref = run_attention(Backend::reference, t.q, t.k, t.v, opt);
    opt.threads = 1;
    attention(t.q.cview(), t.k.cview(), t.v.cview(), one.view(), opt);
    CHECK(max_abs_diff(one, ref) <= tolerance<float>(max_abs(t.v)));
    for (int threads : {2, 3}) {
      Buffer<float> again({1, 2, 40, 24});
      opt.threads = threads;
      attention(t.q.cview(), t.k.cview(), t.v.cview(), again.view(), opt);
      CHECK(same_bits(again, one));
    }
  }
}

// One sequence's keys in shuffled blocks of bs (a KvPool's head-major layout) against the same keys
// dense: attention_paged and attention() give the same bits, on the same path.
template <class T>
void check_paged_equals_dense(const Shape& s, std::int64_t bs, DType code, std::mt19937_64& rng) {
  const std::int64_t blocks = (s.Sk + bs - 1) / bs + 2, L = s.Sk;
  Buffer<T> q({1, s.Sq, s.H, s.D});  // the tokens' rows, as attention_paged takes them
  q.fill_normal(rng);
  Buffer<float> kf({blocks, s.Hkv, bs, s.D}), vf({blocks, s.Hkv, bs, s.Dv});  // [block, kv head, slot, .]
  kf.fill_normal(rng), vf.fill_normal(rng);
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const bool codes = is_kv_code(code);
  const DType kv_dtype = codes ? code : dtype_of<T>();
  const std::size_t es = dtype_size(kv_dtype);
  std::vector<std::uint8_t> kb(kf.data.size() * es), vb(vf.data.size() * es);
  Buffer<float> ks({blocks, s.Hkv, bs, 1}), vs({blocks, s.Hkv, bs, 1});
  if (codes) {
    quantize_kv(kf.cview(), code, TensorView(kb.data(), code, kf.shape), ks.view());
    quantize_kv(vf.cview(), code, TensorView(vb.data(), code, vf.shape), vs.view());
  } else {
    for (std::size_t i = 0; i < kf.data.size(); ++i) reinterpret_cast<T*>(kb.data())[i] = value<T>(kf.data[i]);
    for (std::size_t i = 0; i < vf.data.size(); ++i) reinterpret_cast<T*>(vb.data())[i] = value<T>(vf.data[i]);
  }
  // paged views [blocks, bs, Hkv, .] of the head-major blocks
  const Shape4 kst{s.Hkv * bs * s.D, s.D, bs * s.D, 1}, vst{s.Hkv * bs * s.Dv, s.Dv, bs * s.Dv, 1};
  const ConstTensorView kp(kb.data(), kv_dtype, {blocks, bs, s.Hkv, s.D}, kst), vp(vb.data(), kv_dtype, {blocks, bs, s.Hkv, s.Dv}, vst);
  // the same keys dense [1, Hkv, L, .]
  std::vector<std::uint8_t> kd(static_cast<std::size_t>(s.Hkv * L * s.D) * es), vd(static_cast<std::size_t>(s.Hkv * L * s.Dv) * es);
  Buffer<float> ksd({1, s.Hkv, L, 1}), vsd({1, s.Hkv, L, 1});
  for (std::int64_t h = 0; h < s.Hkv; ++h)
    for (std::int64_t j = 0; j < L; ++j) {
      const std::int64_t blk = table[static_cast<std::size_t>(j / bs)], slot = j % bs;
      std::memcpy(kd.data() + static_cast<std::size_t>((h * L + j) * s.D) * es,
                  kb.data() + static_cast<std::size_t>(((blk * s.Hkv + h) * bs + slot) * s.D) * es, static_cast<std::size_t>(s.D) * es);
      std::memcpy(vd.data() + static_cast<std::size_t>((h * L + j) * s.Dv) * es,
                  vb.data() + static_cast<std::size_t>(((blk * s.Hkv + h) * bs + slot) * s.Dv) * es, static_cast<std::size_t>(s.Dv) * es);
      ksd.at(0, h, j, 0) = ks.at(blk, h, slot, 0), vsd.at(0, h, j, 0) = vs.at(blk, h, slot, 0);
    }
  const std::vector<float> sinks = normal(rng, static_cast<std::size_t>(s.H), 1.0f);
  PagedAttentionOptions po;
  po.sinks = sinks;
  const std::int64_t lens[1] = {L}, starts[2] = {0, s.Sq};
  if (s.Sq > 1) po.query_start = starts;
  if (codes) {  // the scales of the head-major blocks as [blocks, bs, Hkv, 1]
    po.k_scale = ConstTensorView(ks.data.data(), {blocks, bs, s.Hkv, 1}, {s.Hkv * bs, 1, bs, 1});
    po.v_scale = ConstTensorView(vs.data.data(), {blocks, bs, s.Hkv, 1}, {s.Hkv * bs, 1, bs, 1});
  }
  AttentionOptions ao;
  ao.causal = Causal::bottom_right, ao.sinks = sinks;
  if (codes) ao.k_scale = ksd.cview(), ao.v_scale = vsd.cview();
  // q and out as [1, H, Sq, .] views of the tokens' rows
  const ConstTensorView qd(q.data.data(), {1, s.H, s.Sq, s.D}, {s.Sq * s.H * s.D, s.D, s.H * s.D, 1});
  const ConstTensorView kdv(kd.data(), kv_dtype, {1, s.Hkv, L, s.D}), vdv(vd.data(), kv_dtype, {1, s.Hkv, L, s.Dv});
  for (int threads : {1, 2}) {
    po.threads = ao.threads = threads;
    Buffer<T> paged({1, s.Sq, s.H, s.Dv}), dense({1, s.Sq, s.H, s.Dv});
    attention_paged(q.cview(), kp, vp, {table.data(), 1, blocks, blocks}, lens, paged.view(), po);
    const TensorView od(dense.data.data(), {1, s.H, s.Sq, s.Dv}, {s.Sq * s.H * s.Dv, s.Dv, s.H * s.Dv, 1});
    attention(qd, kdv, vdv, od, ao);
    CHECK(same_bits(paged, dense));
    const std::string want = path_of(qd, kdv, vdv, od, ao);
    CHECK(std::string(detail::choose_native_path(detail::make_problem(q.cview(), kp, vp, {table.data(), 1, blocks, blocks}, lens,
                                                                      paged.view(), po))
                          .path->name) == want);
  }
}

TEST_CASE("keys in blocks: attention_paged gives the bits of attention() over the same keys dense, on the same path") {
  std::mt19937_64 rng(base_seed() + 307);
  const Shape shapes[] = {{8, 2, 1, 700, 64, 64}, {16, 1, 1, 333, 64, 48}, {8, 2, 3, 257, 32, 32}, {8, 2, 24, 257, 32, 32},
                          {4, 2, 40, 300, 32, 40}};
  for (const Shape& s : shapes)
    for (std::int64_t bs : {1, 7, 16, 64}) {
      CAPTURE(s.H); CAPTURE(s.Hkv); CAPTURE(s.Sq); CAPTURE(bs);
      check_paged_equals_dense<float>(s, bs, DType::f32, rng);
      check_paged_equals_dense<bfloat16>(s, bs, DType::bf16, rng);
      check_paged_equals_dense<float>(s, bs, DType::int8, rng);
    }
}

}  // namespace
}  // namespace simdattn::test
