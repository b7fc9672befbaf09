// Test support: a temporary directory removed with its contents at scope exit, and file writers.
#ifndef CARPOOL_DATASETS_TEMP_DIR_FOR_TEST_H_
#define CARPOOL_DATASETS_TEMP_DIR_FOR_TEST_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

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

// The header of an IDX ubyte file with these dims, without the data.
inline std::string IdxHeaderForTest(const std::vector<uint32_t>& dims) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xff));
  }
  return out;
}

}  // namespace carpool

#endif  // CARPOOL_DATASETS_TEMP_DIR_FOR_TEST_H_
