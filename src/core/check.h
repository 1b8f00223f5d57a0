// Invariant checks (error tier 1: a bug). On in every build; they print both values and file:line and throw
// dloco::InvariantError, which the edge of the program reports. Bad input (tier 3) uses dloco::InputError
// with a message that says what was wrong and what to do; recoverable distributed faults (tier 2) are
// returned as values, never thrown.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dloco {

/// A broken invariant: a bug in dloco, never the user's fault.
class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Bad input or bad set-up (missing file, wrong magic, unknown config key, refused credentials).
/// The message says what was wrong and what to do.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void check_failed(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << "dloco invariant failed at " << file << ":" << line << ": " << what;
  throw InvariantError(os.str());
}
}  // namespace detail

}  // namespace dloco

#define DLOCO_CHECK(cond)                                                        \
  do {                                                                           \
    if (!(cond)) ::dloco::detail::check_failed(__FILE__, __LINE__, #cond);       \
  } while (0)

#define DLOCO_CHECK_OP(a, op, b)                                                         \
  do {                                                                                   \
    const auto& dloco_a_ = (a);                                                          \
    const auto& dloco_b_ = (b);                                                          \
    if (!(dloco_a_ op dloco_b_)) {                                                       \
      std::ostringstream dloco_os_;                                                      \
      dloco_os_ << #a " " #op " " #b " (" << dloco_a_ << " vs " << dloco_b_ << ")";      \
      ::dloco::detail::check_failed(__FILE__, __LINE__, dloco_os_.str());                \
    }                                                                                    \
  } while (0)

#define DLOCO_CHECK_EQ(a, b) DLOCO_CHECK_OP(a, ==, b)
#define DLOCO_CHECK_LE(a, b) DLOCO_CHECK_OP(a, <=, b)
#define DLOCO_CHECK_LT(a, b) DLOCO_CHECK_OP(a, <, b)
#define DLOCO_CHECK_GE(a, b) DLOCO_CHECK_OP(a, >=, b)
#define DLOCO_CHECK_GT(a, b) DLOCO_CHECK_OP(a, >, b)
