// File output shared by the .npy and safetensors writers.
#pragma once

#include <cstddef>
#include <string>

namespace simdattn::detail {

// Writes `size` bytes to a new temporary file beside `path` (created exclusively), then renames
// it over `path`: a failure never leaves a partial or clobbered file. Throws Error(path, ...).
void write_file_atomic(const std::string& path, const std::byte* data, std::size_t size);

}  // namespace simdattn::detail
