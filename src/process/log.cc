// The process's log; see log.h.
#include "process/log.h"

#include <memory>

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace dloco {

namespace {

// stderr, but only the levels below warn (the lines without a level word): spdlog's sinks filter by a minimum level
// only, and a pattern belongs to a sink, so the two formats are two sinks on the same stream.
class BelowWarnSink final : public spdlog::sinks::stderr_color_sink_mt {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn) spdlog::sinks::stderr_color_sink_mt::log(msg);
  }
};

}  // namespace

void init_logging() {
  auto out = std::make_shared<BelowWarnSink>();
  out->set_pattern("%H:%M:%S %v");
  auto err = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  err->set_level(spdlog::level::warn);
  err->set_pattern("%H:%M:%S %^%l%$ %v");
  auto logger = std::make_shared<spdlog::logger>("dloco", spdlog::sinks_init_list{out, err});
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  spdlog::cfg::load_env_levels();
}

}  // namespace dloco
