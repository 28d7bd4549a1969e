// A model's config.json as the loaders read it: each value read with its key named in every
// error (Error(path, ...)), sizes bounded.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "io/json.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

// config.json, its values read with the key named in every error.
class ConfigJson {
 public:
  ConfigJson(std::string path, JsonValue j) : path_(std::move(path)), j_(std::move(j)) {}
  const std::string& path() const { return path_; }
  bool has(const std::string& key) const {
    const JsonValue* v = j_.find(key);
    return v != nullptr && !v->is_null();
  }
  // Written in the file, null included (null: "none" where the family's default is a value).
  bool present(const std::string& key) const { return j_.find(key) != nullptr; }
  // size % count == 0, else an error naming both keys.
  void divides(const char* size_key, std::int64_t size, const char* count_key, std::int64_t count) const {
    if (size % count != 0)
      throw Error(path_, "\"" + std::string(size_key) + "\" " + std::to_string(size) + " is not a multiple of \"" +
                             count_key + "\" " + std::to_string(count));
  }
  const JsonValue& at(const std::string& key) const {
    if (!has(key)) throw Error(path_, "needs \"" + key + "\" for this model_type");
    return *j_.find(key);
  }
  // Sizes, counts and positions: bounded far above any model's, so that no product of them
  // overflows before the tensors' own shapes are compared.
  static constexpr std::int64_t kMax = std::int64_t{1} << 24;
  std::int64_t integer(const std::string& key, std::int64_t lo = 1, std::int64_t hi = kMax) const {
    const JsonValue& v = at(key);
    const std::optional<std::int64_t> x = v.as_int64();
    if (!x || *x < lo || *x > hi)
      throw Error(path_, "\"" + key + "\" must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], got " + v.brief());
    return *x;
  }
  std::int64_t integer_or(const std::string& key, std::int64_t fallback, std::int64_t lo = 1,
                          std::int64_t hi = kMax) const {
    return has(key) ? integer(key, lo, hi) : fallback;
  }
  double positive(const std::string& key) const {
    const double x = number(key);
    if (!(x > 0.0)) throw Error(path_, "\"" + key + "\" must be > 0, got " + at(key).brief());
    return x;
  }
  double number(const std::string& key) const {
    const JsonValue& v = at(key);
    const std::optional<double> x = v.as_double();
    if (!x || !std::isfinite(*x)) throw Error(path_, "\"" + key + "\" must be a finite number, got " + v.brief());
    return *x;
  }
  double number_or(const std::string& key, double fallback) const { return has(key) ? number(key) : fallback; }
  bool boolean_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const JsonValue& v = *j_.find(key);
    if (!v.is_boolean()) throw Error(path_, "\"" + key + "\" must be true or false, got " + v.brief());
    return v.boolean();
  }
  // A flag the family's code tests for truth: absent, `fallback` (its configuration's default);
  // null, false.
  bool truthy_or(const std::string& key, bool fallback) const { return present(key) ? boolean_or(key, false) : fallback; }
  // A size the family's configuration class fills in: absent, `if_absent` (its field's default);
  // null, `if_null` (its __post_init__'s).
  std::int64_t integer_or_null(const std::string& key, std::int64_t if_absent, std::int64_t if_null) const {
    return present(key) ? integer_or(key, if_null, 1, kMax) : if_absent;
  }
  // The first of `keys` present (aliases), else `fallback`.
  std::int64_t integer_of_or(std::initializer_list<const char*> keys, std::int64_t fallback) const {
    for (const char* k : keys)
      if (has(k)) return integer(k);
    return fallback;
  }
  // The first of `keys` present (legacy names), else an error naming the first.
  std::int64_t integer_of(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return integer(k);
    return integer(*keys.begin());
  }

 private:
  std::string path_;
  JsonValue j_;
};

}  // namespace simdattn::detail
