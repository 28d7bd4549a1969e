#include "io/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "simdattn/error.hpp"

namespace simdattn::detail {

void write_file_atomic(const std::string& path, const std::byte* data, std::size_t size) {
  static std::atomic<unsigned> counter{0};
  constexpr std::size_t kMaxBaseBytes = 200;  // + ".tmp.<pid>.<n>": at most 36 more
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    // In the output's directory (rename stays within one file system), named after it but cut
    // short so the temporary name fits where the output's name does (255 bytes on Linux).
    const std::size_t slash = path.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    tmp = path.substr(0, base + std::min<std::size_t>(path.size() - base, kMaxBaseBytes)) + ".tmp." +
          std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error(path, std::string("cannot create output file: ") + std::strerror(errno));
  std::size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(path, std::string("write failed: ") + std::strerror(err));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path, std::string("write failed: ") + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path, std::string("cannot write output: ") + std::strerror(err));
  }
}

int open_regular_file(const std::string& path, std::size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path, "not a regular file");
  }
  size = static_cast<std::size_t>(st.st_size);
  return fd;
}

void read_exact(int fd, const std::string& path, std::uint64_t offset, std::size_t bytes, void* dst,
                const std::string& what) {
  auto* out = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(path, what + ": " + (r < 0 ? std::string("read failed: ") + std::strerror(errno)
                                              : "the file ends at byte " + std::to_string(offset + done) +
                                                    " (truncated since it was opened?)"));
    done += static_cast<std::size_t>(r);
  }
}

std::string read_text_file(const std::string& path, std::size_t limit) {
  std::size_t size = 0;
  const int fd = open_regular_file(path, size);
  if (size > limit) {
    ::close(fd);
    throw Error(path, "is " + std::to_string(size) + " bytes, more than the " + std::to_string(limit) + " expected");
  }
  std::string text(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, text.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw Error(path, "cannot read" + std::string(n < 0 ? std::string(": ") + std::strerror(errno) : ""));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return text;
}

}  // namespace simdattn::detail
