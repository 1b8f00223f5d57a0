// What the two SkipPipe file formats (setting.h, schedule.h) share beyond core/json_read.h's strict field reading:
// the optional "notes" and the "format"/"version" header.
#pragma once

#include <string>

#include "core/json_read.h"

namespace dloco::skippipe {

/// The optional "notes" field: an array of strings (documentation); InputError naming the element otherwise.
void read_notes(JsonObject& o);
/// Checks "format" and "version" of a SkipPipe file: InputError unless format == `format` and version == 1.
void check_format(JsonObject& o, const std::string& format);

}  // namespace dloco::skippipe
