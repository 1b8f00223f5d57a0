#include "core/json_read.h"

#include <cmath>
#include <sstream>
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

std::string describe(const nlohmann::json& v) { return shown(v) + " (" + v.type_name() + ")"; }

std::string range(double lo, double hi) {
  std::ostringstream os;
  os << "[" << lo << ", " << hi << "]";
  return os.str();
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

std::optional<nlohmann::json> try_parse_json(std::string_view text, const std::string& what, std::string* why) {
  try {
    return parse_json(text, what);
  } catch (const InputError& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
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

JsonObject::JsonObject(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
  if (!j_.is_object()) throw InputError(where_ + ": expected a JSON object, got " + describe(j_));
}

std::string JsonObject::path(const std::string& key) const {
  const bool top = where_.find(": ") == std::string::npos;
  return where_ + (top ? ": " : ".") + key;
}

bool JsonObject::has(const std::string& key) {
  known_.insert(key);
  return j_.contains(key);
}

const nlohmann::json& JsonObject::required(const std::string& key) {
  known_.insert(key);
  if (!j_.contains(key)) throw InputError(path(key) + ": missing field");
  return j_.at(key);
}

double JsonObject::number(const std::string& key, double lo, double hi) {
  return json_number_in(required(key), path(key), lo, hi);
}

int64_t JsonObject::integer(const std::string& key, int64_t lo, int64_t hi) {
  return json_integer_in(required(key), path(key), lo, hi);
}

std::string JsonObject::string(const std::string& key) {
  const nlohmann::json& v = required(key);
  if (!v.is_string() || v.get<std::string>().empty()) {
    throw InputError(path(key) + ": expected a non-empty string, got " + describe(v));
  }
  return v.get<std::string>();
}

const nlohmann::json& JsonObject::array(const std::string& key) {
  const nlohmann::json& v = required(key);
  if (!v.is_array()) throw InputError(path(key) + ": expected an array, got " + describe(v));
  return v;
}

void JsonObject::reject_unknown() const {
  for (const auto& [key, value] : j_.items()) {
    if (known_.count(key) == 0) throw InputError(path(key) + ": unknown field (a typo?)");
  }
}

double json_number_in(const nlohmann::json& v, const std::string& path, double lo, double hi) {
  if (!v.is_number()) throw InputError(path + ": expected a number, got " + describe(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    throw InputError(path + ": " + describe(v) + " is outside " + range(lo, hi));
  }
  return x;
}

int64_t json_integer_in(const nlohmann::json& v, const std::string& path, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw InputError(path + ": expected an integer, got " + describe(v));
  // A JSON integer above INT64_MAX parses as unsigned; it is out of every range used here.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw InputError(path + ": " + describe(v) + " is outside " + range(lo, hi));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw InputError(path + ": " + describe(v) + " is outside " + range(lo, hi));
  return x;
}

}  // namespace dloco
