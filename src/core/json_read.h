// Checked reads of JSON a process did not write itself (state.json, stream logs, cursors, SkipPipe files,
// safetensors headers). parse_json refuses duplicate object keys, which nlohmann accepts keeping the last one (a
// hand-edited file with a key twice would silently mean its second value). nlohmann's get<int64_t>() on a float
// such as 1e38 casts it out of range, which is undefined behaviour (found by fuzz/stream_log.cc): the number reads
// refuse anything but what the field can hold, with an InputError naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dloco {

/// The JSON document in `text`. Throws InputError "WHAT: not valid JSON (PARSER'S MESSAGE)" for a syntax error or
/// a number too large for a double, and "WHAT: duplicate key 'K' in one object" when an object has a key twice.
nlohmann::json parse_json(std::string_view text, const std::string& what);

/// `v` as an integer: a JSON integer (signed, or unsigned ≤ INT64_MAX), or a float with an integral value in
/// (−2^63, 2^63). Throws InputError "WHAT: expected an integer, got …" otherwise.
int64_t json_integer(const nlohmann::json& v, const std::string& what);

/// `j[key]` as json_integer, or `fallback` when `j` has no such key. Throws InputError naming "WHAT: KEY".
int64_t json_integer_or(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& what);

/// `v` as a finite number. Throws InputError "WHAT: expected a finite number, got …" otherwise.
double json_number(const nlohmann::json& v, const std::string& what);

}  // namespace dloco
