// JSON read from files the library did not write (safetensors headers, config.json, shard
// indexes), held in a tree whose destruction never allocates: nlohmann::json frees a nested
// value through a heap-allocated stack, so an allocation failing there would end the process
// (destructors are noexcept). nlohmann's parser still reads the text (its SAX interface); this
// tree takes its events, with the nesting bounded so that the tree is freed by bounded recursion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace simdattn::detail {

// Nesting deeper than this is refused (published files nest a few levels).
inline constexpr int kMaxJsonDepth = 64;
// A document of more values than this is refused (a value takes 24 bytes, plus its text or
// elements: so a document costs at most a few hundred MiB; a checkpoint header with a million
// tensors holds about 10 million).
inline constexpr std::size_t kMaxJsonValues = std::size_t{1} << 24;

// Text that is not JSON, nests deeper than kMaxJsonDepth or holds more than kMaxJsonValues
// values; what() says where.
struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class JsonValue {
 public:
  enum class Kind : std::uint8_t { null, boolean, integer, unsigned_integer, floating, string, array, object };

  JsonValue();
  JsonValue(JsonValue&&) noexcept;
  JsonValue& operator=(JsonValue&&) noexcept;
  ~JsonValue();  // frees its elements by recursion bounded by kMaxJsonDepth, allocating nothing

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_boolean() const { return kind_ == Kind::boolean; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }
  // Integers: written without fraction or exponent (a negative one is `integer`, a non-negative
  // one `unsigned_integer`, as nlohmann's parser reports them).
  bool is_integer() const { return kind_ == Kind::integer || kind_ == Kind::unsigned_integer; }
  bool is_number() const { return is_integer() || kind_ == Kind::floating; }

  // The value when it has this kind and fits, else nullopt.
  std::optional<std::int64_t> as_int64() const;
  std::optional<std::uint64_t> as_uint64() const;
  // Any number as a double (finite: the parser refuses overflowing ones); nullopt otherwise.
  std::optional<double> as_double() const;
  bool boolean() const { return boolean_; }  // is_boolean() only
  const std::string& string() const;         // is_string() only

  // Array elements or object members.
  std::size_t size() const;
  const JsonValue& operator[](std::size_t i) const;  // i < size()
  // Object members, sorted by key, one per key (a repeated key: the last one written).
  const std::string& key(std::size_t i) const;  // is_object(), i < size()
  const JsonValue* find(std::string_view key) const;  // nullptr: absent or not an object

  // For error messages: a scalar as JSON text, an array or object of scalars the same way when
  // short, anything else by its kind and size; at most ~100 characters.
  std::string brief() const;

 private:
  friend class JsonBuilder;
  struct Rest;  // a string's text, an array's or object's elements and keys
  Kind kind_ = Kind::null;
  bool boolean_ = false;
  union {
    std::int64_t integer_;
    std::uint64_t unsigned_;
    double floating_ = 0.0;
  };
  std::unique_ptr<Rest> rest_;  // strings, arrays and objects only
};

// Parses one JSON value from `text` (nothing but whitespace after it). JsonError when it is not
// JSON, nests deeper than kMaxJsonDepth or holds more than `max_values` values; std::bad_alloc
// passes through.
JsonValue parse_json(std::string_view text, std::size_t max_values = kMaxJsonValues);

// `s` as a JSON string literal, quotes included. JsonError when `s` is not UTF-8.
std::string json_quote(const std::string& s);

}  // namespace simdattn::detail
