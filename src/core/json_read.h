// Checked reads of JSON a process did not write itself (state.json, stream logs, cursors, SkipPipe files,
// safetensors headers): the one JSON reader of dloco (files on disk: process/json_file.h). parse_json refuses duplicate object keys, which nlohmann accepts keeping the last one (a
// hand-edited file with a key twice would silently mean its second value). nlohmann's get<int64_t>() on a float
// such as 1e38 casts it out of range, which is undefined behaviour (found by fuzz/stream_log.cc): the number reads
// refuse anything but what the field can hold, with an InputError naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dloco {

/// The JSON document in `text`. Throws InputError "WHAT: not valid JSON (PARSER'S MESSAGE)" for a syntax error or
/// a number too large for a double, and "WHAT: duplicate key 'K' in one object" when an object has a key twice.
nlohmann::json parse_json(std::string_view text, const std::string& what);

/// parse_json that does not throw, for files another process may be replacing or may not have written yet (a
/// launcher polling a role's state.json): the document, or nullopt with parse_json's message in `*why` when given.
std::optional<nlohmann::json> try_parse_json(std::string_view text, const std::string& what,
                                             std::string* why = nullptr);

/// `v` as an integer: a JSON integer (signed, or unsigned ≤ INT64_MAX), or a float with an integral value in
/// (−2^63, 2^63). Throws InputError "WHAT: expected an integer, got …" otherwise.
int64_t json_integer(const nlohmann::json& v, const std::string& what);

/// `j[key]` as json_integer, or `fallback` when `j` has no such key. Throws InputError naming "WHAT: KEY".
int64_t json_integer_or(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& what);

/// `v` as a finite number. Throws InputError "WHAT: expected a finite number, got …" otherwise.
double json_number(const nlohmann::json& v, const std::string& what);

/// A finite number in [lo, hi] at `path`; InputError "PATH: V (type) is outside [lo, hi]" otherwise.
double json_number_in(const nlohmann::json& v, const std::string& path, double lo, double hi);
/// A JSON integer (no fraction or exponent: stricter than json_integer) in [lo, hi] at `path`; InputError naming
/// `path` otherwise.
int64_t json_integer_in(const nlohmann::json& v, const std::string& path, int64_t lo, int64_t hi);

/// One JSON object of a hand-written file being read field by field (the SkipPipe setting and schedule): every field
/// is required unless the caller asks `has` first, has a checked type and range, and unknown keys are errors. Every
/// message names the file and the field's path (`configs/x.json: nodes[3].forward_s: ...`), so bad input is fixed
/// without reading code. `where` is the path of the object itself ("FILE" or "FILE: nodes[3]").
class JsonObject {
 public:
  /// InputError "WHERE: expected a JSON object" when `j` is not an object. `j` must outlive this object.
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

}  // namespace dloco
