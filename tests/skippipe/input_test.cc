// Bad SkipPipe input is refused with the field named (issue 13, part 1): each case breaks one field of a valid
// setting or schedule and checks that InputError's message carries that field's path.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/check.h"
#include "skippipe/schedule.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {
namespace {

nlohmann::json valid_setting() {
  return {{"format", "dloco-skippipe-setting"},
          {"version", 1},
          {"source", "test"},
          {"notes", {"a note"}},
          {"regions", {"A", "B"}},
          {"nodes", {{{"region", "A"}, {"forward_s", 1.0}}, {{"region", "B"}, {"forward_s", 1.0}},
                     {{"region", "B"}, {"forward_s", 1.0}}}},
          {"links", {{{"regions", {"A", "B"}}, {"latency_s", 0.01}, {"bandwidth_bytes_per_s", 1e6}}}},
          {"default_link", {{"latency_s", 0.001}, {"bandwidth_bytes_per_s", 1e9}}},
          {"hop_overhead_s", 0.0},
          {"bytes_per_hop", 1000},
          {"memory_capacity", 2},
          {"backward_factor", 1.5},
          {"head_factor", 0.25}};
}

nlohmann::json valid_schedule() {
  return {{"format", "dloco-skippipe-schedule"},
          {"version", 1},
          {"source", "test"},
          {"method", "test"},
          {"placement", {{0}, {1}, {2}}},
          {"micro_batches", {{{"id", 0}, {"data_node", 0}, {"path", {1, 2}}, {"inject_s", 0.0}},
                             {{"id", 1}, {"data_node", 0}, {"path", {2}}, {"inject_s", 0.5}}}}};
}

// Runs `f`, which must throw InputError mentioning `needle`.
void expect_refused(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an InputError mentioning " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

void expect_setting_refused(const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
  nlohmann::json j = valid_setting();
  edit(j);
  expect_refused([&] { parse_setting(j, "s.json"); }, needle);
}

void expect_schedule_refused(const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
  const Setting setting = parse_setting(valid_setting(), "s.json");
  nlohmann::json j = valid_schedule();
  edit(j);
  expect_refused([&] { parse_schedule(j, "p.json", setting); }, needle);
}

TEST(SkipPipeInput, ValidFilesParse) {
  const Setting s = parse_setting(valid_setting(), "s.json");
  EXPECT_EQ(s.node_count(), 3);
  EXPECT_DOUBLE_EQ(s.hop_s(0, 1), 0.01 + 1000 / 1e6);  // A-B from the table
  EXPECT_DOUBLE_EQ(s.hop_s(1, 2), 0.001 + 1000 / 1e9);  // B-B: default_link
  EXPECT_EQ(s.hop_s(2, 2), 0.0);
  const Schedule p = parse_schedule(valid_schedule(), "p.json", s);
  EXPECT_EQ(p.micro_batches.size(), 2u);
  EXPECT_EQ(p.stage_of_node, (std::vector<int>{0, 1, 2}));
}

TEST(SkipPipeInput, SettingFieldsAreNamed) {
  expect_setting_refused([](auto& j) { j["format"] = "toml"; }, "s.json: format");
  expect_setting_refused([](auto& j) { j["version"] = 2; }, "s.json: version");
  expect_setting_refused([](auto& j) { j.erase("memory_capacity"); }, "s.json: memory_capacity: missing field");
  expect_setting_refused([](auto& j) { j["memory_capacity"] = 0; }, "s.json: memory_capacity");
  expect_setting_refused([](auto& j) { j["memory_capacity"] = 2.5; }, "memory_capacity: expected an integer");
  expect_setting_refused([](auto& j) { j["memory"] = 3; }, "s.json: memory: unknown field");
  expect_setting_refused([](auto& j) { j["nodes"][1]["forward_s"] = -1.0; }, "s.json: nodes[1].forward_s");
  expect_setting_refused([](auto& j) { j["nodes"][1]["forward_s"] = "fast"; }, "nodes[1].forward_s: expected a number");
  expect_setting_refused([](auto& j) { j["nodes"][2]["region"] = "Mars"; }, "nodes[2].region: \"Mars\" is not in");
  expect_setting_refused([](auto& j) { j["nodes"][0]["gpu"] = "h100"; }, "nodes[0].gpu: unknown field");
  expect_setting_refused([](auto& j) { j["nodes"] = nlohmann::json::array(); }, "s.json: nodes");
  expect_setting_refused([](auto& j) { j["regions"] = {"A", "A"}; }, "regions[1]: region \"A\" twice");
  expect_setting_refused([](auto& j) { j["links"][0]["regions"][1] = "C"; }, "links[0].regions[1]");
  expect_setting_refused([](auto& j) { j["links"][0]["bandwidth_bytes_per_s"] = 0; },
                         "links[0].bandwidth_bytes_per_s");
  expect_setting_refused([](auto& j) { j["links"].push_back(j["links"][0]); j["links"][1]["regions"] = {"B", "A"}; },
                         "links[1].regions: the pair B-A is given twice");
  expect_setting_refused([](auto& j) { j["default_link"].erase("latency_s"); }, "default_link.latency_s");
  expect_setting_refused([](auto& j) { j["hop_overhead_s"] = -0.1; }, "s.json: hop_overhead_s");
  // Times past a million seconds are refused (they overflowed the scheduler's and the nodes' clocks: a new user's
  // 1e308 reached an internal check, 1e13 made the emulated links wait nothing).
  expect_setting_refused([](auto& j) { j["hop_overhead_s"] = 1e13; }, "s.json: hop_overhead_s");
  expect_setting_refused([](auto& j) { j["bytes_per_hop"] = 1e300; }, "takes");
  expect_setting_refused([](auto& j) { j["notes"] = {1}; }, "notes[0]: expected a string");
}

TEST(SkipPipeInput, ScheduleFieldsAreNamed) {
  expect_schedule_refused([](auto& j) { j["format"] = "dloco-skippipe-setting"; }, "p.json: format");
  expect_schedule_refused([](auto& j) { j["placement"][1] = {0}; }, "placement[1][0]: node 0 is already in stage 0");
  expect_schedule_refused([](auto& j) { j["placement"][2] = {7}; }, "placement[2][0]");
  expect_schedule_refused([](auto& j) { j["placement"] = nlohmann::json::array(); }, "p.json: placement");
  expect_schedule_refused([](auto& j) { j["micro_batches"][1]["data_node"] = 1; },
                          "micro_batches[1].data_node: node 1 is not in stage 0");
  expect_schedule_refused([](auto& j) { j["micro_batches"][0]["path"] = {1, 0}; },
                          "micro_batches[0].path[1]: node 0 is in stage 0");
  expect_schedule_refused([](auto& j) { j["micro_batches"][0]["path"] = {2, 2}; },
                          "micro_batches[0].path[1]: node 2 visits stage 2 again");
  expect_schedule_refused([](auto& j) { j["micro_batches"][0]["path"] = {1, -1}; }, "micro_batches[0].path[1]");
  expect_schedule_refused([](auto& j) { j["micro_batches"][1]["id"] = 0; }, "micro_batches[1].id: id 0 is used twice");
  expect_schedule_refused([](auto& j) { j["micro_batches"][1]["inject_s"] = -1; }, "micro_batches[1].inject_s");
  expect_schedule_refused([](auto& j) { j["micro_batches"][1].erase("path"); },
                          "micro_batches[1].path: missing field");
  expect_schedule_refused([](auto& j) { j["micro_batches"] = nlohmann::json::array(); }, "p.json: micro_batches");
  expect_schedule_refused([](auto& j) { j["paths"] = 1; }, "p.json: paths: unknown field");
}

TEST(SkipPipeInput, FilesAndModes) {
  expect_refused([] { load_setting("/nonexistent/setting.json"); }, "/nonexistent/setting.json: cannot open");
  // A key written twice (a hand-edited file) is refused, not read as its last value.
  const std::string twice = (std::filesystem::temp_directory_path() / "dloco_setting_twice.json").string();
  std::string text = valid_setting().dump();
  text.insert(1, "\"memory_capacity\": 9, ");
  std::ofstream(twice) << text;
  expect_refused([&] { load_setting(twice); }, twice + ": duplicate key 'memory_capacity' in one object");
  std::filesystem::remove(twice);
  expect_refused([] { parse_sim_mode("fast"); }, "unknown simulator mode \"fast\"");
  EXPECT_EQ(parse_sim_mode("reference"), SimMode::kReference);
  // The reference cannot run a micro-batch that visits no stage; the exact model can.
  const Setting s = parse_setting(valid_setting(), "s.json");
  nlohmann::json j = valid_schedule();
  j["micro_batches"][1]["path"] = nlohmann::json::array();
  const Schedule p = parse_schedule(j, "p.json", s);
  expect_refused([&] { simulate_reference(s, p); }, "micro-batch 1: an empty path");
  EXPECT_EQ(simulate_exact(s, p).completed, 2);
}

}  // namespace
}  // namespace dloco::skippipe
