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
  for (uint32_t id : ids) {
    auto s = std::make_shared<SampleSource>();
    s->record.id = id;
    s->record.source = "idx";
    s->record.path = "/data/images.idx";
    s->record.record_index = id;
    d.info.ids.add(id);
    d.samples.push_back(std::move(s));
  }
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
  ReleasedSamples first = table.Release(a.info.ids);
  EXPECT_EQ(first.samples, std::vector<uint32_t>{1});
  EXPECT_TRUE(first.idx_paths.empty());
  EXPECT_TRUE(a.samples[0]->released.load());
  EXPECT_FALSE(a.samples[1]->released.load());  // the table keeps a's source of sample 2
  EXPECT_TRUE(table.ReadsIdx("/data/images.idx"));

  ReleasedSamples last = table.Release(b.info.ids);
  EXPECT_EQ(last.samples, std::vector<uint32_t>{2});
  EXPECT_EQ(last.idx_paths, std::vector<std::string>{"/data/images.idx"});
  EXPECT_TRUE(a.samples[1]->released.load());
  EXPECT_FALSE(table.ReadsIdx("/data/images.idx"));
  EXPECT_EQ(table.Find(2), nullptr);
}

}  // namespace
}  // namespace carpool
