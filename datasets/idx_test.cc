#include "datasets/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

// An IDX ubyte file with the given dims; byte i of the data is i % 251.
std::string IdxBytes(std::vector<uint32_t> dims) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  uint64_t n = 1;
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xff));
    n *= d;
  }
  for (uint64_t i = 0; i < n; ++i) out.push_back(static_cast<char>(i % 251));
  return out;
}

void WriteGz(const std::filesystem::path& file, const std::string& content) {
  gzFile gz = gzopen(file.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, content.data(), content.size()), static_cast<int>(content.size()));
  gzclose(gz);
}

TEST(IdxTest, ReadsPlainAndGzipPairs) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "img", IdxBytes({12, 2, 3}));
  WriteGz(tmp.path() / "lab.gz", IdxBytes({12}));
  Result<SourceScan> scan = ReadIdxPair(tmp.path() / "img", tmp.path() / "lab.gz");
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  ASSERT_EQ(scan->samples.size(), 12u);
  EXPECT_EQ(scan->samples[5].record_index, 5);
  EXPECT_EQ(scan->samples[5].size, 6u);
  EXPECT_EQ(scan->samples[5].label, 5);
  EXPECT_EQ(scan->classes.size(), 12u);
  EXPECT_EQ(scan->default_prepare, "raw,channels=1");
  EXPECT_NE(scan->description.find("12 records of 2x3 uint8"), std::string::npos);
}

TEST(IdxTest, BadHeadersAreCorruption) {
  TempDirForTest tmp;
  std::string good = IdxBytes({4, 2});
  std::string bad_magic = good;
  bad_magic[2] = 0x0d;  // float data
  std::string truncated = good.substr(0, good.size() - 1);
  WriteTestFile(tmp.path() / "lab", IdxBytes({4}));
  for (const std::string& bytes : {bad_magic, truncated, std::string("\0\0", 2)}) {
    WriteTestFile(tmp.path() / "img", bytes);
    Result<SourceScan> scan = ReadIdxPair(tmp.path() / "img", tmp.path() / "lab");
    ASSERT_EQ(scan.status().code(), StatusCode::kCorruption);
    EXPECT_NE(scan.status().message().find("bad IDX header"), std::string::npos);
  }
  WriteTestFile(tmp.path() / "img", IdxBytes({5, 2}));
  EXPECT_EQ(ReadIdxPair(tmp.path() / "img", tmp.path() / "lab").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadIdxPair(tmp.path() / "nope", tmp.path() / "lab").status().code(),
            StatusCode::kNotFound);
}

TEST(IdxTest, FashionMnistHas60000In10Classes) {
  const std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  }
  Result<SourceScan> scan =
      ReadIdxPair(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz");
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->samples.size(), 60000u);
  EXPECT_EQ(scan->classes.size(), 10u);
  std::vector<int> per_class(10);
  for (const SourceSample& s : scan->samples) ++per_class.at(s.label);
  for (int c : per_class) EXPECT_EQ(c, 6000);
}

}  // namespace
}  // namespace carpool
