// libFuzzer target: the safetensors reader (header, tensor table, data spans) on arbitrary bytes,
// given as a file (an anonymous memory file reopened by path, as a checkpoint is). Opening must
// succeed or throw simdattn::Error; every tensor it lists must then read as f32 and f64 or throw
// Error (a dtype it does not convert); nothing else.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "simdattn/error.hpp"
#include "simdattn/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) break;
    done += static_cast<std::size_t>(w);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
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
  ::close(fd);
  return 0;
}
