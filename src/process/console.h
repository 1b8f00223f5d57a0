// Console helpers shared by the local run and the launcher.
#pragma once

#include <algorithm>
#include <string>

namespace dloco {

/// A text progress bar such as "[######..................]" for fraction in [0, 1] (clamped).
inline std::string progress_bar(double fraction, int width = 24) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * width);
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

}  // namespace dloco
