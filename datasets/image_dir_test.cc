#include "datasets/image_dir.h"

#include <gtest/gtest.h>

#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

TEST(ImageDirTest, ClassFoldersGiveSortedLabels) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "root/zebra/1.jpg", "1");
  WriteTestFile(tmp.path() / "root/zebra/sub/2.PNG", "22");
  WriteTestFile(tmp.path() / "root/ant/3.jpeg", "333");
  WriteTestFile(tmp.path() / "root/ant/notes.txt", "x");
  WriteTestFile(tmp.path() / "root/ant/.hidden.jpg", "x");
  WriteTestFile(tmp.path() / "root/.git/4.jpg", "x");
  std::filesystem::create_symlink(tmp.path() / "nowhere.jpg", tmp.path() / "root/ant/dead.jpg");
  Result<SourceScan> scan = ScanImageDir(tmp.path() / "root", nullptr);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->classes, (std::vector<std::string>{"ant", "zebra"}));
  ASSERT_EQ(scan->samples.size(), 3u);
  int per_label[2] = {0, 0};
  for (const SourceSample& s : scan->samples) ++per_label[s.label];
  EXPECT_EQ(per_label[0], 1);
  EXPECT_EQ(per_label[1], 2);
  ASSERT_EQ(scan->unreadable.size(), 1u);
  EXPECT_NE(scan->unreadable[0].find("dead.jpg"), std::string::npos);
}

TEST(ImageDirTest, FlatFolderIsUnlabelled) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "a.jpg", "1");
  WriteTestFile(tmp.path() / "b.png", "1");
  Result<SourceScan> scan = ScanImageDir(tmp.path(), nullptr);
  ASSERT_TRUE(scan.ok());
  EXPECT_TRUE(scan->classes.empty());
  ASSERT_EQ(scan->samples.size(), 2u);
  EXPECT_EQ(scan->samples[0].label, -1);
}

TEST(ImageDirTest, MissingDirIsNotFound) {
  TempDirForTest tmp;
  Result<SourceScan> scan = ScanImageDir(tmp.path() / "nope", nullptr);
  ASSERT_EQ(scan.status().code(), StatusCode::kNotFound);
  EXPECT_NE(scan.status().message().find("--dir"), std::string::npos);
  EXPECT_TRUE(HasImageExtension("x.JPG"));
  EXPECT_FALSE(HasImageExtension("x.jpg.txt"));
}

}  // namespace
}  // namespace carpool
