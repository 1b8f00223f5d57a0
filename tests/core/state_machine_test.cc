// Declared state machines (core/state_machine.h): legal moves pass, undeclared ones are bugs that name both states.
#include "core/state_machine.h"

#include <gtest/gtest.h>

namespace dloco {
namespace {

enum class Light { kRed, kGreen, kYellow };
const char* to_string(Light l) { return l == Light::kRed ? "red" : l == Light::kGreen ? "green" : "yellow"; }
constexpr std::array<std::pair<Light, Light>, 3> kMoves = {
    {{Light::kRed, Light::kGreen}, {Light::kGreen, Light::kYellow}, {Light::kYellow, Light::kRed}}};

TEST(StateMachine, DeclaredMovesPassAndOthersAreBugsNamingBothStates) {
  StateMachine<Light, 3> light(Light::kRed, kMoves);
  EXPECT_TRUE(light.can(Light::kGreen));
  EXPECT_FALSE(light.can(Light::kYellow));
  light.to(Light::kGreen);
  light.to(Light::kYellow);
  try {
    light.to(Light::kGreen);
    FAIL() << "an undeclared move passed";
  } catch (const InvariantError& e) {
    EXPECT_NE(std::string(e.what()).find("yellow -> green"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(light.is(Light::kYellow)) << "a refused move changed the state";
}

}  // namespace
}  // namespace dloco
