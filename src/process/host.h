// Where a process runs, as its events and the syncer's logs name it (the multi-node tests check it).
#pragma once

#include <unistd.h>

#include <string>

namespace dloco {

/// This machine's host name (gethostname(2)); "" when it cannot be read.
inline std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace dloco
