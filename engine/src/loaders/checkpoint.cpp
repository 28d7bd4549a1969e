#include "loaders/checkpoint.hpp"

#include <sys/stat.h>

#include "io/file_io.hpp"
#include "io/json.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Index files are small (a name and a file per tensor); larger ones are refused unread.
constexpr std::size_t kMaxIndex = 64u << 20;

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!dir_.empty() && dir_.back() != '/') dir_ += '/';
  const std::string single = dir_ + "model.safetensors", index = dir_ + "model.safetensors.index.json";
  if (is_file(single)) {  // (Hugging Face's loaders take the single file first too)
    add_file("model.safetensors", std::make_unique<SafetensorsFile>(single));
    return;
  }
  if (!is_file(index)) throw Error(dir, "has neither model.safetensors nor model.safetensors.index.json");
  JsonValue j;
  try {
    j = parse_json(read_text_file(index, kMaxIndex));
  } catch (const JsonError& e) {
    throw Error(index, std::string("is not valid JSON: ") + e.what());
  }
  const JsonValue* map = j.find("weight_map");
  if (map == nullptr || !map->is_object())
    throw Error(index, "expected a JSON object with a \"weight_map\" object (tensor name -> shard file)");
  for (std::size_t i = 0; i < map->size(); ++i) {
    const std::string& name = map->key(i);
    if (!(*map)[i].is_string()) throw Error(index, "weight_map entry '" + name + "' is not a file name string");
    const std::string& f = (*map)[i].string();
    // a shard is a file beside the index: no directories, nothing hidden or relative
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f[0] == '.' ||
        f.find('\0') != std::string::npos)
      throw Error(index, "weight_map entry '" + name + "' names '" + f + "', not a file beside the index");
    file_of_.emplace(name, f);
    names_.push_back(name);
  }
}

Checkpoint Checkpoint::single(const std::string& path) {
  Checkpoint c;
  const std::size_t slash = path.rfind('/');
  c.dir_ = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  c.add_file(path.substr(slash == std::string::npos ? 0 : slash + 1), std::make_unique<SafetensorsFile>(path));
  return c;
}

void Checkpoint::add_file(const std::string& file, std::unique_ptr<SafetensorsFile> f) {
  for (const auto& [name, e] : f->tensors()) {
    file_of_.emplace(name, file);
    names_.push_back(name);
  }
  open_.emplace(file, std::move(f));
}

const SafetensorsFile& Checkpoint::shard(const std::string& file) const {
  auto it = open_.find(file);
  if (it == open_.end()) {
    const std::string path = dir_ + file;
    if (!is_file(path)) throw Error(path, "is missing (the index names it)");
    it = open_.emplace(file, std::make_unique<SafetensorsFile>(path)).first;
  }
  return *it->second;
}

std::string Checkpoint::file(const std::string& name) const {
  const auto it = file_of_.find(name);
  return it == file_of_.end() ? dir_ : dir_ + it->second;
}

const SafetensorsEntry& Checkpoint::entry(const std::string& name) const {
  const auto it = file_of_.find(name);
  if (it == file_of_.end()) throw Error(dir_, "no tensor named '" + name + "' in the checkpoint");
  const SafetensorsFile& f = shard(it->second);
  const auto t = f.tensors().find(name);
  if (t == f.tensors().end()) throw Error(f.path(), "no tensor named '" + name + "' (the index places it here)");
  return t->second;
}

template <class T>
std::vector<T> Checkpoint::read(const std::string& name, const std::vector<std::int64_t>& shape) const {
  (void)entry(name);  // missing: named as above
  return shard(file_of_.at(name)).read<T>(name, shape);
}

template std::vector<float> Checkpoint::read<float>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<double> Checkpoint::read<double>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<bfloat16> Checkpoint::read<bfloat16>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<float16> Checkpoint::read<float16>(const std::string&, const std::vector<std::int64_t>&) const;

}  // namespace simdattn::detail
