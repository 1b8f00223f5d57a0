// The syncer's data-stream leases; see stream_leases.h.
#include "syncer/stream_leases.h"

#include <algorithm>

#include "core/check.h"
#include "core/json_read.h"

namespace dloco {

int64_t StreamLeases::tokens(int64_t stream) const {
  const std::string& cursor = at(stream).cursor;
  if (cursor.empty()) return 0;
  const auto j = try_parse_json(cursor, "stream cursor");
  if (!j || !j->is_object()) return 0;
  try {
    return std::max<int64_t>(0, json_integer_or(*j, "tokens_served", 0, "stream cursor"));
  } catch (const InputError&) {  // unreadable: 0, as documented
    return 0;
  }
}

LeaseDecision StreamLeases::decide(int id, std::optional<int64_t> held, const std::set<int64_t>& busy,
                                   const IsLive& is_live) const {
  const int64_t S = size();
  LeaseDecision d;
  auto free_for = [&](int64_t s) {
    const int holder = leases_[s].holder;
    return holder < 0 || holder == id || !is_live(holder);
  };
  if (held) {
    const int64_t s = *held;
    if (s < 0 || s >= S) {
      d.refusal = wire::Code::kRefused;
      d.reason = "refused by the syncer: stream " + std::to_string(s) + " does not exist (data.streams = " +
                 std::to_string(S) + ")";
    } else if (!free_for(s)) {  // retryable: a joiner that found the log locked gives the lease back on its next join
      d.refusal = wire::Code::kAborted;
      d.reason = "stream " + std::to_string(s) + " is leased to live learner " + std::to_string(leases_[s].holder) +
                 " (two learners must never train one stream): retry";
    } else {
      d.stream = s;
      d.reason = "re-attaching: it holds this stream's log";
    }
    return d;
  }
  for (int64_t s : busy) {  // locked by a process the syncer lost track of: not ours to hand out
    if (s >= 0 && s < S && leases_[s].holder == id) d.release.push_back(s);
  }
  for (int64_t s = 0; s < S; ++s) {
    if (leases_[s].holder == id && !busy.count(s)) {
      d.stream = s;
      d.reason = "it held this stream before (a restart inherits its stream)";
      return d;
    }
  }
  if (id < S && !busy.count(id) && free_for(id)) {
    d.stream = id;
    d.reason = "its own slot's stream is free";
    return d;
  }
  int64_t best_tokens = 0;
  for (int64_t s = 0; s < S; ++s) {
    if (busy.count(s) || !free_for(s)) continue;
    if (d.stream < 0 || tokens(s) < best_tokens) {
      d.stream = s;
      best_tokens = tokens(s);
    }
  }
  if (d.stream >= 0) {
    d.reason = "a joiner: the free stream that has served the fewest tokens";
  } else {
    d.refusal = wire::Code::kExhausted;
    d.reason = "no free data stream: all " + std::to_string(S) + " streams (data.streams) are leased to live "
               "learners; a learner can join once one leaves or its lease runs out, or run with more streams";
  }
  return d;
}

int StreamLeases::grant(int id, const LeaseDecision& decision) {
  for (int64_t s : decision.release) {
    if (leases_[s].holder == id) leases_[s].holder = -1;
  }
  const int previous = leases_.at(static_cast<size_t>(decision.stream)).holder;
  hold_only(id, decision.stream);  // a stale lease of this id is released
  return previous;
}

void StreamLeases::hold_only(int id, int64_t stream) {
  for (auto& lease : leases_) {
    if (lease.holder == id) lease.holder = -1;
  }
  leases_[stream].holder = id;
}

bool StreamLeases::claim(int id, int64_t stream, bool leaving) {
  if (stream < 0 || stream >= size()) return false;
  if (leases_[stream].holder < 0 && !leaving) hold_only(id, stream);  // claimed back: it trains this one only
  return leases_[stream].holder == id;
}

void StreamLeases::release(int64_t stream) {
  if (stream >= 0 && stream < size()) leases_[stream].holder = -1;
}

std::optional<int64_t> StreamLeases::orphan(int64_t share, int64_t tokens_per_step, const std::set<int64_t>& excluded,
                                            const IsLive& is_live) const {
  std::optional<int64_t> best;
  int64_t best_tokens = 0;
  for (int64_t s = 0; s < size(); ++s) {
    if (excluded.count(s) || !is_orphan(s, share, tokens_per_step, is_live)) continue;
    const int64_t served = tokens(s);
    if (!best || served < best_tokens) {
      best = s;
      best_tokens = served;
    }
  }
  return best;
}

bool StreamLeases::is_orphan(int64_t stream, int64_t share, int64_t tokens_per_step, const IsLive& is_live) const {
  if (stream < 0 || stream >= size()) return false;
  const int holder = leases_[stream].holder;
  if (holder >= 0 && is_live(holder)) return false;
  return tokens(stream) + tokens_per_step <= share;  // else spent: its learner finished it
}

int StreamLeases::offer(int id, int64_t stream) {
  auto& lease = leases_.at(static_cast<size_t>(stream));
  const int previous = lease.holder;
  lease.holder = id;
  return previous;
}

void StreamLeases::accept(int id, int64_t stream) {
  if (stream < 0 || stream >= size()) return;
  hold_only(id, stream);
}

void StreamLeases::decline(int id, int64_t stream) {
  if (stream >= 0 && stream < size() && leases_[stream].holder == id) leases_[stream].holder = -1;
}

nlohmann::json StreamLeases::to_json() const {
  nlohmann::json j = {{"cursors", nlohmann::json::object()}, {"leases", nlohmann::json::object()}};
  for (int64_t s = 0; s < size(); ++s) {
    if (!leases_[s].cursor.empty()) j["cursors"][std::to_string(s)] = leases_[s].cursor;
    if (leases_[s].holder >= 0) j["leases"][std::to_string(s)] = leases_[s].holder;
  }
  return j;
}

std::vector<int64_t> StreamLeases::restore(const nlohmann::json& state) {
  std::vector<int64_t> dropped;
  for (const auto& [key, cursor] : state.at("cursors").items()) {
    const int64_t s = std::stoll(key);
    if (s < 0 || s >= size()) {
      dropped.push_back(s);
      continue;
    }
    leases_[s].cursor = cursor.get<std::string>();
  }
  // The holders before the restart: a learner that re-attaches keeps its stream, and a learner restarted with the
  // same id finds it again.
  const nlohmann::json leases = state.value("leases", nlohmann::json::object());
  for (const auto& [key, holder] : leases.items()) {
    const int64_t s = std::stoll(key);
    const int64_t id = json_integer(holder, "state.json: leases." + key);
    if (id < -1 || id > INT32_MAX) throw InputError("state.json: leases." + key + " names learner " + std::to_string(id));
    if (s >= 0 && s < size()) leases_[s].holder = static_cast<int>(id);
  }
  return dropped;
}

}  // namespace dloco
