#include "io/json.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <numeric>
#include <utility>

#include <nlohmann/json.hpp>

namespace simdattn::detail {

struct JsonValue::Rest {
  std::string text;               // string
  std::vector<JsonValue> items;   // array elements, object values
  std::vector<std::string> keys;  // object keys, parallel to items
};

JsonValue::JsonValue() = default;
JsonValue::JsonValue(JsonValue&&) noexcept = default;
JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
JsonValue::~JsonValue() = default;

const std::string& JsonValue::string() const { return rest_->text; }
std::size_t JsonValue::size() const { return rest_ ? rest_->items.size() : 0; }
const JsonValue& JsonValue::operator[](std::size_t i) const { return rest_->items[i]; }
const std::string& JsonValue::key(std::size_t i) const { return rest_->keys[i]; }

// nlohmann's parser drives this through its SAX interface: each value lands in the innermost
// open array or object (`open_`, whose elements do not move while a child is open: only the
// innermost container grows). Errors are thrown as JsonError from the callbacks.
class JsonBuilder {
 public:
  using Json = nlohmann::json;
  JsonBuilder(JsonValue& root, std::size_t max_values) : root_(root), max_values_(max_values) {
    open_.reserve(kMaxJsonDepth);  // pushing in open() cannot fail
  }

  bool null() { return (void)add(JsonValue::Kind::null), true; }
  bool boolean(bool v) { return add(JsonValue::Kind::boolean).boolean_ = v, true; }
  bool number_integer(Json::number_integer_t v) { return add(JsonValue::Kind::integer).integer_ = v, true; }
  bool number_unsigned(Json::number_unsigned_t v) { return add(JsonValue::Kind::unsigned_integer).unsigned_ = v, true; }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return add(JsonValue::Kind::floating).floating_ = v, true; }
  bool string(Json::string_t& v) { return add(JsonValue::Kind::string).rest_->text = std::move(v), true; }
  bool binary(Json::binary_t&) { throw JsonError("binary values are not JSON"); }
  bool start_object(std::size_t) { return open(JsonValue::Kind::object); }
  bool key(Json::string_t& k) { return key_ = std::move(k), true; }
  bool end_object() {
    sort_members(*open_.back());
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return open(JsonValue::Kind::array); }
  bool end_array() { return open_.pop_back(), true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) { throw JsonError(e.what()); }

 private:
  JsonValue& add(JsonValue::Kind kind) {
    if (++values_ > max_values_) throw JsonError("holds more than " + std::to_string(max_values_) + " values");
    JsonValue* v = &root_;
    if (!open_.empty()) {
      JsonValue::Rest& c = *open_.back()->rest_;
      if (open_.back()->kind_ == JsonValue::Kind::object) c.keys.push_back(std::move(key_));
      v = &c.items.emplace_back();
    }
    v->kind_ = kind;
    if (kind == JsonValue::Kind::string || kind == JsonValue::Kind::array || kind == JsonValue::Kind::object)
      v->rest_ = std::make_unique<JsonValue::Rest>();
    return *v;
  }
  bool open(JsonValue::Kind kind) {
    if (open_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) {
      std::string where;
      for (const JsonValue* c : open_)
        if (c->kind_ == JsonValue::Kind::object && !c->rest_->keys.empty()) where += (where.empty() ? "" : ".") + c->rest_->keys.back();
      throw JsonError("nests deeper than " + std::to_string(kMaxJsonDepth) + " levels" +
                      (where.empty() ? std::string() : " (under \"" + where.substr(0, 100) + "\")"));
    }
    JsonValue& v = add(kind);
    open_.push_back(&v);
    return true;
  }
  // Keys sorted, the last of a repeated key kept (as nlohmann::json and Python's json read them).
  static void sort_members(JsonValue& value) {
    JsonValue::Rest& obj = *value.rest_;
    const std::size_t n = obj.keys.size();
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return obj.keys[a] < obj.keys[b]; });
    std::vector<std::string> keys;
    std::vector<JsonValue> items;
    keys.reserve(n), items.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (i + 1 < n && obj.keys[order[i]] == obj.keys[order[i + 1]]) continue;
      keys.push_back(std::move(obj.keys[order[i]]));
      items.push_back(std::move(obj.items[order[i]]));
    }
    obj.keys = std::move(keys);
    obj.items = std::move(items);
  }

  JsonValue& root_;
  std::vector<JsonValue*> open_;
  std::string key_;
  std::size_t max_values_;
  std::size_t values_ = 0;
};

JsonValue parse_json(std::string_view text, std::size_t max_values) {
  JsonValue root;
  JsonBuilder builder(root, max_values);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

std::optional<std::int64_t> JsonValue::as_int64() const {
  if (kind_ == Kind::integer) return integer_;
  if (kind_ == Kind::unsigned_integer && unsigned_ <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return static_cast<std::int64_t>(unsigned_);
  return std::nullopt;
}

std::optional<std::uint64_t> JsonValue::as_uint64() const {
  if (kind_ == Kind::unsigned_integer) return unsigned_;
  if (kind_ == Kind::integer && integer_ >= 0) return static_cast<std::uint64_t>(integer_);
  return std::nullopt;
}

std::optional<double> JsonValue::as_double() const {
  switch (kind_) {
    case Kind::integer: return static_cast<double>(integer_);
    case Kind::unsigned_integer: return static_cast<double>(unsigned_);
    case Kind::floating: return floating_;
    default: return std::nullopt;
  }
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (kind_ != Kind::object) return nullptr;
  const std::vector<std::string>& keys = rest_->keys;
  const auto it = std::lower_bound(keys.begin(), keys.end(), key);
  return it != keys.end() && *it == key ? &rest_->items[static_cast<std::size_t>(it - keys.begin())] : nullptr;
}

std::string json_quote(const std::string& s) {
  try {
    return nlohmann::json(s).dump();  // (a string's destructor frees without allocating)
  } catch (const nlohmann::json::exception& e) {
    throw JsonError(e.what());
  }
}

namespace {

constexpr std::size_t kBrief = 100;

// A scalar as JSON text (a string quoted, shortened to about kBrief characters).
std::string scalar_text(const JsonValue& v) {
  switch (v.kind()) {
    case JsonValue::Kind::null: return "null";
    case JsonValue::Kind::boolean: return v.boolean() ? "true" : "false";
    case JsonValue::Kind::integer: return std::to_string(*v.as_int64());
    case JsonValue::Kind::unsigned_integer: return std::to_string(*v.as_uint64());
    case JsonValue::Kind::floating: {
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, *v.as_double());
      std::string t(buf, r.ptr);
      if (t.find_first_of(".en") == std::string::npos) t += ".0";  // 1.0, not 1: it was written as a fraction
      return t;
    }
    case JsonValue::Kind::string: {
      const std::string& s = v.string();
      if (s.size() <= kBrief) return json_quote(s);
      std::size_t cut = kBrief;
      while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
      return json_quote(s.substr(0, cut)) + "...";
    }
    default: return {};
  }
}

}  // namespace

std::string JsonValue::brief() const {
  if (!is_array() && !is_object()) return scalar_text(*this);
  const std::vector<JsonValue>& items = rest_->items;
  const bool all_scalars = std::none_of(items.begin(), items.end(), [](const JsonValue& v) { return v.is_array() || v.is_object(); });
  if (all_scalars && items.size() <= 16) {
    std::string t = is_array() ? "[" : "{";
    for (std::size_t i = 0; i < items.size() && t.size() <= kBrief; ++i) {
      if (i > 0) t += ",";
      if (is_object()) t += json_quote(rest_->keys[i]) + ":";
      t += items[i].brief();
    }
    if (t.size() <= kBrief) return t + (is_array() ? "]" : "}");
  }
  return std::string(is_array() ? "an array" : "an object") + " of " + std::to_string(items.size()) + " element(s)";
}

}  // namespace simdattn::detail
