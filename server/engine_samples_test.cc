// SampleTable: what Release drops, and that a dropped sample's source says so (a preparation still
// queued for it skips its read, which would load its IDX file again after Forget).
#include "server/engine_samples.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace carpool {
namespace {

DatasetSamples IdxDataset(const std::string& name, std::vector<uint32_t> ids) {
  DatasetSamples d;
  d.info.name = name;
  d.block = std::make_shared<SampleBlock>();
  d.block->spec.raw = true;
  d.block->records.files = {"/data/images.idx"};
  d.block->raw_shapes = {PreparedShape{28, 28, 1}};
  for (uint32_t id : ids) {
    SampleRecords::Row row;
    row.id = id;
    row.kind = SampleRecords::Kind::kIdx;
    row.position = id;
    row.label = static_cast<int32_t>(id % 10);
    d.block->records.rows.push_back(row);
    d.info.ids.add(id);
  }
  d.block->released.reset(new std::atomic<bool>[ids.size()]());
  return d;
}

TEST(SampleTableTest, ReleaseMarksTheSourcesItDropsAndFreesTheIdxFileWithItsLastSample) {
  SampleTable table;
  const DatasetSamples a = IdxDataset("a", {1, 2});
  const DatasetSamples b = IdxDataset("b", {2});
  ASSERT_TRUE(table.Add(a).ok());
  ASSERT_TRUE(table.Add(b).ok());
  EXPECT_TRUE(table.ReadsIdx("/data/images.idx"));

  // Sample 2 is still b's: only 1 goes, and the file stays.
  // Sample 2 came first through a: its source is built from a's block, and says when it goes.
  std::shared_ptr<const SampleSource> two = table.Find(2);
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->record.path, "/data/images.idx");
  EXPECT_EQ(two->record.source, "idx");
  EXPECT_EQ(two->record.record_index, 2);
  EXPECT_EQ(two->record.label, 2);
  EXPECT_EQ(table.Label(2), 2);
  EXPECT_EQ(table.Label(7), -1);
  EXPECT_EQ(two->raw_shape.height, 28);
  EXPECT_EQ(two->block, a.block);
  EXPECT_FALSE(two->released());

  ReleasedSamples first = table.Release(a.info.ids);
  EXPECT_EQ(first.samples, std::vector<uint32_t>{1});
  EXPECT_TRUE(first.idx_paths.empty());
  EXPECT_TRUE(a.block->released[0].load());
  EXPECT_FALSE(a.block->released[1].load());  // the table keeps a's source of sample 2
  EXPECT_TRUE(table.ReadsIdx("/data/images.idx"));

  ReleasedSamples last = table.Release(b.info.ids);
  EXPECT_EQ(last.samples, std::vector<uint32_t>{2});
  EXPECT_EQ(last.idx_paths, std::vector<std::string>{"/data/images.idx"});
  EXPECT_TRUE(a.block->released[1].load());
  EXPECT_FALSE(table.ReadsIdx("/data/images.idx"));
  EXPECT_EQ(table.Find(2), nullptr);
  EXPECT_TRUE(two->released());
}

TEST(SampleTableTest, ASampleKnownUnderAnotherPrepareSpecIsRefusedWithBothSpecsNamed) {
  SampleTable table;
  ASSERT_TRUE(table.Add(IdxDataset("a", {1, 2})).ok());
  DatasetSamples b = IdxDataset("b", {2, 3});
  b.block->spec = PrepareSpec{.raw = false, .resize = 32, .crop = 32};
  Status s = table.Add(b);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("sample 2"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("resize=32,crop=32"), std::string::npos) << s.ToString();
  EXPECT_FALSE(table.Contains(3));  // nothing of b went in
}

}  // namespace
}  // namespace carpool
