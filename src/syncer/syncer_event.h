// The one helper SyncerState's transitions (syncer_state.cc, syncer_rounds.cc, syncer_merge.cc) share to build the
// events they return in SyncerActions::events (docs/protocol.md: every decision is an event with its reason).
#pragma once

#include <nlohmann/json.hpp>

namespace dloco::syncer_detail {

/// `fields` with "event": `name` added.
inline nlohmann::json event(const char* name, nlohmann::json fields) {
  fields["event"] = name;
  return fields;
}

}  // namespace dloco::syncer_detail
