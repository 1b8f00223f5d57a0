// The safetensors writer against an independent Python reader (tests/core/safetensors_reader.py, standard
// library only), the C++ reader's validation, and the atomic file write under it.
#include "core/safetensors.h"
#include "process/safetensors_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/check.h"
#include "process/atomic_file.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using Metadata = std::map<std::string, std::string>;

// A fresh directory per test, removed at the end.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("dloco_core_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Runs the Python reader on `path`; returns its exit status and output (stdout and stderr).
std::pair<int, std::string> run_python_reader(const fs::path& path) {
  const std::string command = "python3 " DLOCO_SOURCE_DIR "/tests/core/safetensors_reader.py '" + path.string() + "' 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

TEST_F(SafetensorsTest, PythonReaderSeesWhatTheWriterWrote) {
  // Sizes 0, 1 and more; every dtype the checkpoints use.
  const std::vector<float> f32{1.5f, -2.25f, 3.0e-8f, 1e30f, -0.0f, 7.0f};
  const std::vector<float> scalar{42.5f};
  const std::vector<float> empty;
  const std::vector<float> bf16_source{1.0f, -3.140625f, 0.0078125f};
  std::vector<uint16_t> bf16(bf16_source.size());
  float_to_bf16(bf16_source, bf16);
  const std::vector<uint16_t> f16{0x3c00, 0xc000, 0x0001};  // 1, −2, 2^-24
  const std::vector<int64_t> i64{-1, 0, int64_t{1} << 40};
  const std::vector<int32_t> i32{-7, 123456};
  const std::vector<uint8_t> u8{0, 255, 17};
  const std::vector<double> f64{0.1, -1e300};
  const std::vector<SafetensorsEntry> entries{
      f32_entry("blocks.0.w", {2, 3}, f32),
      f32_entry("scalar", {}, scalar),
      f32_entry("empty", {0, 4}, empty),
      {"bf16", Dtype::kBF16, {3}, bytes_of(bf16)},
      {"f16", Dtype::kF16, {3, 1}, bytes_of(f16)},
      {"i64", Dtype::kI64, {3}, bytes_of(i64)},
      {"i32", Dtype::kI32, {1, 2}, bytes_of(i32)},
      {"u8", Dtype::kU8, {3}, bytes_of(u8)},
      {"f64", Dtype::kF64, {2}, bytes_of(f64)},
  };
  const Metadata metadata{{"format", "pt"}, {"global_step", "1200"}, {"note", "ünïcode \"q\""}};
  const fs::path path = dir_ / "theta.safetensors";
  write_safetensors(path, entries, metadata);

  const auto [status, output] = run_python_reader(path);
  ASSERT_EQ(status, 0) << output;
  const nlohmann::json got = nlohmann::json::parse(output);
  EXPECT_EQ(got["header_len"].get<int64_t>() % 8, 0);
  EXPECT_EQ(got["metadata"].get<Metadata>(), metadata);
  std::vector<std::string> order;
  for (const auto& e : entries) order.push_back(e.name);
  EXPECT_EQ(got["order"].get<std::vector<std::string>>(), order);  // header lists tensors in offset order

  const auto& t = got["tensors"];
  ASSERT_EQ(t.size(), entries.size());
  auto values = [&](const char* name) { return t[name]["values"]; };
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(values("blocks.0.w")[i].get<float>(), f32[i]) << i;
  EXPECT_TRUE(std::signbit(values("blocks.0.w")[4].get<double>()));
  EXPECT_EQ(t["blocks.0.w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(t["blocks.0.w"]["dtype"], "F32");
  EXPECT_EQ(t["scalar"]["shape"], nlohmann::json::array());
  EXPECT_EQ(values("scalar")[0].get<float>(), 42.5f);
  EXPECT_EQ(t["empty"]["shape"], nlohmann::json({0, 4}));
  EXPECT_TRUE(values("empty").empty());
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(values("bf16")[i].get<float>(), bf16_to_float(bf16[i]));
  EXPECT_EQ(values("bf16")[1].get<float>(), -3.140625f);  // representable in bf16, so exact
  EXPECT_EQ(values("f16"), nlohmann::json({1.0, -2.0, std::ldexp(1.0, -24)}));
  EXPECT_EQ(values("i64").get<std::vector<int64_t>>(), i64);
  EXPECT_EQ(values("i32").get<std::vector<int32_t>>(), i32);
  EXPECT_EQ(values("u8").get<std::vector<int>>(), (std::vector<int>{0, 255, 17}));
  EXPECT_EQ(values("f64").get<std::vector<double>>(), f64);
  EXPECT_EQ(t["i64"]["dtype"], "I64");
  EXPECT_EQ(t["bf16"]["dtype"], "BF16");

  // The C++ reader agrees with itself.
  const SafetensorsFile back = read_safetensors(path);
  EXPECT_EQ(back.metadata, metadata);
  ASSERT_EQ(back.tensors.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(back.tensors[i].name, entries[i].name);
    EXPECT_EQ(back.tensors[i].dtype, entries[i].dtype);
    EXPECT_EQ(back.tensors[i].shape, entries[i].shape);
    EXPECT_TRUE(std::equal(back.tensors[i].data.begin(), back.tensors[i].data.end(), entries[i].data.begin(),
                           entries[i].data.end()));
  }
  EXPECT_EQ(back.at("blocks.0.w").to_floats(), f32);
  EXPECT_EQ(back.at("bf16").to_floats()[1], -3.140625f);
  EXPECT_EQ(back.at("f16").to_floats(), (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(back.at("scalar").numel(), 1);
  EXPECT_EQ(back.at("empty").numel(), 0);
  EXPECT_THROW(back.at("i64").to_floats(), InputError);
  EXPECT_THROW(back.at("missing"), InputError);
  EXPECT_EQ(back.find("missing"), nullptr);
}

TEST_F(SafetensorsTest, NoTensorsAndNoMetadata) {
  const fs::path path = dir_ / "empty.safetensors";
  write_safetensors(path, {});
  const auto [status, output] = run_python_reader(path);
  ASSERT_EQ(status, 0) << output;
  EXPECT_TRUE(nlohmann::json::parse(output)["tensors"].empty());
  const SafetensorsFile back = read_safetensors(path);
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_TRUE(back.metadata.empty());
}

TEST_F(SafetensorsTest, LargeTensorRoundTripsThroughPython) {
  std::vector<float> big(10000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::sin(static_cast<float>(i)) * 1e3f;
  const fs::path path = dir_ / "big.safetensors";
  const std::vector<SafetensorsEntry> entries{f32_entry("tok_emb.weight", {100, 100}, big)};
  write_safetensors(path, entries);
  const auto [status, output] = run_python_reader(path);
  ASSERT_EQ(status, 0) << output;
  const auto values = nlohmann::json::parse(output)["tensors"]["tok_emb.weight"]["values"].get<std::vector<float>>();
  EXPECT_EQ(values, big);
}

TEST_F(SafetensorsTest, EveryTruncationIsRefused) {
  const std::vector<float> w{1, 2, 3, 4, 5, 6};
  const std::vector<SafetensorsEntry> entries{f32_entry("a", {2, 3}, w), f32_entry("b", {3}, w)};
  // b's view is only 3 values of w
  const std::vector<SafetensorsEntry> fixed{entries[0], f32_entry("b", {3}, std::span<const float>(w).first(3))};
  const std::vector<std::byte> image = encode_safetensors(fixed, {{"k", "v"}});
  EXPECT_NO_THROW(decode_safetensors(image));
  for (size_t n = 0; n < image.size(); ++n) {
    EXPECT_THROW(decode_safetensors(std::span<const std::byte>(image).first(n), "cut.safetensors"), InputError)
        << "prefix of " << n << " bytes";
  }
  // Through the file API, the message names the file and the problem.
  const fs::path path = dir_ / "cut.safetensors";
  write_bytes(path, std::span<const std::byte>(image).first(image.size() - 5));
  try {
    read_safetensors(path);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path.string()), std::string::npos) << what;
    EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  }
  // The Python reader refuses it too (a sanity check of the reference itself).
  EXPECT_NE(run_python_reader(path).first, 0);
}

// Builds an image from a hand-written header and data, padding the header.
std::vector<std::byte> image_with_header(std::string header, size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::byte> image(8 + header.size() + data_bytes, std::byte{0});
  const uint64_t n = header.size();
  std::memcpy(image.data(), &n, 8);
  std::memcpy(image.data() + 8, header.data(), header.size());
  return image;
}

TEST_F(SafetensorsTest, CorruptHeadersAreRefusedWithTheProblemNamed) {
  struct Row {
    const char* header;
    size_t data_bytes;
    const char* problem;
  } rows[] = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, ""},  // valid control row
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}, )", 8, "not valid JSON"},
      {R"([1,2])", 0, "not a JSON object"},
      {R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype 'Q7'"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "need 12"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8, "out of range"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "out of range"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "expected 0"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       8, "contiguous"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "trailing"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "shape entry"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", 8, "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8, "unknown field 'extra'"},
      {R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, "not a string"},
      {R"({"a":3})", 0, "not an object"},
      // A tensor named twice: nlohmann alone keeps the last and the file would silently mean something else.
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       8, "duplicate key 'a'"},
      {R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, "duplicate key 'dtype'"},
  };
  for (const Row& r : rows) {
    const std::vector<std::byte> image = image_with_header(r.header, r.data_bytes);
    if (std::string(r.problem).empty()) {
      EXPECT_NO_THROW(decode_safetensors(image, "x.safetensors")) << r.header;
      continue;
    }
    try {
      decode_safetensors(image, "x.safetensors");
      ADD_FAILURE() << "accepted: " << r.header;
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("x.safetensors"), std::string::npos) << what;
      EXPECT_NE(what.find(r.problem), std::string::npos) << "'" << what << "' lacks '" << r.problem << "'";
    }
  }
  // A header length beyond the file or beyond 100 MB.
  std::vector<std::byte> huge(16, std::byte{0});
  const uint64_t n = uint64_t{1} << 40;
  std::memcpy(huge.data(), &n, 8);
  EXPECT_THROW(decode_safetensors(huge), InputError);
  EXPECT_THROW(read_safetensors(dir_ / "missing.safetensors"), InputError);
}

TEST_F(SafetensorsTest, WriterRefusesBadEntries) {
  const std::vector<float> w{1, 2, 3};
  EXPECT_THROW(encode_safetensors(std::vector<SafetensorsEntry>{f32_entry("a", {2}, w)}), InputError);
  EXPECT_THROW(encode_safetensors(std::vector<SafetensorsEntry>{f32_entry("a", {3}, w), f32_entry("a", {3}, w)}),
               InputError);
  EXPECT_THROW(encode_safetensors(std::vector<SafetensorsEntry>{f32_entry("__metadata__", {3}, w)}), InputError);
  EXPECT_THROW(encode_safetensors(std::vector<SafetensorsEntry>{f32_entry("", {3}, w)}), InputError);
  EXPECT_THROW(encode_safetensors(std::vector<SafetensorsEntry>{f32_entry("a", {-3}, w)}), InputError);
  EXPECT_EQ(parse_dtype("BF16"), Dtype::kBF16);
  EXPECT_THROW(parse_dtype("bf16"), InputError);
  EXPECT_EQ(dtype_size(Dtype::kI64), 8u);
  EXPECT_STREQ(dtype_name(Dtype::kU8), "U8");
}

TEST_F(SafetensorsTest, AtomicWriteReplacesAndLeavesNoTemporaryFile) {
  const fs::path path = dir_ / "manifest.json";
  write_file_atomically(path, std::string_view("{\"v\": 1}"));
  write_file_atomically(path, std::string_view("{\"v\": 2}"));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"v\": 2}");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);  // no *.tmp.* left behind
  write_file_atomically(dir_ / "empty", std::span<const std::byte>());
  EXPECT_EQ(fs::file_size(dir_ / "empty"), 0u);
}

TEST_F(SafetensorsTest, AtomicWriteFailureNamesThePathAndKeepsTheOldFile) {
  const fs::path missing = dir_ / "no_such_dir" / "theta.safetensors";
  try {
    write_file_atomically(missing, std::string_view("x"));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(missing.string()), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  // Renaming onto a directory fails after the temp file was written: the temp must be gone, the target intact.
  const fs::path target = dir_ / "occupied";
  fs::create_directories(target / "inside");
  EXPECT_THROW(write_file_atomically(target, std::string_view("data")), InputError);
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) files += entry.is_regular_file();
  EXPECT_EQ(files, 0);
}

}  // namespace
}  // namespace dloco
