// The live metrics and dashboard of a running decoupled run (issue 15, "Metrics and dashboard"), with the real
// `dloco train` (syncer, 2 learners, evaluator) of a tiny model:
//   - the syncer's /metrics and a learner's /metrics parse as Prometheus text format 0.0.4 (every sample's metric has
//     one # TYPE, counters end in _total, values are numbers, label values quoted) and carry the run's metrics with
//     learner labels;
//   - /status.json carries goodput (1 while nothing was lost) and a history of the counters and of each learner's
//     loss and tokens/s;
//   - headless Chromium (Debian's `chromium`) loads the dashboard while the run trains; the DOM it renders has one
//     row per learner, live, and the four charts drawn from that history: each learner's training loss and the
//     validation loss, each learner's tokens/s, the syncer's traffic up and down, merges over time.
// The checks wait for steps and evaluations (counts, not times), so they hold on faster and slower machines.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support/process_checks.h"
#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
namespace testing_support = dloco::testing_support;
using nlohmann::json;
using testing_support::read_events;
using testing_support::slurp;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

// GET http://host:port/path; "" on failure.
std::string http_get(const std::string& host_port, const std::string& path) {
  const auto colon = host_port.rfind(':');
  httplib::Client client(host_port.substr(0, colon), std::stoi(host_port.substr(colon + 1)));
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  const auto res = client.Get(path.c_str());
  return res && res->status == 200 ? res->body : "";
}

// Checks `text` against the Prometheus text format 0.0.4; returns the samples by metric name (the problems are
// test failures).
std::map<std::string, std::vector<std::pair<std::string, double>>> parse_prometheus(const std::string& text) {
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::map<std::string, std::string> types;
  std::map<std::string, std::vector<std::pair<std::string, double>>> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, m, type)) {
      EXPECT_EQ(types.count(m[1]), 0u) << "a second # TYPE for " << m[1];
      types[m[1]] = m[2];
      continue;
    }
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not a Prometheus sample line: '" << line << "'";
      continue;
    }
    const std::string name = m[1], value = m[5];
    EXPECT_TRUE(types.count(name)) << name << " has no # TYPE before its samples";
    if (types[name] == "counter") {
      EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_total") << name;
    }
    EXPECT_EQ(name.rfind("dloco_", 0), 0u) << name;
    double v = 0;
    try {
      // prometheus-cpp writes NaN as "Nan" (Prometheus reads it case-insensitively)
      v = value == "NaN" || value == "Nan" ? NAN
          : value == "+Inf"                ? INFINITY
          : value == "-Inf"                ? -INFINITY
                                           : std::stod(value);
    } catch (const std::exception&) {
      ADD_FAILURE() << "value '" << value << "' of " << name << " is not a number";
    }
    out[name].emplace_back(m[2], v);
  }
  return out;
}

TEST(LiveMonitor, MetricsParseAsPrometheusAndChromiumRendersTheDashboardOfALiveRun) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_monitor", kDataTool);
  ASSERT_FALSE(root.empty());
  // M = 2 with far more budget than the test lets them train; an evaluation every 5 global steps.
  const auto cfg = testing_support::write_decoupled_config(root, "live", 2 * 100000 * 8 * 32,
                                                           "learner_monitor = \"127.0.0.1:0\"\n", 8, 32, 2, 5);
  const fs::path run = root / "live";
  const pid_t launcher = testing_support::spawn_to_log(kDloco, {"train", "--config", cfg.string()}, root / "live.log");
  ASSERT_GT(launcher, 0);
  testing_support::ChildGuard guard;
  guard.hold(launcher);

  // Both learners stepping and three evaluations reported (the curve has points).
  auto ready = [&] {
    int evals = 0;
    for (const auto& e : read_events(run / "events" / "syncer.jsonl")) evals += e["event"] == "eval";
    int stepping = 0;
    for (int id : {0, 1}) {
      int steps = 0;
      for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
        steps += e["event"] == "step";
      }
      stepping += steps >= 5 ? 1 : 0;
    }
    return evals >= 3 && stepping == 2;
  };
  bool up = false;
  for (int i = 0; i < 3000 && !up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    up = ready();
  }
  ASSERT_TRUE(up) << slurp(root / "live.log");
  std::string url;
  std::ifstream(run / "monitor.url") >> url;
  ASSERT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << "monitor.url: '" << url << "'";
  const std::string host_port = url.substr(7, url.size() - 8);
  EXPECT_NE(slurp(root / "live.log").find("[launcher] dashboard " + url), std::string::npos)
      << slurp(root / "live.log");

  // The syncer's metrics.
  const auto syncer = parse_prometheus(http_get(host_port, "/metrics"));
  for (const char* name : {"dloco_global_step", "dloco_merges_total", "dloco_tokens_trained_total",
                           "dloco_learners_live", "dloco_validation_loss", "dloco_goodput_ratio",
                           "dloco_learner_step", "dloco_learner_heartbeat_age_seconds", "dloco_fragment_version"}) {
    EXPECT_TRUE(syncer.count(name)) << name << " missing from the syncer's /metrics";
  }
  ASSERT_TRUE(syncer.count("dloco_learner_up"));
  std::set<std::string> labels;
  for (const auto& [l, v] : syncer.at("dloco_learner_up")) labels.insert(l);
  EXPECT_EQ(labels, (std::set<std::string>{"{learner=\"0\"}", "{learner=\"1\"}"}));
  EXPECT_EQ(syncer.at("dloco_learners_live")[0].second, 2);

  // A learner's own metrics.
  std::string learner_url;
  for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
    if (e["event"] == "monitor") learner_url = e["url"];
  }
  ASSERT_FALSE(learner_url.empty()) << "learner 0 announced no /metrics endpoint";
  const auto learner = parse_prometheus(http_get(learner_url.substr(7, learner_url.size() - 8), "/metrics"));
  ASSERT_TRUE(learner.count("dloco_learner_step"));
  EXPECT_GE(learner.at("dloco_learner_step")[0].second, 5);
  EXPECT_TRUE(learner.count("dloco_learner_tokens_per_second"));

  // The status's history: sampled every second, so wait (by count) until each learner has two samples of its loss.
  json status;
  auto samples = [&](const std::string& name) {
    int n = 0;
    for (const auto& v : status["history"]["series"].value(name, json::array())) n += v.is_number() ? 1 : 0;
    return n;
  };
  for (int i = 0; i < 600; ++i) {
    const std::string body = http_get(host_port, "/status.json");
    status = body.empty() ? json::object() : json::parse(body);
    if (status.contains("history") && samples("learner/0/loss") >= 2 && samples("learner/1/loss") >= 2 &&
        samples("bytes_sent") >= 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_GE(samples("learner/0/loss"), 2) << status.dump();
  ASSERT_GE(samples("learner/1/loss"), 2) << status.dump();
  EXPECT_EQ(status["history"]["t"].size(), status["history"]["series"]["merges"].size());
  ASSERT_TRUE(status["goodput"].is_number()) << status.dump();
  if (status["tokens_lost"] == 0) {
    EXPECT_EQ(status["goodput"], 1.0) << "nothing was thrown away, so nothing counts as lost";
  } else {
    EXPECT_LT(status["goodput"].get<double>(), 1.0);
  }

  // The dashboard in a real browser: the DOM after its script drew the status (virtual time lets it poll).
  const fs::path profile = root / "chromium-profile";
  const std::string chromium =
      "chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync --user-data-dir=" +
      profile.string() + " --virtual-time-budget=5000 --dump-dom " + url + " > " + (root / "dom.html").string() +
      " 2> " + (root / "chromium.log").string();
  ASSERT_EQ(std::system(("timeout 120 " + chromium).c_str()), 0) << slurp(root / "chromium.log");
  const std::string dom = slurp(root / "dom.html");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(data-updates="(\d+)")re"))) << dom;
  EXPECT_GE(std::stoi(m[1]), 1) << "the page's script never drew a status:\n" << dom;
  for (int id : {0, 1}) {
    EXPECT_TRUE(std::regex_search(dom, std::regex("<tr class=\"learner live\" data-id=\"" + std::to_string(id) +
                                                  "\" data-state=\"live\">")))
        << "learner " << id << "'s row:\n" << dom;
  }
  // Each chart's series, as drawn: polyline.series with data-series (its name) and data-points (its point count).
  auto points_of = [&](const std::string& chart, const std::string& series) {
    const size_t at = dom.find("id=\"" + chart + "\"");
    if (at == std::string::npos) return -1;
    const std::string svg = dom.substr(at, dom.find("</svg>", at) - at);
    std::smatch p;
    const std::regex line("<polyline class=\"series\" data-series=\"" + series + "\" data-points=\"(\\d+)\"");
    return std::regex_search(svg, p, line) ? std::stoi(p[1]) : 0;
  };
  for (const std::string who : {"learner 0", "learner 1"}) {
    EXPECT_GE(points_of("chart-loss", who), 2) << who << "'s training loss curve:\n" << dom;
    EXPECT_GE(points_of("chart-speed", who), 2) << who << "'s tokens/s curve:\n" << dom;
  }
  EXPECT_GE(points_of("chart-loss", "validation"), 3) << "the validation curve:\n" << dom;
  EXPECT_GE(points_of("chart-bytes", "up"), 1) << "the traffic up:\n" << dom;
  EXPECT_GE(points_of("chart-bytes", "down"), 1) << "the traffic down:\n" << dom;
  EXPECT_GE(points_of("chart-events", "merges"), 2) << "the merges:\n" << dom;
  EXPECT_NE(dom.find("id=\"goodput-definition\""), std::string::npos) << "goodput's definition is on the page";

  guard.kill(launcher, SIGINT, "the launcher");
  int exit_status = 0;
  ::waitpid(launcher, &exit_status, 0);
  testing_support::remove_unless_kept(root);
}

}  // namespace
