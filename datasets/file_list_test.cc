#include "datasets/file_list.h"

#include <gtest/gtest.h>

#include "datasets/file_resolver.h"
#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

TEST(FileListTest, IntegerLabelsRelativePathsAndHeader) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "img/a.jpg", "aaaa");
  WriteTestFile(tmp.path() / "img/b.jpg", "bb");
  WriteTestFile(tmp.path() / "list.csv", "path,label\nimg/a.jpg,0\n\n# comment\n" +
                                             (tmp.path() / "img/b.jpg").string() + ", 2\r\n");
  Result<SourceScan> scan = ReadFileList(tmp.path() / "list.csv", nullptr);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->classes, (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_EQ(scan->samples.size(), 2u);
  EXPECT_EQ(scan->samples[0].name, "a.jpg");
  EXPECT_EQ(scan->samples[0].size, 4u);
  EXPECT_EQ(scan->samples[1].label, 2);
  EXPECT_EQ(scan->dirs[scan->samples[0].dir],
            (std::filesystem::canonical(tmp.path()) / "img").string());
}

TEST(FileListTest, NameLabelsQuotedPathsAndUnreadable) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "x,y.jpg", "1");
  WriteTestFile(tmp.path() / "z.jpg", "1");
  WriteTestFile(tmp.path() / "list.csv", "\"x,y.jpg\",dog\nz.jpg,cat\nmissing.jpg,cat\n");
  Result<SourceScan> scan = ReadFileList(tmp.path() / "list.csv", nullptr);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->classes, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(scan->samples.size(), 2u);
  EXPECT_EQ(scan->samples[0].name, "x,y.jpg");
  EXPECT_EQ(scan->samples[0].label, 1);
  ASSERT_EQ(scan->unreadable.size(), 1u);
  EXPECT_NE(scan->unreadable[0].find("missing.jpg: No such file"), std::string::npos);
}

TEST(FileListTest, MalformedLineNamesItsNumber) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "list.csv", "a.jpg,1\nb.jpg,2\nno-label-here\n");
  Result<SourceScan> scan = ReadFileList(tmp.path() / "list.csv", nullptr);
  ASSERT_EQ(scan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(scan.status().message().find("list.csv:3: malformed line \"no-label-here\""),
            std::string::npos)
      << scan.status().message();
  WriteTestFile(tmp.path() / "list2.csv", "a.jpg,\n");
  EXPECT_NE(ReadFileList(tmp.path() / "list2.csv", nullptr).status().message().find(":1:"),
            std::string::npos);
  EXPECT_EQ(ReadFileList(tmp.path() / "nope.csv", nullptr).status().code(), StatusCode::kNotFound);
}

TEST(FileListTest, SymlinksAndDotDotResolveToTheSameFile) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "real/a.jpg", "1");
  std::filesystem::create_directory_symlink(tmp.path() / "real", tmp.path() / "link");
  std::filesystem::create_symlink(tmp.path() / "real/a.jpg", tmp.path() / "alias.jpg");
  SourceScan scan;
  std::vector<RawFile> files = {{"real/a.jpg", 0},
                                {"link/a.jpg", 0},
                                {"real/../real/a.jpg", 0},
                                {"alias.jpg", 0},
                                {"link/../real/./a.jpg", 0}};
  ASSERT_TRUE(ResolveFiles(files, tmp.path(), &scan, nullptr, 2).ok());
  ASSERT_EQ(scan.samples.size(), 5u);
  for (const SourceSample& s : scan.samples) {
    EXPECT_EQ(scan.dirs[s.dir], (std::filesystem::canonical(tmp.path()) / "real").string());
    EXPECT_EQ(s.name, "a.jpg");
  }
}

}  // namespace
}  // namespace carpool
