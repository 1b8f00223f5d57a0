#include "core/json_read.h"

#include <cmath>

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
