// A JSON value quoted in an error message, safely: a hostile file's value may nest deeper than
// the stack allows a recursive dump (nlohmann parses and frees it without recursion, dump()
// recurses), or be megabytes long.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace simdattn::detail {

// A scalar as JSON text (at most ~100 characters); an array or object by its kind and size.
inline std::string json_brief(const nlohmann::json& v) {
  if (v.is_structured())
    return std::string(v.is_array() ? "an array" : "an object") + " of " + std::to_string(v.size()) + " element(s)";
  std::string s = v.dump();
  if (s.size() > 100) s = s.substr(0, 100) + "...";
  return s;
}

}  // namespace simdattn::detail
