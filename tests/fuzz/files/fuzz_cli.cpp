// libFuzzer target: the command line (tools/cli, in-process through simdattn::cli::run): the
// input is the argument list, NUL-separated (argv[1] the command). Every run must return 0, 1
// or 2 and nothing else may happen (no crash, no sanitizer report, no leak). It runs in a
// scratch directory holding small valid inputs (q.npy, k.npy, v.npy, x.npy, mask.npy,
// lengths.npy, w.safetensors) so that numbers, shapes, windows and dtypes reach the commands;
// arguments containing '/' and the compare command (a benchmark) are skipped, so that nothing
// outside the directory is read or written.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <sanitizer/common_interface_defs.h>

#include "commands.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/npy.hpp"
#include "simdattn/safetensors.hpp"

namespace {

void write_f32(const std::string& path, std::vector<std::int64_t> shape, float scale) {
  simdattn::NpyArray a;
  a.shape = std::move(shape);
  a.data.resize(static_cast<std::size_t>(a.numel()) * sizeof(float));
  for (std::int64_t i = 0; i < a.numel(); ++i) a.as<float>()[i] = scale * static_cast<float>((i * 7) % 11 - 5);
  simdattn::write_npy(path, a);
}

// The scratch directory: the working directory while a command runs (libFuzzer's own relative
// paths, read between runs, stay as they were). Returns its descriptor.
int setup() {
  char dir[] = "/tmp/simdattn_fuzz_cli_XXXXXX";
  const int cwd = ::open(".", O_RDONLY | O_DIRECTORY);
  if (::mkdtemp(dir) == nullptr || cwd < 0 || ::chdir(dir) != 0) std::abort();
  static const std::string made = dir;
  std::atexit([] { std::filesystem::remove_all(made); });
  write_f32("q.npy", {1, 2, 5, 4}, 0.1f), write_f32("k.npy", {1, 2, 6, 4}, 0.2f), write_f32("v.npy", {1, 2, 6, 4}, 0.3f);
  write_f32("x.npy", {1, 3, 8}, 0.1f);
  simdattn::NpyArray mask;  // [Sq, Sk] booleans
  mask.dtype = simdattn::DType::u8, mask.is_bool = true, mask.shape = {5, 6};
  mask.data.assign(30, std::byte{1});
  mask.data[3] = std::byte{0};
  simdattn::write_npy("mask.npy", mask);
  simdattn::NpyArray lengths;
  lengths.dtype = simdattn::DType::i64, lengths.shape = {1};
  lengths.data.resize(8);
  const std::int64_t four = 4;
  std::memcpy(lengths.data.data(), &four, 8);
  simdattn::write_npy("lengths.npy", lengths);
  std::vector<float> in_w(3 * 8 * 8, 0.05f), in_b(3 * 8, 0.01f), out_w(8 * 8, -0.04f), out_b(8, 0.02f);
  simdattn::write_safetensors("w.safetensors",
                              {{"in_proj_weight", {simdattn::DType::f32, {24, 8}, in_w.data()}},
                               {"in_proj_bias", {simdattn::DType::f32, {24}, in_b.data()}},
                               {"out_proj.weight", {simdattn::DType::f32, {8, 8}, out_w.data()}},
                               {"out_proj.bias", {simdattn::DType::f32, {8}, out_b.data()}}});
  const int scratch = ::open(".", O_RDONLY | O_DIRECTORY);
  if (scratch < 0 || ::fchdir(cwd) != 0) std::abort();
  ::close(cwd);
  return scratch;
}

// The commands' messages and output go to /dev/null while one runs; the sanitizers report on
// the real stderr all the same.
struct Quiet {
  int null = ::open("/dev/null", O_WRONLY), out = ::dup(1), err = ::dup(2);
  Quiet() { __sanitizer_set_report_fd(reinterpret_cast<void*>(static_cast<std::intptr_t>(err))); }
  void on() const { std::fflush(stdout), std::fflush(stderr), ::dup2(null, 1), ::dup2(null, 2); }
  void off() const { std::fflush(stdout), std::fflush(stderr), ::dup2(out, 1), ::dup2(err, 2); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int scratch = setup();
  std::vector<std::string> args(1, "simdattn");
  std::string cur;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  args.push_back(cur);
  if (args.size() > 64) return 0;
  for (const std::string& a : args)
    if (a.find('/') != std::string::npos || a.size() > 256) return 0;
  if (args[1] == "compare") return 0;  // a benchmark: seconds a run
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  static const Quiet quiet;
  const int cwd = ::open(".", O_RDONLY | O_DIRECTORY);
  if (cwd < 0 || ::fchdir(scratch) != 0) std::abort();
  quiet.on();
  const int status = simdattn::cli::run(static_cast<int>(argv.size()), argv.data());
  quiet.off();
  if (::fchdir(cwd) != 0) std::abort();
  ::close(cwd);
  if (status != 0 && status != 2) {  // 1 is an internal error: a bug (bad input is exit 2)
    std::fprintf(stderr, "fuzz_cli: exit status %d\n", status);
    std::abort();
  }
  return 0;
}
