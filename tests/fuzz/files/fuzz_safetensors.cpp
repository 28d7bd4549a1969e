// libFuzzer target: the safetensors reader (header, tensor table, data spans) on arbitrary bytes,
// given as a file (an anonymous memory file reopened by path, as a checkpoint is). Opening must
// succeed or throw simdattn::Error; every tensor it lists must then read as f32 and f64 or throw
// Error (a dtype it does not convert); nothing else.
#include <cstddef>
#include <cstdint>
#include <string>

#include "memory_file.hpp"
#include "simdattn/error.hpp"
#include "simdattn/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const MemoryFile file("fuzz.safetensors", data, size);
  if (file.fd < 0) return 0;
  const std::string& path = file.path;
  try {
    const simdattn::SafetensorsFile f(path);
    for (const auto& [name, entry] : f.tensors()) {
      try {
        (void)f.read<float>(name, entry.shape);
        (void)f.read<double>(name, entry.shape);
      } catch (const simdattn::Error&) {
      }
    }
  } catch (const simdattn::Error&) {
  }
  return 0;
}
