#include "core/json_read.h"

#include <cmath>
#include <set>
#include <vector>

#include "core/check.h"
#include "core/whole_number.h"

namespace dloco {

namespace {

std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 40) + "…";
  return s;
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& what) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open;  // the keys of each object being parsed, innermost last
  std::string duplicate;
  const nlohmann::json::parser_callback_t check = [&](int, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) open.emplace_back();
    if (event == Event::object_end && !open.empty()) open.pop_back();
    if (event == Event::key && !open.empty() && !open.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& e) {  // syntax errors, and numbers too large for a double (1e999)
    std::string why = e.what();
    if (const size_t cut = why.find("] "); why.rfind("[json.exception", 0) == 0 && cut != std::string::npos) {
      why = why.substr(cut + 2);  // the library's error code is no use to a user
    }
    throw InputError(what + ": not valid JSON (" + why + ")");
  }
  if (!duplicate.empty()) {
    for (char& c : duplicate) {
      if (static_cast<unsigned char>(c) < ' ') c = '?';
    }
    if (duplicate.size() > 40) duplicate = duplicate.substr(0, 40) + "…";
    throw InputError(what + ": duplicate key '" + duplicate + "' in one object");
  }
  return j;
}

int64_t json_integer(const nlohmann::json& v, const std::string& what) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw InputError(what + ": " + shown(v) + " is out of range");
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    if (const auto whole = whole_int64(v.get<double>())) return *whole;
  }
  throw InputError(what + ": expected an integer, got " + shown(v));
}

int64_t json_integer_or(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& what) {
  if (!j.is_object()) throw InputError(what + ": expected a JSON object, got " + shown(j));
  const auto it = j.find(key);
  return it == j.end() ? fallback : json_integer(*it, what + ": " + key);
}

double json_number(const nlohmann::json& v, const std::string& what) {
  if (v.is_number() && std::isfinite(v.get<double>())) return v.get<double>();
  throw InputError(what + ": expected a finite number, got " + shown(v));
}

}  // namespace dloco
