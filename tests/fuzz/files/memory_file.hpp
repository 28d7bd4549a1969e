// A fuzzer's input as a file: an anonymous memory file holding the bytes, reopened by path
// (/proc/self/fd/N) as the readers open checkpoints. fd is -1 if none could be made.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

struct MemoryFile {
  int fd = -1;
  std::string path;
  MemoryFile(const char* name, const std::uint8_t* data, std::size_t size) : fd(memfd_create(name, 0)) {
    if (fd < 0) return;
    std::size_t done = 0;
    while (done < size) {
      const ssize_t w = ::write(fd, data + done, size - done);
      if (w <= 0) break;
      done += static_cast<std::size_t>(w);
    }
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  ~MemoryFile() {
    if (fd >= 0) ::close(fd);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
};
