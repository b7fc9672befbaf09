#include "datasets/sample_reader.h"

#include <gtest/gtest.h>

#include <thread>

#include "datasets/idx.h"
#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

TEST(SampleReaderTest, ReadsFilesAndIdxRecordsFromManyThreads) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "a.bin", std::string("hello\0world", 11));
  std::string idx = {0, 0, 8, 2, 0, 0, 0, 3, 0, 0, 0, 2, 'a', 'b', 'c', 'd', 'e', 'f'};
  WriteTestFile(tmp.path() / "r.idx", idx);
  SampleReader reader;
  Result<std::vector<uint8_t>> f =
      reader.Read({1, "file", (tmp.path() / "a.bin").string(), -1, 11, 0});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size(), 11u);
  EXPECT_EQ((*f)[6], 'w');
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        int rec = (i + t) % 3;
        auto r = reader.Read({2, "idx", (tmp.path() / "r.idx").string(), rec, 2, 0});
        if (r.ok() && r->size() == 2 && (*r)[0] == 'a' + 2 * rec) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 1200);
  EXPECT_EQ(reader.Read({3, "idx", (tmp.path() / "r.idx").string(), 3, 2, 0}).status().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ReadSample({4, "file", (tmp.path() / "gone").string(), -1, 0, 0}).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace carpool
