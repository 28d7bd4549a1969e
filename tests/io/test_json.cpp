// The JSON tree the readers of safetensors headers, config.json and shard indexes use
// (engine/src/io/json.hpp): values, the order and uniqueness of keys, the nesting limit, error
// text, and quoting for the writer.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "io/json.hpp"

using simdattn::detail::JsonError;
using simdattn::detail::JsonValue;
using simdattn::detail::kMaxJsonDepth;
using simdattn::detail::parse_json;

TEST_CASE("json: scalars keep their kind and value") {
  const JsonValue v = parse_json(R"([null, true, false, -7, 7, 18446744073709551615, 2.5, 1e3, "a\"\u00e9"])");
  REQUIRE(v.is_array());
  REQUIRE(v.size() == 9);
  CHECK(v[0].is_null());
  CHECK((v[1].is_boolean() && v[1].boolean()));
  CHECK((v[2].is_boolean() && !v[2].boolean()));
  CHECK(v[3].kind() == JsonValue::Kind::integer);
  CHECK(v[3].as_int64() == -7);
  CHECK(!v[3].as_uint64());  // negative: no unsigned value
  CHECK(v[4].kind() == JsonValue::Kind::unsigned_integer);
  CHECK(v[4].as_int64() == 7);
  CHECK(v[4].as_uint64() == 7u);
  CHECK(v[5].as_uint64() == UINT64_MAX);
  CHECK(!v[5].as_int64());  // past INT64_MAX: not an int64, never wrapped to a negative one
  CHECK(v[6].kind() == JsonValue::Kind::floating);
  CHECK(v[6].as_double() == 2.5);
  CHECK(!v[6].as_int64());  // a fraction is not an integer
  CHECK(!v[7].is_integer());  // 1e3 is written as a float
  CHECK(v[7].as_double() == 1000.0);
  CHECK(v[8].string() == "a\"\xc3\xa9");
  CHECK(!v[8].as_double());
  CHECK(v[4].as_double() == 7.0);
}

TEST_CASE("json: object keys sorted, a repeated key's last value kept, find by key") {
  const JsonValue v = parse_json(R"({"b": 1, "a": {"x": [1, 2]}, "b": 2, "c": null})");
  REQUIRE(v.is_object());
  REQUIRE(v.size() == 3);
  CHECK(v.key(0) == "a");
  CHECK(v.key(1) == "b");
  CHECK(v.key(2) == "c");
  REQUIRE(v.find("b") != nullptr);
  CHECK(v.find("b")->as_int64() == 2);  // the last one written
  CHECK(v.find("c")->is_null());
  CHECK(v.find("d") == nullptr);
  CHECK(v.find("a")->find("x")->size() == 2);
  CHECK(v.find("a")->find("x")->find("x") == nullptr);  // an array has no keys
  CHECK(parse_json("{}").size() == 0);
}

TEST_CASE("json: nesting up to the limit is read, deeper is refused naming where") {
  auto nested = [](int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); };
  CHECK(parse_json(nested(kMaxJsonDepth)).is_array());
  CHECK_THROWS_WITH_AS(parse_json(nested(kMaxJsonDepth + 1)), doctest::Contains("nests deeper than 64 levels"), JsonError);
  // a nesting bomb of a million levels: refused without recursion (no stack overflow)
  CHECK_THROWS_AS(parse_json(nested(1000000)), JsonError);
  std::string keyed = R"({"outer": {"inner": )" + nested(kMaxJsonDepth) + "}}";
  CHECK_THROWS_WITH_AS(parse_json(keyed), doctest::Contains("under \"outer.inner\""), JsonError);
}

TEST_CASE("json: a document of more values than the limit is refused") {
  CHECK(simdattn::detail::kMaxJsonValues == std::size_t{1} << 24);  // the readers' limit
  // the array and 9 numbers, strings or containers: 10 values, the limit exactly
  CHECK(parse_json("[0,1,2,3,4,5,6,7,8]", 10).size() == 9);
  CHECK(parse_json(R"({"a":[1,2],"b":{"c":"d"},"e":null})", 7).size() == 3);  // 7 values
  CHECK_THROWS_WITH_AS(parse_json("[0,1,2,3,4,5,6,7,8,9]", 10), doctest::Contains("holds more than 10 values"), JsonError);
  CHECK_THROWS_AS(parse_json(R"({"a":[1,2],"b":{"c":"d"},"e":null})", 6), JsonError);
}

TEST_CASE("json: text that is not one JSON value is refused") {
  for (const char* bad : {"", "   ", "{", "[1,]", "{\"a\" 1}", "1 2", "nul", "\"\xff\"", "1e400", "-", "{\"a\":1}}",
                          "[\"\\ud800\"]", "\"tab\tinside\""})
    CHECK_THROWS_AS(parse_json(bad), JsonError);
  CHECK(parse_json(" \n\t 5 \r\n").as_int64() == 5);  // whitespace around one value
}

TEST_CASE("json: brief text for error messages") {
  CHECK(parse_json("1.0").brief() == "1.0");
  CHECK(parse_json("-3").brief() == "-3");
  CHECK(parse_json("0.1").brief() == "0.1");
  CHECK(parse_json("\"x\\ny\"").brief() == "\"x\\ny\"");
  CHECK(parse_json("[0, 24]").brief() == "[0,24]");
  CHECK(parse_json(R"({"a": true})").brief() == R"({"a":true})");
  CHECK(parse_json("[[1]]").brief() == "an array of 1 element(s)");
  const std::string long_string = "\"" + std::string(300, 'z') + "\"";
  const std::string b = parse_json(long_string).brief();
  CHECK(b.size() < 110);
  CHECK(b.substr(b.size() - 3) == "...");
  // cut inside a two-byte UTF-8 character: the cut moves before it, the text stays UTF-8
  const std::string accents = "\"" + std::string(99, 'a') + std::string(20, '\0').replace(0, 20, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9") + "\"";
  CHECK(parse_json(accents).brief() == "\"" + std::string(99, 'a') + "\"...");
  CHECK(!parse_json("18446744073709551616").is_integer());  // past UINT64_MAX: read as a float, never wrapped
}

TEST_CASE("json: quoting for the writer escapes and refuses what is not UTF-8") {
  using simdattn::detail::json_quote;
  CHECK(json_quote("a\"b\\c\n") == R"("a\"b\\c\n")");
  CHECK(parse_json(json_quote("q\x01\xc3\xa9")).string() == "q\x01\xc3\xa9");
  CHECK_THROWS_AS(json_quote("bad\xff"), JsonError);
}
