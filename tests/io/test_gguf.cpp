// The GGUF reader (io/gguf.hpp): files built byte by byte here from the published layout, read
// back (metadata of every value type, F32 / F16 / BF16 / Q8_0 tensors, the alignment); and
// one malformed file per fault the reader refuses.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf.hpp"
#include "simdattn/error.hpp"
#include "simdattn/half.hpp"
#include "support/test_util.hpp"

using namespace simdattn;
using detail::GgufFile;

namespace {

// A GGUF image assembled field by field (little-endian).
struct Bytes {
  std::string b;
  template <class U>
  Bytes& put(U v) {
    char raw[sizeof(U)];
    std::memcpy(raw, &v, sizeof(U));
    b.append(raw, sizeof(U));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b += s;
    return *this;
  }
  Bytes& pad(std::size_t align) {
    while (b.size() % align != 0) b += '\0';
    return *this;
  }
};

Bytes header(std::uint64_t tensors, std::uint64_t kvs, std::uint32_t version = 3) {
  Bytes h;
  h.b = "GGUF";
  h.put<std::uint32_t>(version).put<std::uint64_t>(tensors).put<std::uint64_t>(kvs);
  return h;
}

Bytes& tensor_info(Bytes& h, const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type,
                   std::uint64_t offset) {
  h.str(name).put<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
  for (std::uint64_t d : dims) h.put<std::uint64_t>(d);
  return h.put<std::uint32_t>(type).put<std::uint64_t>(offset);
}

struct File {
  std::string path;
  explicit File(const std::string& bytes) : path(test::temp_path("gguf")) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~File() { std::remove(path.c_str()); }
};

void expect_error(const std::string& bytes, const std::string& fragment) {
  CAPTURE(fragment);
  const File f(bytes);
  try {
    GgufFile g(f.path);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.argument() == f.path);
    CHECK(std::string(e.what()).find(fragment) != std::string::npos);
  }
}

// One valid file: metadata of several types, an F32 [2, 3] tensor "w" and a Q8_0 [1, 32] "q".
std::string valid_file() {
  Bytes h = header(2, 4);
  h.str("general.architecture").put<std::uint32_t>(8).str("llama");
  h.str("llama.block_count").put<std::uint32_t>(4).put<std::uint32_t>(2);
  h.str("llama.rope.freq_base").put<std::uint32_t>(6).put<float>(500000.f);
  h.str("pattern").put<std::uint32_t>(9).put<std::uint32_t>(7).put<std::uint64_t>(2).put<std::uint8_t>(1).put<std::uint8_t>(0);
  tensor_info(h, "w", {3, 2}, 0, 0);
  tensor_info(h, "q", {32, 1}, 8, 32);
  h.pad(32);
  for (int i = 0; i < 6; ++i) h.put<float>(static_cast<float>(i) - 2.5f);
  h.pad(32);
  h.put<std::uint16_t>(to_float16(0.5f).bits);
  for (int i = 0; i < 32; ++i) h.put<std::int8_t>(static_cast<std::int8_t>(i - 16));
  return h.b;
}

}  // namespace

TEST_CASE("gguf: metadata, tensor table and elements read back") {
  const File f(valid_file());
  const GgufFile g(f.path);
  CHECK(g.version() == 3);
  CHECK(g.alignment() == 32);
  CHECK(g.find("general.architecture")->text == "llama");
  CHECK(g.find("llama.block_count")->ints == std::vector<std::int64_t>{2});
  CHECK(g.find("llama.rope.freq_base")->floats == std::vector<double>{500000.0});
  const detail::GgufValue* p = g.find("pattern");
  REQUIRE(p != nullptr);
  CHECK(p->is_array);
  CHECK(p->type == detail::GgufValueType::boolean);
  CHECK(p->ints == std::vector<std::int64_t>{1, 0});
  const detail::GgufTensor* w = g.tensor("w");
  REQUIRE(w != nullptr);
  CHECK(w->dims == std::vector<std::int64_t>{3, 2});
  CHECK(g.read<double>(*w) == std::vector<double>{-2.5, -1.5, -0.5, 0.5, 1.5, 2.5});
  CHECK(g.read<bfloat16>(*w)[5].bits == to_bfloat16(2.5f).bits);
  const std::vector<float> q = g.read<float>(*g.tensor("q"));  // d * q in f32
  REQUIRE(q.size() == 32);
  for (int i = 0; i < 32; ++i) CHECK(q[static_cast<std::size_t>(i)] == 0.5f * static_cast<float>(i - 16));
}

TEST_CASE("gguf: F16 and BF16 elements kept exactly, an unknown type is listed but not read") {
  Bytes h = header(3, 0, 2);
  tensor_info(h, "h", {2}, 1, 0);
  tensor_info(h, "b", {2}, 30, 32);
  tensor_info(h, "x", {4}, 999, 64);  // a type this reader does not know
  h.pad(32);
  h.put<std::uint16_t>(to_float16(0.1f).bits).put<std::uint16_t>(to_float16(-3.f).bits).pad(32);
  h.put<std::uint16_t>(to_bfloat16(0.1f).bits).put<std::uint16_t>(to_bfloat16(7.f).bits).pad(32);
  h.b += std::string(32, '\0');  // x's bytes (16 would do for F32; its own size is unknown)
  const File f(h.b);
  const GgufFile g(f.path);
  CHECK(g.read<float16>(*g.tensor("h"))[0].bits == to_float16(0.1f).bits);
  CHECK(g.read<bfloat16>(*g.tensor("b"))[0].bits == to_bfloat16(0.1f).bits);
  CHECK(g.read<float>(*g.tensor("b"))[1] == 7.f);
  CHECK_THROWS_WITH_AS(g.read<float>(*g.tensor("x")), doctest::Contains("ggml type 999"), Error);
}

TEST_CASE("gguf: each malformed file is refused naming its fault") {
  const std::string good = valid_file();
  expect_error("GGU", "magic");
  expect_error("GGML" + good.substr(4), "magic");
  expect_error(header(0, 0, 1).b, "version 1");
  expect_error(header(0, 0, 0x03000000).b, "big-endian");
  expect_error(good.substr(0, 12), "the tensor count runs past the end");
  expect_error(header(std::uint64_t{1} << 40, 0).b + std::string(64, '\0'), "tensor count");
  expect_error(header(0, std::uint64_t{1} << 40).b, "metadata count");
  {
    Bytes h = header(0, 1);
    h.str("k").put<std::uint32_t>(8).put<std::uint64_t>(std::uint64_t{1} << 40);  // a string over the file
    expect_error(h.b, "metadata 'k'");
  }
  {
    Bytes h = header(0, 1);
    h.put<std::uint64_t>(~std::uint64_t{0});  // a key length past everything
    h.b += std::string(16, '\0');
    expect_error(h.b, "metadata key 0");
  }
  {
    Bytes h = header(0, 1);
    h.str("k").put<std::uint32_t>(13);
    expect_error(h.b, "unknown value type 13");
  }
  {
    Bytes h = header(0, 1);
    h.str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint64_t>(1);
    expect_error(h.b, "array of arrays");
  }
  {
    Bytes h = header(0, 1);
    h.str("k").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(std::uint64_t{1} << 60);
    expect_error(h.b, "holds 1152921504606846976 elements");
  }
  {
    Bytes h = header(0, 2);
    h.str("k").put<std::uint32_t>(4).put<std::uint32_t>(1).str("k").put<std::uint32_t>(4).put<std::uint32_t>(2);
    expect_error(h.b, "duplicate metadata key 'k'");
  }
  for (std::uint32_t align : {0u, 48u}) {
    Bytes h = header(0, 1);
    h.str("general.alignment").put<std::uint32_t>(4).put<std::uint32_t>(align);
    expect_error(h.b, "general.alignment " + std::to_string(align) + " is not a power of two");
  }
  {
    Bytes h = header(0, 1);
    h.str("general.alignment").put<std::uint32_t>(10).put<std::uint64_t>(32);
    expect_error(h.b, "general.alignment must be a u32");
  }
  auto one_tensor = [](const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type,
                       std::uint64_t offset, std::size_t data) {
    Bytes h = header(1, 0);
    tensor_info(h, name, std::move(dims), type, offset).pad(32);
    h.b += std::string(data, '\0');
    return h.b;
  };
  expect_error(one_tensor(std::string(64, 'n'), {1}, 0, 0, 4), "64 bytes long, more than 63");
  expect_error(one_tensor("t", {}, 0, 0, 4), "0 dimensions");
  expect_error(one_tensor("t", {1, 1, 1, 1, 1}, 0, 0, 4), "5 dimensions");
  expect_error(one_tensor("t", {std::uint64_t{1} << 40, std::uint64_t{1} << 40}, 0, 0, 4), "overflow");
  expect_error(one_tensor("t", {31}, 8, 0, 64), "not a multiple of its block (32)");
  expect_error(one_tensor("t", {4}, 0, 16, 64), "not a multiple of the alignment 32");
  expect_error(one_tensor("t", {4}, 0, 0, 15), "runs past the end of the file");
  expect_error(one_tensor("t", {4}, 0, std::uint64_t{1} << 63, 16), "runs past the end of the file");
  {
    Bytes h = header(2, 0);
    tensor_info(h, "t", {4}, 0, 0);
    tensor_info(h, "t", {4}, 0, 32);
    h.pad(32).b += std::string(64, '\0');
    expect_error(h.b, "duplicate tensor 't'");
  }
  {
    Bytes h = header(2, 0);
    tensor_info(h, "a", {16}, 0, 0);
    tensor_info(h, "b", {4}, 0, 32);
    h.pad(32).b += std::string(64, '\0');
    expect_error(h.b, "tensors 'a' and 'b' overlap");
  }
}
