// libFuzzer target: the model-directory loaders (MultiHeadAttention::from_pretrained and
// GatedDeltaNet::from_pretrained: config.json, model.safetensors.index.json, the shards it names).
// The input is the config text, a NUL byte, then the index text; both are written into a scratch
// directory that also holds two fixed shards with the tensors of every family's layers 0 and 1
// (gpt2, bloom, t5, bert, llama-like), and a third file with gpt-oss's sinks, an MLA layer's
// tensors and a Gated DeltaNet layer's (Qwen3-Next's linear_attn).
// Layers 0 and 1 are loaded by both (and, when a layer loads, run once on a small input): each
// must succeed or throw simdattn::Error, nothing else.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "simdattn/error.hpp"
#include "simdattn/gated_delta_net.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/safetensors.hpp"

namespace {

std::string dir;

// The tensors of two layers of each family (d_model 16; llama-like: 4 heads of 8, 2 kv heads).
void write_shards() {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  const std::int64_t d = 16;
  for (int n = 0; n < 2; ++n) {
    const std::string l = std::to_string(n);
    shapes["h." + l + ".attn.c_attn.weight"] = {d, 3 * d}, shapes["h." + l + ".attn.c_attn.bias"] = {3 * d};
    shapes["h." + l + ".attn.c_proj.weight"] = {d, d}, shapes["h." + l + ".attn.c_proj.bias"] = {d};
    const std::string b = "transformer.h." + l + ".self_attention.";
    shapes[b + "query_key_value.weight"] = {3 * d, d}, shapes[b + "query_key_value.bias"] = {3 * d};
    shapes[b + "dense.weight"] = {d, d}, shapes[b + "dense.bias"] = {d};
    for (const char* stack : {"encoder", "decoder"}) {
      const std::string t = std::string(stack) + ".block." + l + ".layer.0.SelfAttention.";
      for (const char* p : {"q", "k", "v"}) shapes[t + p + ".weight"] = {24, d};
      shapes[t + "o.weight"] = {d, 24};
      if (n == 0) shapes[t + "relative_attention_bias.weight"] = {8, 4};
    }
    const std::string e = "encoder.layer." + l + ".attention.";
    for (const char* p : {"query", "key", "value"}) shapes[e + "self." + p + ".weight"] = {d, d}, shapes[e + "self." + p + ".bias"] = {d};
    shapes[e + "output.dense.weight"] = {d, d}, shapes[e + "output.dense.bias"] = {d};
    const std::string m = "model.layers." + l + ".self_attn.";
    shapes[m + "q_proj.weight"] = {32, d}, shapes[m + "k_proj.weight"] = {16, d}, shapes[m + "v_proj.weight"] = {16, d};
    shapes[m + "o_proj.weight"] = {d, 32};
    shapes[m + "q_proj.bias"] = {32}, shapes[m + "k_proj.bias"] = {16}, shapes[m + "v_proj.bias"] = {16};
    shapes[m + "q_norm.weight"] = {8}, shapes[m + "k_norm.weight"] = {8};
  }
  // gpt-oss's sinks and an MLA layer's tensors (4 heads, qk_nope 4, qk_rope 4, v_head 8,
  // kv_lora_rank 8, no q LoRA: its q_proj and o_proj are the llama-like ones), in a third file
  std::map<std::string, std::vector<std::int64_t>> later;
  for (int n = 0; n < 2; ++n) {
    const std::string m = "model.layers." + std::to_string(n) + ".self_attn.";
    later[m + "sinks"] = {4};
    later[m + "kv_a_proj_with_mqa.weight"] = {12, d}, later[m + "kv_a_layernorm.weight"] = {8};
    later[m + "kv_b_proj.weight"] = {48, 8};
    // Gated DeltaNet: hidden 16, 2 key heads of 4, 4 value heads of 2, conv kernel 4
    const std::string g = "model.layers." + std::to_string(n) + ".linear_attn.";
    later[g + "in_proj_qkvz.weight"] = {32, d}, later[g + "in_proj_ba.weight"] = {8, d};
    later[g + "conv1d.weight"] = {24, 1, 4}, later[g + "dt_bias"] = {4}, later[g + "A_log"] = {4};
    later[g + "norm.weight"] = {2}, later[g + "out_proj.weight"] = {d, 8};
  }
  std::vector<std::vector<float>> keep;
  std::map<std::string, simdattn::SafetensorsTensor> shard[3];
  auto add = [&](const std::string& name, const std::vector<std::int64_t>& shape, int file) {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    keep.emplace_back(static_cast<std::size_t>(n));
    for (std::size_t k = 0; k < keep.back().size(); ++k) keep.back()[k] = 0.01f * static_cast<float>((k * 5) % 13) - 0.06f;
    shard[file][name] = {simdattn::DType::f32, shape, keep.back().data()};
  };
  int i = 0;
  for (const auto& [name, shape] : shapes) add(name, shape, i++ % 2);
  for (const auto& [name, shape] : later) add(name, shape, 2);
  simdattn::write_safetensors(dir + "/model-00001-of-00002.safetensors", shard[0]);
  simdattn::write_safetensors(dir + "/model-00002-of-00002.safetensors", shard[1]);
  simdattn::write_safetensors(dir + "/model-extra.safetensors", shard[2]);
}

bool setup() {
  char d[] = "/tmp/simdattn_fuzz_model_XXXXXX";
  if (::mkdtemp(d) == nullptr) std::abort();
  dir = d;
  std::atexit([] { std::filesystem::remove_all(dir); });
  write_shards();
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool ready = setup();
  (void)ready;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  std::ofstream(dir + "/config.json", std::ios::binary | std::ios::trunc) << input.substr(0, nul);
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      << (nul == std::string::npos ? std::string() : input.substr(nul + 1));
  for (std::int64_t layer : {0, 1}) {
    try {
      const simdattn::MultiHeadAttention m = simdattn::MultiHeadAttention::from_pretrained(dir, layer);
      const std::int64_t dm = m.config().d_model;
      std::vector<float> x(static_cast<std::size_t>(3 * dm), 0.5f), y(x.size());
      m.forward(simdattn::ConstSeqView(x.data(), 1, 3, dm), simdattn::SeqView(y.data(), 1, 3, dm));
    } catch (const simdattn::Error&) {
    }
    try {
      const simdattn::GatedDeltaNet g = simdattn::GatedDeltaNet::from_pretrained(dir, layer);
      const std::int64_t dm = g.config().hidden_size;
      if (g.dtype() == simdattn::DType::f32 && dm <= 4096) {
        std::vector<float> x(static_cast<std::size_t>(3 * dm), 0.5f), y(x.size());
        simdattn::GatedDeltaNetState st(g, 1);
        g.forward(simdattn::ConstSeqView(x.data(), 1, 3, dm), simdattn::SeqView(y.data(), 1, 3, dm), &st);
      }
    } catch (const simdattn::Error&) {
    }
  }
  return 0;
}
