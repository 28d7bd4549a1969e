// MultiHeadAttention::from_pretrained and from_diffusers on tiny checkpoints written here (the
// families' published tensor names and config keys): incremental decoding with a KV cache, one
// token at a time and in chunks of 3, equals the full forward for every decoder family; the
// decoder families are causal without being told, the encoders are not; a sharded index; the
// checkpoint's dtype by default; errors name the file, key or tensor. (The float64 definitions
// of each family are checked through the CLI: tests/cli/test_models.py.)
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/test_util.hpp"

using namespace simdattn;
namespace fs = std::filesystem;

namespace {

// A checkpoint directory under /tmp, removed with the object.
struct ModelDir {
  std::string path;
  explicit ModelDir(const std::string& name)
      : path("/tmp/simdattn_test_" + std::to_string(::getpid()) + "_" + name) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ModelDir() { fs::remove_all(path); }
  void write(const std::string& file, const std::string& text) const {
    std::ofstream(path + "/" + file) << text;
  }
};

// Random tensors by name (f32, C order) and the shapes they have.
struct Tensors {
  std::map<std::string, std::vector<float>> data;
  std::map<std::string, std::vector<std::int64_t>> shape;
  std::mt19937_64* rng;
  void add(const std::string& name, std::vector<std::int64_t> s, double sd = 0.3) {
    std::int64_t n = 1;
    for (auto d : s) n *= d;
    std::normal_distribution<double> nd(0.0, sd);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = static_cast<float>(nd(*rng));
    data[name] = std::move(v);
    shape[name] = std::move(s);
  }
  // Every tensor into one file, or split over two with an index (sharded).
  void write(const ModelDir& dir, bool sharded = false) const {
    std::map<std::string, SafetensorsTensor> files[2];
    std::string index = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
    int i = 0;
    for (const auto& [name, v] : data) {
      const int f = sharded ? i % 2 : 0;
      files[f][name] = SafetensorsTensor{DType::f32, shape.at(name), v.data()};
      index += std::string(i ? ", " : "") + "\"" + name + "\": \"model-0000" + std::to_string(f + 1) + "-of-00002.safetensors\"";
      ++i;
    }
    if (!sharded) {
      write_safetensors(dir.path + "/model.safetensors", files[0]);
      return;
    }
    write_safetensors(dir.path + "/model-00001-of-00002.safetensors", files[0]);
    write_safetensors(dir.path + "/model-00002-of-00002.safetensors", files[1]);
    dir.write("model.safetensors.index.json", index + "}}");
  }
};

// A two-layer checkpoint of `family` (d 16, 4 heads; 2 kv heads where the family has them).
void write_family(const ModelDir& dir, const std::string& family, std::mt19937_64& rng) {
  Tensors t{{}, {}, &rng};
  const std::int64_t d = 16;
  for (int n = 0; n < 2; ++n) {
    const std::string l = std::to_string(n);
    if (family == "gpt2") {
      t.add("h." + l + ".attn.c_attn.weight", {d, 3 * d}), t.add("h." + l + ".attn.c_attn.bias", {3 * d}, 0.1);
      t.add("h." + l + ".attn.c_proj.weight", {d, d}), t.add("h." + l + ".attn.c_proj.bias", {d}, 0.1);
    } else if (family == "bloom") {
      const std::string a = "transformer.h." + l + ".self_attention.";
      t.add(a + "query_key_value.weight", {3 * d, d}), t.add(a + "query_key_value.bias", {3 * d}, 0.1);
      t.add(a + "dense.weight", {d, d}), t.add(a + "dense.bias", {d}, 0.1);
    } else if (family == "t5") {
      const std::string a = "decoder.block." + l + ".layer.0.SelfAttention.";
      for (const char* p : {"q", "k", "v"}) t.add(a + p + ".weight", {4 * 6, d});
      t.add(a + "o.weight", {d, 4 * 6});
      if (n == 0) t.add(a + "relative_attention_bias.weight", {8, 4}, 1.0);
    } else if (family == "bert") {
      const std::string a = "encoder.layer." + l + ".attention.";
      for (const char* p : {"query", "key", "value"})
        t.add(a + "self." + p + ".weight", {d, d}), t.add(a + "self." + p + ".bias", {d}, 0.1);
      t.add(a + "output.dense.weight", {d, d}), t.add(a + "output.dense.bias", {d}, 0.1);
    } else {  // llama-like: head_dim 8, 4 heads, 2 kv heads
      const std::string a = "model.layers." + l + ".self_attn.";
      t.add(a + "q_proj.weight", {32, d}), t.add(a + "k_proj.weight", {16, d}), t.add(a + "v_proj.weight", {16, d});
      t.add(a + "o_proj.weight", {d, 32});
      if (family == "qwen2") t.add(a + "q_proj.bias", {32}, 0.1), t.add(a + "k_proj.bias", {16}, 0.1), t.add(a + "v_proj.bias", {16}, 0.1);
      if (family == "qwen3") t.add(a + "q_norm.weight", {8}, 1.0), t.add(a + "k_norm.weight", {8}, 1.0);
    }
  }
  const std::string llama = R"("hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
      "num_hidden_layers": 2, "rope_theta": 10000.0)";
  std::map<std::string, std::string> config = {
      {"gpt2", R"({"model_type": "gpt2", "n_embd": 16, "n_head": 4, "n_layer": 2})"},
      {"bloom", R"({"model_type": "bloom", "hidden_size": 16, "n_head": 4, "n_layer": 2})"},
      {"t5", R"({"model_type": "t5", "d_model": 16, "d_kv": 6, "num_heads": 4, "num_layers": 2,
                 "relative_attention_num_buckets": 8, "relative_attention_max_distance": 10})"},
      {"bert", R"({"model_type": "bert", "hidden_size": 16, "num_attention_heads": 4, "num_hidden_layers": 2})"},
      {"llama", R"({"model_type": "llama", )" + llama + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}})"},
      {"mistral", R"({"model_type": "mistral", )" + llama + R"(, "sliding_window": 3})"},
      {"qwen2", R"({"model_type": "qwen2", )" + llama + R"(, "use_sliding_window": true, "sliding_window": 4,
                  "max_window_layers": 0})"},
      {"qwen3", R"({"model_type": "qwen3", )" + llama + R"(, "rms_norm_eps": 1e-6})"},
      {"gemma2", R"({"model_type": "gemma2", )" + llama + R"(, "query_pre_attn_scalar": 12,
                   "attn_logit_softcapping": 1.5, "sliding_window": 3})"},
  };
  dir.write("config.json", config.at(family));
  t.write(dir, family == "llama");
}

std::vector<float> randn(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST_CASE("every decoder family: decoding with a KV cache (one token, chunks of 3) equals the full forward") {
  std::mt19937_64 rng(test::base_seed() + 91);
  for (const char* family : {"gpt2", "bloom", "t5", "llama", "mistral", "qwen2", "qwen3", "gemma2"}) {
    const std::string family_name = family;
    CAPTURE(family_name);
    const ModelDir dir(std::string("dec_") + family);
    write_family(dir, family, rng);
    for (std::int64_t layer : {0, 1}) {
      CAPTURE(layer);
      PretrainedOptions o;
      if (std::string(family) == "t5") o.stack = "decoder";
      const MultiHeadAttention mha = MultiHeadAttention::from_pretrained(dir.path, layer, o);
      CHECK(mha.config().causal);
      CHECK(mha.dtype() == DType::f32);
      const std::int64_t B = 2, S = 10, d = 16;
      const std::vector<float> x = randn(rng, std::size_t(B * S * d));
      std::vector<float> full(x.size()), causal(x.size());
      mha.forward(ConstSeqView(x.data(), B, S, d), SeqView(full.data(), B, S, d));  // causal by itself
      MhaOptions tl;
      tl.causal = Causal::top_left;
      mha.forward(ConstSeqView(x.data(), B, S, d), SeqView(causal.data(), B, S, d), tl);
      CHECK(full == causal);
      for (std::int64_t chunk : {1, 3}) {
        CAPTURE(chunk);
        KvCache cache(mha, B, S);
        for (std::int64_t t0 = 0; t0 < S; t0 += chunk) {
          const std::int64_t T = std::min(chunk, S - t0);
          std::vector<float> xs(std::size_t(B * T * d)), ys(xs.size());
          for (std::int64_t b = 0; b < B; ++b)
            std::copy_n(x.begin() + (b * S + t0) * d, T * d, xs.begin() + b * T * d);
          mha.forward(ConstSeqView(xs.data(), B, T, d), cache, SeqView(ys.data(), B, T, d));
          double err = 0, mx = 0;
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t i = 0; i < T * d; ++i) {
              const double want = full[std::size_t((b * S + t0) * d + i)];
              err = std::max(err, std::abs(ys[std::size_t(b * T * d + i)] - want));
              mx = std::max(mx, std::abs(want));
            }
          CHECK(err <= 2e-5 * std::max(1.0, mx));
        }
      }
    }
  }
}

TEST_CASE("from_pretrained: encoders are not causal, the checkpoint's dtype unless one is asked for") {
  std::mt19937_64 rng(test::base_seed() + 92);
  const ModelDir dir("enc_bert");
  write_family(dir, "bert", rng);
  const MultiHeadAttention mha = MultiHeadAttention::from_pretrained(dir.path, 1);
  CHECK_FALSE(mha.config().causal);
  CHECK(mha.config().heads == 4);
  CHECK(mha.config().d_model == 16);
  const std::int64_t S = 6, d = 16;
  const std::vector<float> x = randn(rng, std::size_t(S * d));
  std::vector<float> a(x.size()), c(x.size());
  mha.forward(ConstSeqView(x.data(), 1, S, d), SeqView(a.data(), 1, S, d));
  MhaOptions tl;
  tl.causal = Causal::top_left;
  mha.forward(ConstSeqView(x.data(), 1, S, d), SeqView(c.data(), 1, S, d), tl);
  CHECK(a != c);  // (the first rows see fewer keys)
  CHECK(MultiHeadAttention::pretrained_dtype(dir.path, 1) == DType::f32);  // (the headers alone)
  PretrainedOptions o;
  o.dtype = DType::bf16;
  CHECK(MultiHeadAttention::from_pretrained(dir.path, 0, o).dtype() == DType::bf16);
  o.attention = "cross";
  CHECK_THROWS_WITH_AS(MultiHeadAttention::from_pretrained(dir.path, 0, o), doctest::Contains("attention"), Error);
}

TEST_CASE("from_pretrained: errors name the file, the config key or the tensor, and the argument") {
  std::mt19937_64 rng(test::base_seed() + 93);
  const ModelDir dir("err_llama");
  write_family(dir, "llama", rng);  // sharded
  auto error_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.argument()) + " | " + e.what();
    }
    return "no error";
  };
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, 2); }).find("layer | ") == 0);
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, -1); }).find("layer | ") == 0);
  PretrainedOptions st;
  st.stack = "decoder";
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, 0, st); }).find("stack | ") == 0);
  fs::remove(dir.path + "/model-00002-of-00002.safetensors");
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, 0); }).find("model-00002-of-00002.safetensors") !=
        std::string::npos);
  dir.write("config.json", R"({"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 2})");
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, 0); }).find("num_attention_heads") != std::string::npos);
  dir.write("config.json", R"({"model_type": "falcon"})");
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, 0); }).find("'falcon' is not supported") !=
        std::string::npos);
  dir.write("config.json", "{not json");
  CHECK(error_of([&] { MultiHeadAttention::from_pretrained(dir.path, 0); }).find("config.json | ") != std::string::npos);
  CHECK(error_of([&] { MultiHeadAttention::from_diffusers(dir.path + "/none.safetensors", "b", 4); })
            .find("none.safetensors") != std::string::npos);
  // a prefix naming attn1 / attn2 selects it: options.attention may agree, not contradict (checked
  // before the file is read)
  PretrainedOptions self, cross;
  self.attention = "self", cross.attention = "cross";
  CHECK(error_of([&] { MultiHeadAttention::from_diffusers(dir.path + "/none.safetensors", "b.attn2", 4, self); })
            .find("'self' contradicts the prefix 'b.attn2', which names attn2 (cross-attention)") != std::string::npos);
  CHECK(error_of([&] { MultiHeadAttention::from_diffusers(dir.path + "/none.safetensors", "b.attn2", 4, self); })
            .find("attention | ") == 0);
  CHECK(error_of([&] { MultiHeadAttention::from_diffusers(dir.path + "/none.safetensors", "b.attn1.", 4, cross); })
            .find("'cross' contradicts the prefix 'b.attn1.'") != std::string::npos);
  CHECK(error_of([&] { MultiHeadAttention::from_diffusers(dir.path + "/none.safetensors", "b.attn2", 4, cross); })
            .find("none.safetensors") != std::string::npos);
}
