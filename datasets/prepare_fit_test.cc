#include "datasets/prepare_fit.h"

#include <gtest/gtest.h>

#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

TEST(PrepareFitTest, KindsOfAScanCountsIdxRecordsPerFileAndImages) {
  SourceScan scan;
  scan.dirs = {"/m", "/s.tar", "/imgs"};
  scan.samples = {{0, "a.idx", 0, 1, 0},       {0, "a.idx", 1, 1, 0},  {0, "b.idx", 0, 1, 0},
                  {1, "k.png", -1, 1, 0, 512}, {2, "x.jpg", -1, 1, 0}, {0, "a.idx", 2, 1, 0}};
  SampleKinds k = KindsOf(scan);
  EXPECT_EQ(k.idx_records, 4u);
  EXPECT_EQ(k.idx_files, (std::vector<std::string>{"/m/a.idx", "/m/b.idx"}));
  EXPECT_EQ(k.images, 2u);
  EXPECT_EQ(k.first_image, "tar shard \"/s.tar\" member \"k.png\"");
}

TEST(PrepareFitTest, KindsOfRecordsMatchesKindsOfTheirScan) {
  SampleRecords r;
  r.files = {"/m/a.idx", "/imgs"};
  r.names = "x.jpg";
  r.rows = {{1, 0, 0, 0, SampleRecords::Kind::kIdx, 0, 0, 1},
            {2, 1, 0, 5, SampleRecords::Kind::kFile, 0, -1, 1},
            {3, 0, 0, 0, SampleRecords::Kind::kIdx, 0, 1, 1}};
  SampleKinds k = KindsOf(r);
  EXPECT_EQ(k.idx_records, 2u);
  EXPECT_EQ(k.idx_files, std::vector<std::string>{"/m/a.idx"});
  EXPECT_EQ(k.images, 1u);
  EXPECT_EQ(k.first_image, "\"/imgs/x.jpg\"");
}

TEST(PrepareFitTest, BadSpecOrUnreadableIdxHeaderIsReportedAsSuch) {
  SampleKinds none;
  Status bad = CheckPrepareFits("d", "resize=big", none);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("resize=\"big\""), std::string::npos) << bad.message();
  EXPECT_TRUE(CheckPrepareFits("d", "raw", none).ok());
  TempDirForTest tmp;
  SampleKinds gone;
  gone.idx_records = 1;
  gone.idx_files = {(tmp.path() / "gone.idx").string()};
  EXPECT_EQ(CheckPrepareFits("d", "raw,channels=1", gone).code(), StatusCode::kNotFound);
  WriteTestFile(tmp.path() / "bad.idx", IdxHeaderForTest({1u << 24, 1u << 20, 1u << 20}));
  SampleKinds huge;
  huge.idx_records = 1;
  huge.idx_files = {(tmp.path() / "bad.idx").string()};
  Status s = CheckPrepareFits("d", "raw,channels=1", huge);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("bad IDX header"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace carpool
