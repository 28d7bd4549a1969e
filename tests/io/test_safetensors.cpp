// safetensors: round trip, one test per malformed-file kind, and MHA layers loaded under both
// naming conventions (and a prefix) agreeing with the same weights given from memory.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;

namespace {

using test::temp_path;

// A file from a raw JSON header and data section (no validation: for malformed files).
std::string raw_file(const std::string& name, const std::string& header, const std::string& data,
                     std::uint64_t header_len_override = 0) {
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << data;
  return path;
}

struct Cleanup {
  std::vector<std::string> paths;
  ~Cleanup() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
};

void expect_error(const std::string& path, const std::string& fragment) {
  CAPTURE(fragment);
  try {
    SafetensorsFile f(path);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.argument() == path);
    CHECK(std::string(e.what()).find(fragment) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("safetensors round trip: dtypes, shapes, metadata, empty tensors") {
  Cleanup c;
  const std::string path = temp_path("roundtrip");
  c.paths.push_back(path);
  const std::vector<float> a{1.5f, -2.f, 3.25f, 4.f, 5.f, 6.f};
  const std::vector<double> b{0.1, 0.2, 0.3};
  write_safetensors(path,
                    {{"layer.a", {DType::f32, {2, 3}, a.data()}},
                     {"b", {DType::f64, {3}, b.data()}},
                     {"empty", {DType::f32, {0, 4}, nullptr}}},
                    {{"format", "pt"}});
  const SafetensorsFile f(path);
  CHECK(f.tensors().size() == 3);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.tensors().at("layer.a").dtype == "F32");
  CHECK(f.tensors().at("layer.a").shape == std::vector<std::int64_t>{2, 3});
  CHECK(f.read<float>("layer.a", {2, 3}) == a);
  CHECK(f.read<double>("b", {3}) == b);
  CHECK(f.read<float>("b", {3}) == std::vector<float>{0.1f, 0.2f, 0.3f});
  CHECK(f.read<float>("empty", {0, 4}).empty());
  CHECK_THROWS_WITH_AS(f.read<float>("layer.a", {3, 2}), doctest::Contains("expected [3, 2]"), Error);
  CHECK_THROWS_WITH_AS(f.read<float>("missing", {1}), doctest::Contains("no tensor named 'missing'"), Error);
  // Names and metadata that need escaping in JSON come back as they were written.
  const std::string odd = "q\"uote\\back\nline \xc3\xa9";
  write_safetensors(path, {{odd, {DType::f32, {2}, a.data()}}}, {{odd, odd}});
  const SafetensorsFile g(path);
  CHECK(g.read<float>(odd, {2}) == std::vector<float>{1.5f, -2.f});
  CHECK(g.metadata().at(odd) == odd);
  // A name that is not UTF-8 cannot be written; the file already there is left as it was.
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"bad\xff", {DType::f32, {2}, a.data()}}}),
                       doctest::Contains("is not UTF-8"), Error);
  CHECK(SafetensorsFile(path).read<float>(odd, {2}) == std::vector<float>{1.5f, -2.f});
  const std::string bad = temp_path("nulldata");
  CHECK_THROWS_WITH_AS(write_safetensors(bad, {{"t", {DType::f32, {2}, nullptr}}}), doctest::Contains("null data"),
                       Error);
}

TEST_CASE("safetensors BF16 and F16 tensors: written, and read as f32 or f64 exactly") {
  Cleanup c;
  const std::string path = temp_path("half");
  c.paths.push_back(path);
  const std::vector<float> values{1.0f, -2.5f, 0x1p-24f, 65504.0f, 3.140625f};
  std::vector<bfloat16> b;
  std::vector<float16> h;
  for (float v : values) b.push_back(to_bfloat16(v)), h.push_back(to_float16(v));
  write_safetensors(path, {{"b", {DType::bf16, {5}, b.data()}}, {"h", {DType::f16, {5}, h.data()}}});
  const SafetensorsFile f(path);
  CHECK(f.tensors().at("b").dtype == "BF16");
  CHECK(f.tensors().at("h").dtype == "F16");
  const std::vector<float> rb = f.read<float>("b", {5}), rh = f.read<float>("h", {5});
  const std::vector<double> rh64 = f.read<double>("h", {5});
  for (std::size_t i = 0; i < values.size(); ++i) {
    CHECK(rb[i] == to_float(b[i]));
    CHECK(rh[i] == to_float(h[i]));
    CHECK(rh64[i] == static_cast<double>(to_float(h[i])));
    CHECK(rh[i] == values[i]);  // every value above is exact in f16
  }
  CHECK(rb[4] == 3.140625f);  // exact in bf16 too (8 significant bits)
  const std::vector<std::int32_t> ints{1, 2};
  CHECK_THROWS_WITH_AS(write_safetensors(temp_path("ints"), {{"i", {DType::i32, {2}, ints.data()}}}),
                       doctest::Contains("only f32, f64, bf16 and f16 can be written, got i32"), Error);
}

TEST_CASE("safetensors: every malformed kind is refused with its own message") {
  Cleanup c;
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  auto file = [&](const std::string& name, const std::string& header, const std::string& d, std::uint64_t n = 0) {
    c.paths.push_back(raw_file(name, header, d, n));
    return c.paths.back();
  };
  // the well-formed file, to show the cases below differ from it in one thing only
  CHECK_NOTHROW(SafetensorsFile(file("ok", ok, data)));
  expect_error(file("empty_header", "", ""), "not valid JSON");
  {  // an empty file: no header length at all
    const std::string p = temp_path("zero");
    std::ofstream(p, std::ios::binary).close();
    c.paths.push_back(p);
    expect_error(p, "too short");
  }
  expect_error(file("huge_header", ok, data, std::uint64_t{1} << 60), "exceeds the file");
  expect_error(file("truncated", ok, data.substr(0, 5)), "run past the data section");
  expect_error(file("bad_json", R"({"t":{"dtype":"F32",)", data), "not valid JSON");
  expect_error(file("not_object", "[1,2]", data), "not a JSON object");
  expect_error(file("bad_dtype", R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data),
               "unknown dtype 'F33'");
  expect_error(file("bad_shape", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
               "needs 12 bytes");
  expect_error(file("neg_shape", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
               "integers >= 0");
  expect_error(file("past_end", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", data),
               "run past the data section");
  expect_error(file("reversed", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data), "begin > end");
  expect_error(file("overlap",
                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    data),
               "overlap");
  expect_error(file("no_offsets", R"({"t":{"dtype":"F32","shape":[2]}})", data), "data_offsets");
  expect_error(file("bad_meta", R"({"__metadata__":{"k":1}})", ""), "__metadata__");
  // Limits: sizes checked before they are used, each error naming the field.
  expect_error(file("huge_shape", R"({"t":{"dtype":"F32","shape":[1152921504606846976],"data_offsets":[0,8]}})", data),
               "shape [1152921504606846976] of F32 needs");  // 2^60 elements: 2^62 bytes, not the 8 given
  expect_error(file("shape_overflow", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data),
               "tensor 't': shape [4294967296,4294967296] overflows");
  expect_error(file("bytes_overflow", R"({"t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", data),
               "tensor 't': shape [4611686018427387904] of F64 needs more than 2^64 bytes");
  expect_error(file("big_offset", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", data),
               "run past the data section");
  expect_error(file("nesting_bomb", R"({"__metadata__":)" + std::string(100000, '[') + std::string(100000, ']') + "}", ""),
               "nests deeper than 64 levels (under \"__metadata__\")");
  expect_error(file("whitespace", std::string(1 << 20, ' '), ""), "not valid JSON");
  // A repeated name: the last entry counts (as Python's json and nlohmann read it), checked as any other.
  const SafetensorsFile dup(file("dup", R"({"t":{"dtype":"F32","shape":[9],"data_offsets":[0,36]},)"
                                         R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
  CHECK(dup.tensors().size() == 1);
  CHECK(dup.tensors().at("t").shape == std::vector<std::int64_t>{2});
  // A known dtype the layer cannot use is refused when read, naming the tensor.
  const std::string i16 = file("i16", R"({"t":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", data);
  const SafetensorsFile f(i16);
  CHECK_THROWS_WITH_AS(f.read<float>("t", {4}), doctest::Contains("tensor 't' has dtype I16, expected F32, F64, BF16 or F16"),
                       Error);
  CHECK_THROWS_WITH_AS(SafetensorsFile(temp_path("does_not_exist")), doctest::Contains("cannot open"), Error);
}

TEST_CASE("safetensors: a file truncated by another process while open is an Error, not SIGBUS") {
  // Another process cutting a loaded checkpoint short: the tensors past the new end were mapped,
  // and a load from the mapping would raise SIGBUS; read() reads with pread and throws instead.
  const std::string path = temp_path("truncated_while_open");
  std::vector<float> small(16, 1.5f), big(1 << 18, 2.5f);  // 1 MiB after the small one
  write_safetensors(path, {{"a_small", {DType::f32, {16}, small.data()}}, {"b_big", {DType::f32, {1 << 18}, big.data()}}});
  SafetensorsFile f(path);
  CHECK(f.read<float>("b_big", {1 << 18}) == big);  // intact while the file is whole
  // Cut the file in the middle of the big tensor (the small one, stored first, stays whole).
  const auto whole = static_cast<off_t>(std::filesystem::file_size(path));
  REQUIRE(::truncate(path.c_str(), whole - static_cast<off_t>(big.size() * sizeof(float) / 2)) == 0);
  CHECK(f.read<float>("a_small", {16}) == small);
  CHECK_THROWS_WITH_AS(f.read<float>("b_big", {1 << 18}), doctest::Contains("truncated"), Error);
  CHECK_THROWS_WITH_AS(f.read<double>("b_big", {1 << 18}), doctest::Contains("b_big"), Error);
  // Cut to nothing: every tensor is refused; nothing crashes.
  REQUIRE(::truncate(path.c_str(), 0) == 0);
  CHECK_THROWS_WITH_AS(f.read<float>("a_small", {16}), doctest::Contains("truncated"), Error);
  std::remove(path.c_str());
}

TEST_CASE("MHA weights from safetensors: torch packed, torch separate, Hugging Face with a prefix") {
  Cleanup c;
  std::mt19937_64 rng(test::base_seed() + 36);
  std::normal_distribution<float> n(0.f, 0.3f);
  auto rnd = [&](std::size_t k) {
    std::vector<float> v(k);
    for (float& x : v) x = n(rng);
    return v;
  };
  const std::int64_t B = 2, S = 6, d = 8;
  const auto x = rnd(std::size_t(B * S * d));
  auto run = [&](const MultiHeadAttention& l) {
    std::vector<float> y(std::size_t(B * S * d));
    l.forward(ConstSeqView(x.data(), B, S, d), SeqView(y.data(), B, S, d));
    return y;
  };
  auto tensor = [](const std::vector<float>& v, std::vector<std::int64_t> shape) {
    return SafetensorsTensor{DType::f32, std::move(shape), v.data()};
  };
  SUBCASE("torch in_proj_weight") {
    const auto in_w = rnd(3 * d * d), in_b = rnd(3 * d), out_w = rnd(d * d), out_b = rnd(d);
    const std::string p = temp_path("torch_packed");
    c.paths.push_back(p);
    write_safetensors(p, {{"in_proj_weight", tensor(in_w, {3 * d, d})},
                          {"in_proj_bias", tensor(in_b, {3 * d})},
                          {"out_proj.weight", tensor(out_w, {d, d})},
                          {"out_proj.bias", tensor(out_b, {d})}});
    MhaWeights<float> w;
    w.wq.assign(in_w.begin(), in_w.begin() + d * d);
    w.wk.assign(in_w.begin() + d * d, in_w.begin() + 2 * d * d);
    w.wv.assign(in_w.begin() + 2 * d * d, in_w.end());
    w.bq.assign(in_b.begin(), in_b.begin() + d);
    w.bk.assign(in_b.begin() + d, in_b.begin() + 2 * d);
    w.bv.assign(in_b.begin() + 2 * d, in_b.end());
    w.wo = out_w;
    w.bo = out_b;
    const auto loaded = MultiHeadAttention::from_safetensors(p, 2);
    CHECK(loaded.config().d_model == d);
    CHECK(run(loaded) == run(MultiHeadAttention(MhaConfig{d, 2}, w)));
    CHECK_THROWS_WITH_AS(MultiHeadAttention::from_safetensors(p, 2, 1), doctest::Contains("kv_heads"), Error);
    CHECK_THROWS_WITH_AS(MultiHeadAttention::from_safetensors(p, 3), doctest::Contains("heads"), Error);
  }
  SUBCASE("torch q/k/v_proj_weight with kdim and vdim") {
    const auto wq = rnd(d * d), wk = rnd(d * 5), wv = rnd(d * 3), wo = rnd(d * d);
    const std::string p = temp_path("torch_sep");
    c.paths.push_back(p);
    write_safetensors(p, {{"q_proj_weight", tensor(wq, {d, d})},
                          {"k_proj_weight", tensor(wk, {d, 5})},
                          {"v_proj_weight", tensor(wv, {d, 3})},
                          {"out_proj.weight", tensor(wo, {d, d})}});
    const auto loaded = MultiHeadAttention::from_safetensors(p, 4);
    CHECK(loaded.config().kdim == 5);
    CHECK(loaded.config().vdim == 3);
    const MultiHeadAttention mem(MhaConfig{d, 4, 0, 0, 5, 3}, MhaWeights<float>{wq, wk, wv, wo, {}, {}, {}, {}});
    const auto xk = rnd(std::size_t(B * 7 * 5)), xv = rnd(std::size_t(B * 7 * 3));
    std::vector<float> y1(std::size_t(B * S * d)), y2(y1.size());
    loaded.forward(ConstSeqView(x.data(), B, S, d), ConstSeqView(xk.data(), B, 7, 5), ConstSeqView(xv.data(), B, 7, 3),
                   SeqView(y1.data(), B, S, d));
    mem.forward(ConstSeqView(x.data(), B, S, d), ConstSeqView(xk.data(), B, 7, 5), ConstSeqView(xv.data(), B, 7, 3),
                SeqView(y2.data(), B, S, d));
    CHECK(y1 == y2);
  }
  SUBCASE("Hugging Face names, grouped-query (kv heads inferred), under a prefix, f64 layer") {
    const std::int64_t H = 4, Hkv = 2, hd = 2;
    const auto wq = rnd(H * hd * d), wk = rnd(Hkv * hd * d), wv = rnd(Hkv * hd * d), wo = rnd(d * H * hd);
    const auto bq = rnd(H * hd), bo = rnd(d);
    const std::string p = temp_path("hf");
    c.paths.push_back(p);
    const std::string pre = "model.layers.1.self_attn.";
    write_safetensors(p, {{pre + "q_proj.weight", tensor(wq, {H * hd, d})},
                          {pre + "q_proj.bias", tensor(bq, {H * hd})},
                          {pre + "k_proj.weight", tensor(wk, {Hkv * hd, d})},
                          {pre + "v_proj.weight", tensor(wv, {Hkv * hd, d})},
                          {pre + "o_proj.weight", tensor(wo, {d, H * hd})},
                          {pre + "o_proj.bias", tensor(bo, {d})},
                          {"model.layers.0.self_attn.q_proj.weight", tensor(wq, {H * hd, d})}});
    const auto loaded = MultiHeadAttention::from_safetensors(p, H, 0, pre, DType::f64);
    CHECK(loaded.config().kv_heads == Hkv);
    CHECK(loaded.config().head_dim == hd);
    CHECK(loaded.dtype() == DType::f64);
    auto d64 = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    const MultiHeadAttention mem(MhaConfig{d, H, Hkv, hd},
                                 MhaWeights<double>{d64(wq), d64(wk), d64(wv), d64(wo), d64(bq), {}, {}, d64(bo)});
    const auto xd = d64(x);
    std::vector<double> y1(std::size_t(B * S * d)), y2(y1.size());
    loaded.forward(ConstSeqView(xd.data(), B, S, d), SeqView(y1.data(), B, S, d));
    mem.forward(ConstSeqView(xd.data(), B, S, d), SeqView(y2.data(), B, S, d));
    CHECK(y1 == y2);
    // The other layer of the file lacks k/v/o: a clear error naming the missing tensor.
    CHECK_THROWS_WITH_AS(MultiHeadAttention::from_safetensors(p, H, 0, "model.layers.0.self_attn."),
                         doctest::Contains("model.layers.0.self_attn.k_proj.weight"), Error);
    CHECK_THROWS_WITH_AS(MultiHeadAttention::from_safetensors(p, H, 0, "nothing."),
                         doctest::Contains("no attention weights"), Error);
    // A q_proj with no rows is refused (not a division by zero).
    const std::string z = temp_path("hf_empty");
    c.paths.push_back(z);
    write_safetensors(z, {{"q_proj.weight", tensor(wq, {0, d})}, {"k_proj.weight", tensor(wk, {Hkv * hd, d})},
                          {"v_proj.weight", tensor(wv, {Hkv * hd, d})}, {"o_proj.weight", tensor(wo, {d, H * hd})}});
    CHECK_THROWS_WITH_AS(MultiHeadAttention::from_safetensors(z, H), doctest::Contains("q_proj.weight"), Error);
  }
}
