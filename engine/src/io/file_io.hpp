// File input and output shared by the readers (safetensors, config.json, indices) and the .npy
// and safetensors writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace simdattn::detail {

// Writes `size` bytes to a new temporary file beside `path` (created exclusively), then renames
// it over `path`: a failure never leaves a partial or clobbered file. Throws Error(path, ...).
void write_file_atomic(const std::string& path, const std::byte* data, std::size_t size);

// Opens `path` for reading (O_NONBLOCK: a FIFO or device opens at once, and is refused, instead
// of blocking) and checks that it is a regular file; sets size. Returns the descriptor, which
// the caller closes. Throws Error(path, ...).
int open_regular_file(const std::string& path, std::size_t& size);

// Reads `bytes` bytes at `offset` of the open file fd into dst with pread (not through a
// mapping: a file truncated by another process since it was opened gives a short read here, an
// Error, where a load from a mapping would raise SIGBUS). Error(path, what + ...) on a short read.
void read_exact(int fd, const std::string& path, std::uint64_t offset, std::size_t bytes, void* dst,
                const std::string& what);

// The text of a small file (config.json, an index), at most `limit` bytes. Error(path, ...).
std::string read_text_file(const std::string& path, std::size_t limit);

}  // namespace simdattn::detail
