#include "datasets/idx.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

// An IDX ubyte file with the given dims; byte i of the data is i % 251.
std::string IdxBytes(std::vector<uint32_t> dims) {
  std::string out = IdxHeaderForTest(dims);
  uint64_t n = 1;
  for (uint32_t d : dims) n *= d;
  for (uint64_t i = 0; i < n; ++i) out.push_back(static_cast<char>(i % 251));
  return out;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
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

// The header of issue 21: 2^24 records of 2^20 x 2^20 bytes. 2^24 * 2^40 wraps to 0, which the
// 16 header bytes matched, so the file registered as 16M samples of 1 TiB each.
TEST(IdxTest, DimsWhoseDataSizeWrapsAreRejected) {
  const std::string header = IdxHeaderForTest({1u << 24, 1u << 20, 1u << 20});
  ASSERT_EQ(header.size(), 16u);
  Result<IdxHeader> h = ParseIdxHeader(Bytes(header), "big.idx");
  ASSERT_EQ(h.status().code(), StatusCode::kCorruption);
  EXPECT_NE(h.status().message().find("bad IDX header in \"big.idx\": dims [16777216,1048576,"
                                      "1048576] make a record of more than 268435456 bytes"),
            std::string::npos)
      << h.status().message();
}

// No records, so no data to check the dims against: the cap alone rejects a 1 GiB record.
TEST(IdxTest, RecordOverTheCapIsRejectedEvenWithoutRecords) {
  const std::string header = IdxHeaderForTest({0, 1u << 15, 1u << 15});
  Result<IdxHeader> h = ParseIdxHeader(Bytes(header), "empty.idx");
  ASSERT_EQ(h.status().code(), StatusCode::kCorruption);
  EXPECT_NE(h.status().message().find("more than 268435456 bytes, the limit"), std::string::npos)
      << h.status().message();
  // At the cap a record is accepted.
  Result<IdxHeader> at_cap = ParseIdxHeader(Bytes(IdxHeaderForTest({0, 1u << 14, 1u << 14})), "f");
  ASSERT_TRUE(at_cap.ok()) << at_cap.status().ToString();
  EXPECT_EQ(at_cap->record_bytes, uint64_t{1} << 28);
}

TEST(IdxTest, ReadIdxHeaderReadsOnlyTheHeaderOfPlainAndGzipFiles) {
  TempDirForTest tmp;
  const std::string full = IdxBytes({7, 4, 5});
  WriteTestFile(tmp.path() / "plain", full);
  WriteGz(tmp.path() / "packed.gz", full);
  // The header alone (data cut off) still reads: the server needs only the record shape.
  WriteTestFile(tmp.path() / "header-only", IdxHeaderForTest({7, 4, 5}));
  for (const char* name : {"plain", "packed.gz", "header-only"}) {
    Result<IdxHeader> h = ReadIdxHeader(tmp.path() / name);
    ASSERT_TRUE(h.ok()) << name << ": " << h.status().ToString();
    EXPECT_EQ(h->dims, (std::vector<uint32_t>{7, 4, 5})) << name;
    EXPECT_EQ(h->record_bytes, 20u);
    EXPECT_EQ(h->data_bytes, 140u);
    EXPECT_EQ(h->header_bytes, 16u);
  }
  WriteTestFile(tmp.path() / "cut", IdxHeaderForTest({7, 4, 5}).substr(0, 10));
  Result<IdxHeader> cut = ReadIdxHeader(tmp.path() / "cut");
  ASSERT_EQ(cut.status().code(), StatusCode::kCorruption);
  EXPECT_NE(cut.status().message().find("3 dims need 16 header bytes, file has 10"),
            std::string::npos)
      << cut.status().message();
  WriteTestFile(tmp.path() / "huge", IdxHeaderForTest({1u << 24, 1u << 20, 1u << 20}));
  EXPECT_EQ(ReadIdxHeader(tmp.path() / "huge").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ReadIdxHeader(tmp.path() / "nope").status().code(), StatusCode::kNotFound);
}

TEST(IdxTest, RawLayoutMustHoldExactlyTheRecordBytes) {
  struct Case {
    std::vector<uint32_t> dims;
    const char* spec;
    int height, width, channels;  // 0: rejected
  };
  for (const Case& c :
       {Case{{9, 28, 28}, "raw,channels=1", 28, 28, 1}, Case{{9, 28, 28}, "raw", 0, 0, 0},
        Case{{9, 12}, "raw", 1, 4, 3}, Case{{9, 10}, "raw", 0, 0, 0},
        Case{{9, 12}, "raw,channels=1", 1, 12, 1}, Case{{9}, "raw,channels=1", 1, 1, 1},
        Case{{9}, "raw", 0, 0, 0}, Case{{9, 4, 5, 3}, "raw,channels=1", 4, 5, 3},
        Case{{9, 2, 2, 2, 2}, "raw,channels=1", 0, 0, 0}}) {
    const std::string header = IdxHeaderForTest(c.dims);
    Result<IdxHeader> h = ParseIdxHeaderPrefix(Bytes(header), "f.idx");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    Result<IdxRecordLayout> l = RawRecordLayout(*h, ParsePrepareSpec(c.spec).value(), "f.idx");
    if (c.height == 0) {
      ASSERT_EQ(l.status().code(), StatusCode::kInvalidArgument) << c.spec << " " << header.size();
      EXPECT_NE(l.status().message().find(fmt::format("prepare spec \"{}\"", c.spec)),
                std::string::npos)
          << l.status().message();
      EXPECT_NE(l.status().message().find("f.idx"), std::string::npos) << l.status().message();
      continue;
    }
    ASSERT_TRUE(l.ok()) << c.spec << ": " << l.status().ToString();
    EXPECT_EQ(l->height, c.height);
    EXPECT_EQ(l->width, c.width);
    EXPECT_EQ(l->channels, c.channels);
  }
  const std::string header = IdxHeaderForTest({9, 28, 28});
  Result<IdxRecordLayout> decoded = RawRecordLayout(
      ParseIdxHeaderPrefix(Bytes(header), "f").value(), ParsePrepareSpec("resize=28").value(), "f");
  EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
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
