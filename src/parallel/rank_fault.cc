// The chaos hook for learner groups; see rank_fault.h.
#include "parallel/rank_fault.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace dloco {

namespace {

struct Spec {
  bool on = false;
  int rank = -1;
  std::string point;
  long step = 0;
  std::string file;
  int signal = SIGKILL;  // or SIGSTOP (":stop")
};

Spec parse(const char* value) {
  Spec s;
  if (value == nullptr || *value == '\0') return s;
  const std::string v(value);
  const auto a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1),
             c = b == std::string::npos ? b : v.find(':', b + 1);
  try {
    if (c == std::string::npos) throw std::invalid_argument("fields");
    s.rank = std::stoi(v.substr(0, a));
    s.point = v.substr(a + 1, b - a - 1);
    s.step = std::stol(v.substr(b + 1, c - b - 1));
    s.file = v.substr(c + 1);
    if (s.file.size() > 5 && s.file.compare(s.file.size() - 5, 5, ":stop") == 0) {
      s.file.resize(s.file.size() - 5);
      s.signal = SIGSTOP;
    }
    const bool known = s.point == "forward" || s.point == "backward" || s.point == "reduce" || s.point == "optimizer";
    if (!known || s.rank < 0 || s.step < 1 || s.file.empty()) throw std::invalid_argument("values");
  } catch (const std::exception&) {
    std::fprintf(stderr, "DLOCO_RANK_FAULT='%s' ignored: want RANK:POINT:STEP:FILE[:stop] with POINT forward, backward, "
                 "reduce or optimizer, RANK >= 0, STEP >= 1\n", value);
    return Spec{};
  }
  s.on = true;
  return s;
}

const Spec& spec() {
  static const Spec s = parse(std::getenv("DLOCO_RANK_FAULT"));
  return s;
}

int g_rank = -1;
long g_step = 0;

}  // namespace

void rank_fault_step(int rank) {
  if (!spec().on) return;
  g_rank = rank;
  ++g_step;
}

void rank_fault_point(const char* point) {
  const Spec& s = spec();
  if (!s.on || g_rank != s.rank || g_step != s.step || s.point != point) return;
  std::error_code ec;
  if (std::filesystem::exists(s.file, ec)) return;  // fired once already (this run)
  {
    std::ofstream out(s.file);
    out.precision(17);
    out << std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() << "\n";
  }
  ::kill(::getpid(), s.signal);
}

}  // namespace dloco
