// libFuzzer target: the GGUF reader (header, metadata, tensor table, data spans) and
// MultiHeadAttention::from_gguf on arbitrary bytes, given as a file (an anonymous memory file
// reopened by path). Opening must succeed or throw simdattn::Error; every tensor it lists must
// then read as f32 or throw Error (a type it does not read); from_gguf of layers 0 and 1 must
// give a layer or throw Error; nothing else.
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/gguf.hpp"
#include "memory_file.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const MemoryFile file("fuzz.gguf", data, size);
  if (file.fd < 0) return 0;
  const std::string& path = file.path;
  try {
    const simdattn::detail::GgufFile f(path);
    for (const auto& [name, t] : f.tensors()) {
      try {
        (void)f.read<float>(t);
      } catch (const simdattn::Error&) {
      }
    }
    for (std::int64_t layer : {0, 1}) {
      try {
        (void)simdattn::MultiHeadAttention::from_gguf(path, layer);
      } catch (const simdattn::Error&) {
      }
    }
  } catch (const simdattn::Error&) {
  }
  return 0;
}
