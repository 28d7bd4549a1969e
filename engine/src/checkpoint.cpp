#include "checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

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

std::string read_text_file(const std::string& path, std::size_t limit) {
  // O_NONBLOCK: a FIFO or device opens at once (and is refused) instead of blocking
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path, "not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
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

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!dir_.empty() && dir_.back() != '/') dir_ += '/';
  const std::string single = dir_ + "model.safetensors", index = dir_ + "model.safetensors.index.json";
  if (is_file(single)) {  // (Hugging Face's loaders take the single file first too)
    add_file("model.safetensors", std::make_unique<SafetensorsFile>(single));
    return;
  }
  if (!is_file(index)) throw Error(dir, "has neither model.safetensors nor model.safetensors.index.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(index, kMaxIndex));
  } catch (const nlohmann::json::exception& e) {
    throw Error(index, std::string("is not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(index, "expected a JSON object with a \"weight_map\" object (tensor name -> shard file)");
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw Error(index, "weight_map entry '" + name + "' is not a file name string");
    const std::string f = file.get<std::string>();
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
