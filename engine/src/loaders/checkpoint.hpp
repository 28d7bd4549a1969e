// A Hugging Face model directory's weights: one model.safetensors, or the shards a
// model.safetensors.index.json names (its "weight_map": tensor name -> shard file beside it).
// Shards are mapped (and validated, SafetensorsFile) when a tensor in them is first asked for.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "simdattn/safetensors.hpp"

namespace simdattn::detail {

class Checkpoint {
 public:
  // Throws Error(path, ...) for a directory with neither file, an index that is not JSON of that
  // form, or one naming a shard outside the directory.
  explicit Checkpoint(const std::string& dir);
  // One safetensors file on its own (a diffusers pipeline's component).
  static Checkpoint single(const std::string& path);

  // Every tensor name (the index's, or the single file's).
  const std::vector<std::string>& names() const noexcept { return names_; }
  bool has(const std::string& name) const { return file_of_.count(name) != 0; }
  // The tensor's entry; Error(file, ...) if it is missing, or its shard is missing or invalid, or
  // the shard lacks it.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The file that holds (or, by the index, should hold) `name`.
  std::string file(const std::string& name) const;
  // As SafetensorsFile::read, from the tensor's shard.
  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<std::int64_t>& shape) const;

 private:
  Checkpoint() = default;
  const SafetensorsFile& shard(const std::string& file) const;
  void add_file(const std::string& file, std::unique_ptr<SafetensorsFile> f);
  std::string dir_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> file_of_;  // tensor -> shard file name (in dir_)
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;
};

}  // namespace simdattn::detail
