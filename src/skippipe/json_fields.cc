// The SkipPipe files' shared fields; see json_fields.h.
#include "skippipe/json_fields.h"

#include "core/check.h"

namespace dloco::skippipe {

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
