// Checked JSON reads (core/json_read.h): duplicate keys refused at any depth, syntax errors and out-of-range
// numbers named, integers only when the value is one.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "core/json_read.h"

namespace dloco {
namespace {

std::string refusal(const std::string& text) {
  try {
    parse_json(text, "x.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonRead, DuplicateKeysAreRefusedAtAnyDepthAndTheSameKeyInTwoObjectsIsFine) {
  EXPECT_EQ(parse_json(R"({"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]})", "x.json")["c"][1]["a"], 4);
  EXPECT_EQ(refusal(R"({"a": 1, "a": 2})"), "x.json: duplicate key 'a' in one object");
  EXPECT_EQ(refusal(R"({"nodes": [{"id": 0, "forward_s": 1, "forward_s": 2}]})"),
            "x.json: duplicate key 'forward_s' in one object");
  EXPECT_EQ(refusal(R"({"a": {"b": 1}, "z": {"b": 2, "b": 3}})"), "x.json: duplicate key 'b' in one object");
  EXPECT_EQ(refusal(R"([1, 2, {"k\n": 1, "k\n": 2}])"), "x.json: duplicate key 'k?' in one object");
}

TEST(JsonRead, SyntaxErrorsAndHugeNumbersAreNamedWithoutTheLibrarysCode) {
  const std::string syntax = refusal(R"({"a": )");
  EXPECT_EQ(syntax.rfind("x.json: not valid JSON (", 0), 0u) << syntax;
  EXPECT_EQ(syntax.find("[json.exception"), std::string::npos) << syntax;
  EXPECT_EQ(refusal("1e999").rfind("x.json: not valid JSON (", 0), 0u);
  EXPECT_EQ(parse_json("[]", "x.json"), nlohmann::json::array());
}

TEST(JsonRead, IntegersOnlyWhenTheValueIsOne) {
  EXPECT_EQ(json_integer(nlohmann::json(7), "n"), 7);
  EXPECT_EQ(json_integer(nlohmann::json(7.0), "n"), 7);
  EXPECT_THROW(json_integer(nlohmann::json(7.5), "n"), InputError);
  EXPECT_THROW(json_integer(nlohmann::json(1e38), "n"), InputError);
  EXPECT_THROW(json_integer(nlohmann::json("7"), "n"), InputError);
}

}  // namespace
}  // namespace dloco
