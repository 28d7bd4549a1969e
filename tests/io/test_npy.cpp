// .npy round trips for every dtype and rejection of every malformed kind.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "simdattn/npy.hpp"
#include "simdattn/error.hpp"

using namespace simdattn;

namespace {

NpyArray make(DType t, std::vector<std::int64_t> shape, bool is_bool = false) {
  NpyArray a;
  a.dtype = t;
  a.is_bool = is_bool;
  a.shape = std::move(shape);
  a.data.resize(static_cast<std::size_t>(a.numel()) * dtype_size(t));
  for (std::size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<std::byte>((i * 37 + 11) & 0xff);
  if (is_bool)
    for (auto& b : a.data) b = static_cast<std::byte>(std::to_integer<int>(b) & 1);
  return a;
}

// A hand-built file: magic, version, header text (padded to 64 bytes), data.
std::vector<std::byte> image(const std::string& dict, std::size_t data_bytes, int major = 1) {
  std::string header = dict;
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  while ((10 + (len_bytes - 2) + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string s("\x93NUMPY", 6);
  s.push_back(char(major));
  s.push_back(char(0));
  for (std::size_t i = 0; i < len_bytes; ++i) s += char((header.size() >> (8 * i)) & 0xff);
  s += header;
  std::vector<std::byte> out(s.size() + data_bytes, std::byte{0});
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

void expect_reject(const std::vector<std::byte>& bytes, const std::string& fragment) {
  bool thrown = false;
  try {
    parse_npy(bytes.data(), bytes.size(), "x.npy");
  } catch (const Error& e) {
    thrown = true;
    CHECK(e.argument() == "x.npy");
    CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
  }
  CHECK_MESSAGE(thrown, "expected rejection containing: " << fragment);
}

const std::string kGood = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

}  // namespace

TEST_CASE("npy round trip for every dtype and rank, in memory and on disk") {
  const auto dir = std::filesystem::temp_directory_path() / ("simdattn_npy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::vector<std::int64_t>> shapes{{}, {0}, {5}, {2, 3}, {1, 2, 3, 4}, {3, 1, 0, 2}};
  int n = 0;
  for (auto [t, is_bool] : {std::pair{DType::f32, false}, {DType::f64, false}, {DType::u8, true},
                            {DType::u8, false}, {DType::i32, false}, {DType::i64, false},
                            {DType::f16, false}}) {
    for (const auto& shape : shapes) {
      const NpyArray a = make(t, shape, is_bool);
      const auto bytes = serialize_npy(a);
      // header is padded so data starts on a 64-byte boundary
      CHECK((bytes.size() - a.data.size()) % 64 == 0);
      const NpyArray b = parse_npy(bytes.data(), bytes.size(), "mem");
      CHECK(b.dtype == a.dtype);
      CHECK(b.is_bool == a.is_bool);
      CHECK(b.shape == a.shape);
      CHECK(b.data == a.data);
      const std::string path = (dir / (std::to_string(n++) + ".npy")).string();
      write_npy(path, a);
      const NpyArray c = read_npy(path);
      CHECK(c.shape == a.shape);
      CHECK(c.data == a.data);
    }
  }
  // nothing but the written files: no temporaries left behind
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    CHECK(e.path().extension() == ".npy");
    ++files;
  }
  CHECK(files == n);
  std::filesystem::remove_all(dir);
  // f16 is NumPy's float16, '<f2'; NumPy has no bfloat16, so a bf16 array is refused.
  const auto f16 = serialize_npy(make(DType::f16, {2}));
  CHECK(std::string(reinterpret_cast<const char*>(f16.data()), f16.size()).find("'descr': '<f2'") != std::string::npos);
  CHECK_THROWS_WITH_AS(serialize_npy(make(DType::bf16, {2})), doctest::Contains("no bfloat16"), Error);
}

TEST_CASE("npy accepts format 2.0 and 3.0 headers, double quotes, Python 2 longs") {
  for (int major : {2, 3}) {
    const auto bytes = image(kGood, 24, major);
    const NpyArray a = parse_npy(bytes.data(), bytes.size(), "x.npy");
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
  }
  const auto dq = image("{\"descr\": \"<i8\", \"shape\": (3L,), \"fortran_order\": False}", 24);
  const NpyArray a = parse_npy(dq.data(), dq.size(), "x.npy");
  CHECK(a.dtype == DType::i64);
  CHECK(a.shape == std::vector<std::int64_t>{3});
}

TEST_CASE("npy rejects each malformed kind with a message naming the file") {
  SUBCASE("empty file") { expect_reject({}, "truncated"); }
  SUBCASE("bad magic") {
    auto b = image(kGood, 24);
    b[1] = std::byte{'X'};
    expect_reject(b, "magic");
  }
  SUBCASE("unsupported version") { expect_reject(image(kGood, 24, 4), "version 4.0"); }
  SUBCASE("unsupported minor version") {  // 1.1 is no NumPy format
    std::vector<std::byte> bytes = image(kGood, 24);
    bytes[7] = std::byte{1};
    expect_reject(bytes, "version 1.1");
  }
  SUBCASE("Fortran order") {
    expect_reject(image("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24), "Fortran");
  }
  SUBCASE("big-endian") {
    expect_reject(image("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24), "big-endian");
  }
  SUBCASE("unknown dtype") {
    expect_reject(image("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", 48), "unsupported dtype");
  }
  SUBCASE("truncated data") { expect_reject(image(kGood, 23), "truncated"); }
  SUBCASE("trailing bytes") { expect_reject(image(kGood, 25), "after the data"); }
  SUBCASE("truncated header") {
    auto b = image(kGood, 0);
    b.resize(30);
    expect_reject(b, "truncated");
  }
  SUBCASE("header not a dict") { expect_reject(image("[1, 2]", 0), "expected '{'"); }
  SUBCASE("missing key") { expect_reject(image("{'descr': '<f4', 'shape': (2,), }", 8), "fortran_order"); }
  SUBCASE("extra key") {
    expect_reject(image("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8), "unexpected key");
  }
  SUBCASE("duplicate key") {
    expect_reject(image("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8), "duplicate");
  }
  SUBCASE("negative dimension") {
    expect_reject(image("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8), "non-negative");
  }
  SUBCASE("overflowing shape") {
    expect_reject(image("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 8),
                  "too large");
  }
  SUBCASE("huge header length") {
    std::vector<std::byte> b(12, std::byte{0});
    std::memcpy(b.data(), "\x93NUMPY\x02\x00", 8);
    b[11] = std::byte{0x7f};
    expect_reject(b, "header length");
  }
  SUBCASE("raw bytes in a key are quoted as printable text") {
    // A form feed, a lone continuation byte, an overlong '/' and a surrogate, around a valid
    // two-byte character that stays as it is.
    const std::string key = "de\x0c" "s\xe8" "c\xc0\xaf\xed\xa0\x80" "r\xc3\xa9";
    auto b = image("{'" + key + "': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
    expect_reject(b, "unexpected key 'de\\x0cs\\xe8c\\xc0\\xaf\\xed\\xa0\\x80r\xc3\xa9'");
  }
  SUBCASE("header without newline") {
    auto b = image(kGood, 24);
    const std::size_t hl = std::to_integer<std::size_t>(b[8]) | std::to_integer<std::size_t>(b[9]) << 8;
    b[10 + hl - 1] = std::byte{' '};  // overwrite the header's terminating newline
    expect_reject(b, "newline");
  }
}

TEST_CASE("read_npy reports unreadable paths and write_npy unwritable ones") {
  CHECK_THROWS_WITH_AS(read_npy("/nonexistent/dir/x.npy"), doctest::Contains("cannot open"), Error);
  const NpyArray a = make(DType::f32, {2});
  CHECK_THROWS_WITH_AS(write_npy("/nonexistent/dir/x.npy", a), doctest::Contains("cannot create"), Error);
}
