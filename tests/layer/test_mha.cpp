// The multi-head attention layer against a float64 computation from first principles
// (layer/mha_reference.hpp): f64 and f32 on every backend, bf16 and f16 layers, cross-attention,
// validation, loading weights from safetensors (both naming conventions, 16-bit files) and the
// attention weights it returns. The KV cache's tests are in cache/test_kv_cache.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <random>
#include <tuple>
#include <type_traits>
#include <string>
#include <vector>

#include "mha_reference.hpp"
#include "support/test_util.hpp"

using namespace simdattn;
using namespace mha_test;

TEST_CASE("MHA self-attention equals the float64 definition (f64 and f32, every backend)") {
  std::mt19937_64 rng(test::base_seed() + 31);
  const std::int64_t B = 2, S = 11, d = 24;
  for (auto [H, Hkv, bias] : {std::tuple{4, 4, true}, std::tuple{6, 2, false}, std::tuple{4, 1, true}}) {
    const Model m = random_model(rng, d, H, Hkv, d / H, d, d, bias);
    const auto x = randn(rng, std::size_t(B * S * d));
    std::vector<std::uint8_t> padding(std::size_t(B * S), 0);
    padding[3] = padding[S + 7] = padding[S + 10] = 1;
    for (Causal causal : {Causal::none, Causal::top_left}) {
      for (bool pad : {false, true}) {
        const auto want = mha_reference(m, x, x, x, B, S, S, causal, pad ? padding : std::vector<std::uint8_t>{});
        MhaOptions opt;
        opt.causal = causal;
        if (pad) opt.key_padding_mask = padding;
        CAPTURE_VALUE(H);
        CAPTURE_VALUE(Hkv);
        CAPTURE(int(causal));
        CAPTURE(pad);
        const MultiHeadAttention l64(m.cfg, m.w);
        for (Backend be : test::backends(true)) {
          opt.backend = be;
          std::vector<double> y(std::size_t(B * S * d));
          l64.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
          CHECK(max_rel_err(y, want) <= 1e-12);
        }
        const MultiHeadAttention l32(m.cfg, weights_as<float>(m.w));
        const auto xf = conv<float>(x);
        for (Backend be : test::backends(false)) {
          opt.backend = be;
          std::vector<float> y(std::size_t(B * S * d));
          l32.forward(ConstSeqView(xf.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
          CHECK(max_rel_err(y, want) <= 2e-5);
        }
      }
    }
  }
}

TEST_CASE("MHA cross-attention with kdim and vdim != d_model, padding and an additive mask") {
  std::mt19937_64 rng(test::base_seed() + 32);
  const std::int64_t B = 2, Sq = 5, Sk = 8, d = 12, kdim = 10, vdim = 7;
  const Model m = random_model(rng, d, 3, 3, 4, kdim, vdim, true);
  const auto xq = randn(rng, std::size_t(B * Sq * d)), xk = randn(rng, std::size_t(B * Sk * kdim)),
             xv = randn(rng, std::size_t(B * Sk * vdim));
  std::vector<std::uint8_t> padding(std::size_t(B * Sk), 0);
  padding[6] = padding[Sk + 0] = 1;
  std::vector<double> additive = randn(rng, std::size_t(Sq * Sk));
  additive[2 * Sk + 1] = -INFINITY;
  const MultiHeadAttention layer(m.cfg, m.w);
  CHECK(layer.config().kdim == kdim);
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    for (int variant = 0; variant < 3; ++variant) {  // padding, additive, both
      const bool pad = variant != 1, add = variant != 0;
      const auto want = mha_reference(m, xq, xk, xv, B, Sq, Sk, causal, pad ? padding : std::vector<std::uint8_t>{},
                                      add ? additive : std::vector<double>{});
      MhaOptions opt;
      opt.causal = causal;
      if (pad) opt.key_padding_mask = padding;
      if (add) opt.attn_mask = ConstTensorView(additive.data(), {1, 1, Sq, Sk});
      std::vector<double> y(std::size_t(B * Sq * d));
      layer.forward(ConstSeqView(xq.data(), B, Sq, d), ConstSeqView(xk.data(), B, Sk, kdim),
                    ConstSeqView(xv.data(), B, Sk, vdim), SeqView(y.data(), B, Sq, d), opt);
      CAPTURE(variant);
      CAPTURE(int(causal));
      CHECK(max_rel_err(y, want) <= 1e-12);
    }
  }
  // Self-attention is refused for such a layer, naming the argument.
  std::vector<double> y(std::size_t(B * Sq * d));
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(xq.data(), B, Sq, d), SeqView(y.data(), B, Sq, d)),
                       doctest::Contains("kdim"), Error);
}

TEST_CASE("MHA validates weights, inputs and options") {
  std::mt19937_64 rng(test::base_seed() + 33);
  Model m = random_model(rng, 8, 2, 2, 4, 8, 8, true);
  m.w.wk.pop_back();
  CHECK_THROWS_WITH_AS(MultiHeadAttention(m.cfg, m.w), doctest::Contains("weights.wk"), Error);
  m = random_model(rng, 8, 2, 2, 4, 8, 8, true);
  MhaConfig bad = m.cfg;
  bad.kv_heads = 3;
  CHECK_THROWS_WITH_AS(MultiHeadAttention(bad, m.w), doctest::Contains("config.kv_heads"), Error);
  const MultiHeadAttention layer(m.cfg, m.w);
  const auto x = randn(rng, 2 * 3 * 8);
  std::vector<double> y(2 * 3 * 8);
  std::vector<float> yf(2 * 3 * 8);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 3, 8), SeqView(yf.data(), 2, 3, 8)),
                       doctest::Contains("out"), Error);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 4, 6), SeqView(y.data(), 2, 4, 6)),
                       doctest::Contains("query"), Error);
  MhaOptions opt;
  const std::uint8_t pad6[6] = {};
  opt.key_padding_mask = pad6;  // with an additive mask the layer combines both: the view is checked
  opt.attn_mask = ConstTensorView(static_cast<const float*>(nullptr), {1, 1, 3, 3});
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 3, 8), SeqView(y.data(), 2, 3, 8), opt),
                       doctest::Contains("options.attn_mask"), Error);
  opt.attn_mask = ConstTensorView();
  const std::uint8_t pad[5] = {};
  opt.key_padding_mask = pad;
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 2, 3, 8), SeqView(y.data(), 2, 3, 8), opt),
                       doctest::Contains("key_padding_mask"), Error);

  // B * S rows through the projections overflow 64 bits (2^31 * 2^31 * 24): an Error before
  // any buffer is sized, for self- and cross-attention and a cached step (was a crash).
  const std::int64_t big = std::int64_t{1} << 31;
  const ConstSeqView huge(x.data(), big, big, 8);
  CHECK_THROWS_WITH_AS(layer.forward(huge, SeqView(y.data(), big, big, 8)), doctest::Contains("query: size overflow"),
                       Error);
  const ConstSeqView q1(x.data(), big, 1, 8);
  CHECK_THROWS_WITH_AS(layer.forward(q1, huge, huge, SeqView(y.data(), big, 1, 8)), doctest::Contains("key: size overflow"),
                       Error);
  KvCache cache(layer, 1, 4);
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), 1, std::numeric_limits<std::int64_t>::max(), 8), cache,
                                     SeqView(y.data(), 1, std::numeric_limits<std::int64_t>::max(), 8)),
                       doctest::Contains("query: size overflow"), Error);
  CHECK(cache.lengths()[0] == 0);
}

TEST_CASE_TEMPLATE("bf16/f16 MHA layer: self- and cross-attention equal the float64 definition with the layer's "
                   "roundings (projections and attention output rounded to its dtype)", H, bfloat16, float16) {
  std::mt19937_64 rng(test::base_seed() + 36);
  const std::int64_t B = 2, S = 11, d = 32;
  for (auto [heads, kv, bias] : {std::tuple{4, 4, true}, std::tuple{8, 2, false}}) {
    const auto [m, w] = rounded_model<H>(random_model(rng, d, heads, kv, d / heads, d, d, bias));
    const MultiHeadAttention layer(m.cfg, w);
    CHECK(layer.dtype() == dtype_of<H>());
    const auto xh = conv<H>(randn(rng, std::size_t(B * S * d)));
    const auto x = conv<double>(xh);
    std::vector<std::uint8_t> padding(std::size_t(B * S), 0);
    padding[2] = padding[S + 9] = 1;
    for (Causal causal : {Causal::none, Causal::top_left}) {
      const auto want = mha_reference(m, x, x, x, B, S, S, causal, padding, {}, &round_to<H>);
      MhaOptions opt;
      opt.causal = causal;
      opt.key_padding_mask = padding;
      for (Backend be : {Backend::native, Backend::reference}) {
        CAPTURE_VALUE(heads);
        CAPTURE(int(causal));
        CAPTURE(int(be));
        opt.backend = be;
        std::vector<H> y(std::size_t(B * S * d));
        layer.forward(ConstSeqView(xh.data(), B, S, d), SeqView(y.data(), B, S, d), opt);
        CHECK(max_rel_err(y, want) <= kTol16<H>);
      }
    }
    // Cross-attention with an additive mask in the layer's dtype and padding (combined in f32).
    const std::int64_t Sk = 7;
    const auto kvh = conv<H>(randn(rng, std::size_t(B * Sk * d)));
    const auto kvx = conv<double>(kvh);
    const auto addh = conv<H>(randn(rng, std::size_t(S * Sk)));
    std::vector<std::uint8_t> pad(std::size_t(B * Sk), 0);
    pad[3] = 1;
    const auto want = mha_reference(m, x, kvx, kvx, B, S, Sk, Causal::none, pad, conv<double>(addh), &round_to<H>);
    MhaOptions opt;
    opt.key_padding_mask = pad;
    opt.attn_mask = ConstTensorView(addh.data(), {1, 1, S, Sk});
    std::vector<H> y(std::size_t(B * S * d));
    layer.forward(ConstSeqView(xh.data(), B, S, d), ConstSeqView(kvh.data(), B, Sk, d), ConstSeqView(kvh.data(), B, Sk, d),
                  SeqView(y.data(), B, S, d), opt);
    CHECK(max_rel_err(y, want) <= kTol16<H>);
    // An input of another dtype is refused, naming it.
    const auto xf = conv<float>(x);
    CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(xf.data(), B, S, d), SeqView(y.data(), B, S, d)),
                         doctest::Contains("query: dtype f32 differs from the layer's"), Error);
  }
}

TEST_CASE("bf16/f16 layers load from BF16 safetensors as they are, and from F32 rounded once") {
  std::mt19937_64 rng(test::base_seed() + 38);
  const std::int64_t d = 16, heads = 2;
  const Model m = random_model(rng, d, heads, heads, d / heads, d, d, true);
  const auto [mb, wb] = rounded_model<bfloat16>(m);
  const std::string pb = test::temp_path("mha_bf16"), pf = test::temp_path("mha_f32");
  auto put = [&](const std::string& path, DType dt, const auto& w) {
    auto t = [&](const auto& v, std::vector<std::int64_t> shape) { return SafetensorsTensor{dt, std::move(shape), v.data()}; };
    write_safetensors(path, {{"q_proj.weight", t(w.wq, {d, d})}, {"k_proj.weight", t(w.wk, {d, d})},
                             {"v_proj.weight", t(w.wv, {d, d})}, {"o_proj.weight", t(w.wo, {d, d})},
                             {"q_proj.bias", t(w.bq, {d})}, {"o_proj.bias", t(w.bo, {d})}});
  };
  MhaWeights<bfloat16> hf = wb;  // the file has no k/v biases
  hf.bk.clear(), hf.bv.clear();
  put(pb, DType::bf16, hf);
  const auto wf = weights_as<float>(m.w);
  put(pf, DType::f32, wf);
  const auto xb = conv<bfloat16>(randn(rng, std::size_t(3 * d)));
  auto run = [&](const MultiHeadAttention& l) {
    std::vector<bfloat16> y(xb.size());
    l.forward(ConstSeqView(xb.data(), 1, 3, d), SeqView(y.data(), 1, 3, d));
    std::vector<std::uint16_t> bits;
    for (bfloat16 v : y) bits.push_back(v.bits);
    return bits;
  };
  const MultiHeadAttention mem(MhaConfig{d, heads}, hf);
  CHECK(run(MultiHeadAttention::from_safetensors(pb, heads, 0, "", DType::bf16)) == run(mem));
  // F32 tensors rounded once to bf16 are the same weights.
  MhaWeights<bfloat16> from_f32 = wb;
  from_f32.bk.clear(), from_f32.bv.clear();
  CHECK(run(MultiHeadAttention::from_safetensors(pf, heads, 0, "", DType::bf16)) ==
        run(MultiHeadAttention(MhaConfig{d, heads}, from_f32)));
  std::remove(pb.c_str());
  std::remove(pf.c_str());
}

TEST_CASE("the layer's attention weights: per head (rows sum to 1, zeros above the causal diagonal and past the cache), "
          "averaged over heads, the output unchanged, validation") {
  std::mt19937_64 rng(test::base_seed() + 101);
  const std::int64_t B = 2, S = 6, d = 16, H = 4;
  MhaWeights<double> w{randn(rng, 256, 0.3), randn(rng, 256, 0.3), randn(rng, 256, 0.3), randn(rng, 256, 0.3),
                       randn(rng, 16), randn(rng, 16), randn(rng, 16), randn(rng, 16)};
  const MultiHeadAttention layer(MhaConfig{.d_model = d, .heads = H}, w);
  const std::vector<double> x = randn(rng, static_cast<std::size_t>(B * S * d));
  for (Backend be : {Backend::reference, Backend::native}) {
    CAPTURE(backend_name(be));
    MhaOptions o;
    o.causal = Causal::top_left;
    o.backend = be;
    std::vector<double> y0(x.size()), y1(x.size()), y2(x.size());
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y0.data(), B, S, d), o);
    test::Buffer<double> per({B, H, S, S}), avg({B, 1, S, S});
    o.attn_weights = per.view();
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y1.data(), B, S, d), o);
    o.attn_weights = avg.view();
    layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y2.data(), B, S, d), o);
    CHECK(y0 == y1);
    CHECK(y0 == y2);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < S; ++i) {
        for (std::int64_t h = 0; h < H; ++h) {
          double sum = 0;
          for (std::int64_t j = 0; j < S; ++j) {
            if (j > i) CHECK(per.at(b, h, i, j) == 0.0);
            sum += per.at(b, h, i, j);
          }
          CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
        }
        for (std::int64_t j = 0; j < S; ++j) {
          double mean = 0;
          for (std::int64_t h = 0; h < H; ++h) mean += per.at(b, h, i, j) / H;
          CHECK(avg.at(b, 0, i, j) == doctest::Approx(mean).epsilon(1e-12));
        }
      }
    // incremental: Sk is the capacity, keys past each sequence's length weigh 0
    KvCache cache(layer, B, 10);
    test::Buffer<float> wc({B, H, S, 10});
    MhaOptions io;
    io.backend = be;
    io.attn_weights = wc.view();
    std::vector<double> yc(x.size());
    layer.forward(ConstSeqView(x.data(), B, S, d), cache, SeqView(yc.data(), B, S, d), io);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < S; ++i)
          for (std::int64_t j = 0; j < 10; ++j)
            CHECK(double(wc.at(b, h, i, j)) == doctest::Approx(j < S ? per.at(b, h, i, j) : 0.0).epsilon(1e-6));
  }
  MhaOptions bad;
  test::Buffer<double> wrong({B, 2, S, S});
  bad.attn_weights = wrong.view();
  std::vector<double> y(x.size());
  CHECK_THROWS_WITH_AS(layer.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d), bad),
                       doctest::Contains("options.attn_weights"), Error);
}

// A regression: issue 23's mutation run planted the bug this title names and the rest of the suite passed.
