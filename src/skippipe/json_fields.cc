// Strict JSON field reading for the SkipPipe files (see json_fields.h).
#include "skippipe/json_fields.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/json_read.h"

namespace dloco::skippipe {

namespace {

std::string describe(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s + " (" + v.type_name() + ")";
}

std::string range(double lo, double hi) {
  std::ostringstream os;
  os << "[" << lo << ", " << hi << "]";
  return os.str();
}

}  // namespace

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
  return json_number(required(key), path(key), lo, hi);
}

int64_t JsonObject::integer(const std::string& key, int64_t lo, int64_t hi) {
  return json_integer(required(key), path(key), lo, hi);
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

double json_number(const nlohmann::json& v, const std::string& path, double lo, double hi) {
  if (!v.is_number()) throw InputError(path + ": expected a number, got " + describe(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    throw InputError(path + ": " + describe(v) + " is outside " + range(lo, hi));
  }
  return x;
}

int64_t json_integer(const nlohmann::json& v, const std::string& path, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw InputError(path + ": expected an integer, got " + describe(v));
  // A JSON integer above INT64_MAX parses as unsigned; it is out of every range used here.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw InputError(path + ": " + describe(v) + " is outside " + range(lo, hi));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw InputError(path + ": " + describe(v) + " is outside " + range(lo, hi));
  return x;
}

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": a folder, not a JSON file");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": cannot read the file");
  return parse_json(text.str(), path);  // duplicate keys refused too
}

void read_notes(JsonObject& o) {
  if (!o.has("notes")) return;
  const nlohmann::json& arr = o.array("notes");
  for (size_t i = 0; i < arr.size(); ++i) {
    if (!arr[i].is_string()) throw InputError(o.path("notes") + "[" + std::to_string(i) + "]: expected a string");
  }
}

void check_format(JsonObject& o, const std::string& format) {
  const std::string got = o.string("format");
  if (got != format) throw InputError(o.path("format") + ": \"" + got + "\", expected \"" + format + "\"");
  o.integer("version", 1, 1);
}

}  // namespace dloco::skippipe
