// The launcher's stop signals; see stop_signals.h.
#include "process/stop_signals.h"

#include <signal.h>

#include <atomic>

namespace dloco {

namespace {

std::atomic<int> g_first{0};
std::atomic<int> g_requests{0};  // SIGINT, SIGTERM, SIGHUP received
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
struct sigaction g_previous[4];

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_first.compare_exchange_strong(none, sig);
  if (sig != SIGPIPE) g_requests.fetch_add(1);
}

}  // namespace

StopSignals::StopSignals() {
  g_first.store(0);
  g_requests.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < 4; ++i) ::sigaction(kSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 4; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

int StopSignals::first() { return g_first.load(); }

bool StopSignals::hurry() {
  const int first = g_first.load();
  return g_requests.load() >= (first == SIGPIPE ? 1 : 2);
}

}  // namespace dloco
