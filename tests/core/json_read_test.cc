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

TEST(JsonRead, TryParseGivesTheReasonInsteadOfThrowing) {
  std::string why;
  EXPECT_EQ(try_parse_json(R"({"a": 1})", "x.json", &why).value()["a"], 1);
  EXPECT_FALSE(try_parse_json(R"({"a": 1, "a": 2})", "x.json", &why).has_value());
  EXPECT_EQ(why, "x.json: duplicate key 'a' in one object");
  EXPECT_FALSE(try_parse_json("{", "x.json").has_value());
}

TEST(JsonRead, AnObjectReadFieldByFieldNamesThePathOfWhatIsWrong) {
  const nlohmann::json j = parse_json(R"({"n": 3, "x": 0.5, "s": "a", "typo": 1, "arr": [1.5]})", "f.json");
  JsonObject o(j, "f.json");
  EXPECT_EQ(o.integer("n", 0, 10), 3);
  EXPECT_EQ(o.number("x", 0, 1), 0.5);
  EXPECT_EQ(o.string("s"), "a");
  EXPECT_FALSE(o.has("absent"));
  auto message = [](auto&& read) {
    try {
      read();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([&] { o.integer("n", 4, 10); }), "f.json: n: 3 (number) is outside [4, 10]");
  EXPECT_EQ(message([&] { o.required("absent"); }), "f.json: absent: missing field");
  EXPECT_EQ(message([&] { json_integer_in(o.array("arr")[0], o.path("arr") + "[0]", 0, 9); }),
            "f.json: arr[0]: expected an integer, got 1.5 (number)");
  EXPECT_EQ(message([&] { o.reject_unknown(); }), "f.json: typo: unknown field (a typo?)");
  o.allow("typo");
  EXPECT_EQ(message([&] { o.reject_unknown(); }), "");
  EXPECT_EQ(message([&] { JsonObject(j["arr"], "f.json: arr"); }), "f.json: arr: expected a JSON object, got [1.5] (array)");
}

}  // namespace
}  // namespace dloco
