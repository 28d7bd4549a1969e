// libFuzzer target: the .npy parser (simdattn::parse_npy) on arbitrary bytes. It must return an
// array whose data holds exactly its elements, or throw simdattn::Error; nothing else (no crash,
// no sanitizer report, no other exception).
#include <cstddef>
#include <cstdint>

#include "simdattn/error.hpp"
#include "simdattn/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const simdattn::NpyArray a = simdattn::parse_npy(reinterpret_cast<const std::byte*>(data), size, "fuzz.npy");
    if (static_cast<std::size_t>(a.numel()) * simdattn::dtype_size(a.dtype) != a.data.size()) __builtin_trap();
    (void)a.descr();
  } catch (const simdattn::Error&) {
  }
  return 0;
}
