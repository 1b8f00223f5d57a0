// JSON files on disk (process/json_file.h): a hand-written file's problems are named with its path; a polled file
// that is absent, a folder or broken is "not there yet", never an exception.
#include "process/json_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "core/check.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

std::string refusal(const fs::path& path) {
  try {
    read_json_file(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonFile, ProblemsAreNamedWithThePathAndPollingNeverThrows) {
  const fs::path dir = fs::temp_directory_path() / ("dloco_json_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "ok.json") << R"({"factor": 3, "until_unix": 1e12})";
  std::ofstream(dir / "twice.json") << R"({"factor": 3, "factor": 1})";
  std::ofstream(dir / "torn.json") << R"({"factor": )";
  EXPECT_EQ(read_json_file(dir / "ok.json").at("factor"), 3);
  EXPECT_EQ(refusal(dir / "twice.json"), (dir / "twice.json").string() + ": duplicate key 'factor' in one object");
  EXPECT_EQ(refusal(dir / "absent.json"), (dir / "absent.json").string() + ": cannot open the file");
  EXPECT_EQ(refusal(dir), dir.string() + ": a folder, not a JSON file");
  EXPECT_EQ(refusal(dir / "torn.json").rfind((dir / "torn.json").string() + ": not valid JSON (", 0), 0u);

  std::string why;
  EXPECT_TRUE(try_read_json_file(dir / "ok.json", &why).has_value());
  EXPECT_FALSE(try_read_json_file(dir / "torn.json", &why).has_value());
  EXPECT_NE(why.find("not valid JSON"), std::string::npos) << why;
  EXPECT_FALSE(try_read_json_file(dir / "twice.json").has_value());
  EXPECT_FALSE(try_read_json_file(dir / "absent.json").has_value());
  EXPECT_FALSE(try_read_json_file(dir).has_value());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dloco
