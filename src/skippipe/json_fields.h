// Strict reading of the SkipPipe JSON files (setting and schedule): every field is required unless the caller
// says otherwise, has a checked type and range, and unknown keys are errors. Every message names the file and
// the field's path (`configs/x.json: nodes[3].forward_s: ...`), so bad input is fixed without reading code.
// Deliberately not here: what the fields mean (setting.h, schedule.h), and any default values.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace dloco::skippipe {

/// One JSON object being read. `where` is the path of the object itself ("FILE" or "FILE: nodes[3]").
class JsonObject {
 public:
  /// InputError "WHERE: expected a JSON object" when `j` is not an object.
  JsonObject(const nlohmann::json& j, std::string where);

  /// The path of a field of this object, for messages: "FILE: nodes[3].forward_s".
  std::string path(const std::string& key) const;
  /// Whether the field is present (marks it as known).
  bool has(const std::string& key);
  /// The field's value; InputError "PATH: missing field" when absent.
  const nlohmann::json& required(const std::string& key);
  /// A finite number in [lo, hi]; InputError naming the field otherwise.
  double number(const std::string& key, double lo, double hi);
  /// An integer (a JSON number without a fraction or exponent) in [lo, hi]; InputError naming the field otherwise.
  int64_t integer(const std::string& key, int64_t lo, int64_t hi);
  /// A non-empty string; InputError naming the field otherwise.
  std::string string(const std::string& key);
  /// An array (possibly empty); InputError naming the field otherwise.
  const nlohmann::json& array(const std::string& key);
  /// Marks fields as known without reading them (documentation fields such as "notes").
  void allow(const std::string& key) { known_.insert(key); }
  /// InputError naming the first field that no call above has read or allowed (unknown keys are errors).
  void reject_unknown() const;

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> known_;
};

/// A finite number in [lo, hi] at `path` (an array element); InputError naming `path` otherwise.
double json_number(const nlohmann::json& v, const std::string& path, double lo, double hi);
/// An integer in [lo, hi] at `path` (an array element); InputError naming `path` otherwise.
int64_t json_integer(const nlohmann::json& v, const std::string& path, int64_t lo, int64_t hi);
/// The JSON document in file `path`; InputError when it cannot be opened or is not valid JSON (with the parser's
/// position).
nlohmann::json read_json_file(const std::string& path);
/// The optional "notes" field: an array of strings (documentation); InputError naming the element otherwise.
void read_notes(JsonObject& o);
/// Checks "format" and "version" of a SkipPipe file: InputError unless format == `format` and version == 1.
void check_format(JsonObject& o, const std::string& format);

}  // namespace dloco::skippipe
