// Test support: a temporary directory removed with its contents at scope exit, and file writers.
#ifndef CARPOOL_DATASETS_TEMP_DIR_FOR_TEST_H_
#define CARPOOL_DATASETS_TEMP_DIR_FOR_TEST_H_

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace carpool {

class TempDirForTest {
 public:
  TempDirForTest() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "carpool-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDirForTest() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void WriteTestFile(const std::filesystem::path& file, std::string_view content) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary).write(content.data(), content.size());
}

}  // namespace carpool

#endif  // CARPOOL_DATASETS_TEMP_DIR_FOR_TEST_H_
