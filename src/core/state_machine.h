// A declared state machine (PCCL's way): the states, the legal transitions written beside them, and a move that
// checks them. An illegal move is a bug (core/check.h tier 1): it throws InvariantError naming both states.
//
//   enum class Phase { kA, kB };
//   const char* to_string(Phase);
//   constexpr std::array<std::pair<Phase, Phase>, 1> kPhaseMoves = {{{Phase::kA, Phase::kB}}};
//   StateMachine<Phase, 1> phase(Phase::kA, kPhaseMoves);  phase.to(Phase::kB);
#pragma once

#include <array>
#include <string>
#include <utility>

#include "core/check.h"

namespace dloco {

template <class State, size_t N>
class StateMachine {
 public:
  using Moves = std::array<std::pair<State, State>, N>;

  constexpr StateMachine(State initial, const Moves& legal) : state_(initial), legal_(&legal) {}

  State state() const { return state_; }
  bool is(State s) const { return state_ == s; }
  /// True when `next` is a legal move from the current state.
  bool can(State next) const {
    for (const auto& [from, to] : *legal_) {
      if (from == state_ && to == next) return true;
    }
    return false;
  }
  /// Moves to `next`; throws InvariantError if the move is not declared.
  void to(State next) {
    if (!can(next)) {
      detail::check_failed(__FILE__, __LINE__, std::string("illegal transition ") + to_string(state_) + " -> " +
                                                   to_string(next));
    }
    state_ = next;
  }

 private:
  State state_;
  const Moves* legal_;
};

}  // namespace dloco
