// `carpool dataset` run as a real process on temporary state dirs: the must-show results of
// issue 2, every error case, and crash safety under kill -9.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "datasets/catalog.h"
#include "datasets/sqlite_db.h"
#include "datasets/tar_shards.h"
#include "datasets/temp_dir_for_test.h"
#include "tests/e2e_util.h"

namespace carpool {
namespace {

namespace fs = std::filesystem;

const fs::path kFmnist = "/usr/share/datasets/fashion-mnist";

using e2e::CarpoolBin;
using e2e::Slurp;

struct CliRun {
  int code;
  std::string out, err;
};

class DatasetCliTest : public ::testing::Test {
 protected:
  fs::path state() const { return tmp_.path() / "state"; }

  // Runs `carpool dataset ARGS --state-dir <tmp>/state` (no state dir for gen); stdin is /dev/null,
  // so stderr is no tty.
  CliRun Carpool(std::vector<std::string> args) {
    if (args[0] != "gen") {
      args.push_back("--state-dir");
      args.push_back(state().string());
    }
    args.insert(args.begin(), {CarpoolBin(), "dataset"});
    pid_t pid = Spawn(args);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
            Slurp(tmp_.path() / "out"), Slurp(tmp_.path() / "err")};
  }

  pid_t Spawn(const std::vector<std::string>& args) {
    return e2e::SpawnProcess(args, tmp_.path() / "out", tmp_.path() / "err");
  }

  // One error: non-zero exit, exactly one line on stderr, containing `needle`.
  void ExpectOneLineError(const CliRun& r, const std::string& needle) {
    EXPECT_NE(r.code, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }

  std::unique_ptr<Catalog> OpenCatalog() { return Catalog::Open(state()).value(); }

  TempDirForTest tmp_;
};

TEST_F(DatasetCliTest, FashionMnistMustShow) {
  if (!fs::exists(kFmnist / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  }
  CliRun add = Carpool({"add", "fmnist", "--idx", (kFmnist / "train-images-idx3-ubyte.gz").string(),
                        (kFmnist / "train-labels-idx1-ubyte.gz").string()});
  ASSERT_EQ(add.code, 0) << add.err;
  EXPECT_NE(add.out.find("60000 samples (60000 new), 10 classes, prepare raw,channels=1"),
            std::string::npos)
      << add.out;
  EXPECT_EQ(add.err, "");  // no progress bar without a terminal
  CliRun tops = Carpool({"add", "fmnist-tops", "--from", "fmnist", "--classes", "0,2,4,6"});
  ASSERT_EQ(tops.code, 0) << tops.err;
  EXPECT_NE(tops.out.find("24000 samples"), std::string::npos) << tops.out;
  CliRun ov = Carpool({"overlap", "fmnist", "fmnist-tops"});
  ASSERT_EQ(ov.code, 0) << ov.err;
  EXPECT_NE(ov.out.find("|A∩B|                    24000"), std::string::npos) << ov.out;
  EXPECT_NE(ov.out.find("|A∪B|                    60000"), std::string::npos) << ov.out;
  EXPECT_NE(ov.out.find("|A∩B|/max(|A|,|B|)      0.4000"), std::string::npos) << ov.out;
  // Registering the same IDX file again yields the same ids.
  CliRun again =
      Carpool({"add", "fmnist2", "--idx", (kFmnist / "train-images-idx3-ubyte.gz").string(),
               (kFmnist / "train-labels-idx1-ubyte.gz").string()});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("(0 new)"), std::string::npos);
  CliRun show = Carpool({"show", "fmnist-tops"});
  ASSERT_EQ(show.code, 0);
  EXPECT_NE(show.out.find("samples:  24000"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("fmnist2"), std::string::npos) << show.out;
}

TEST_F(DatasetCliTest, SymlinkedFolderGivesIdenticalIds) {
  fs::path real = tmp_.path() / "imgs";
  CliRun gen = Carpool({"gen", real.string(), "--count", "24", "--classes", "3", "--seed", "5"});
  ASSERT_EQ(gen.code, 0) << gen.err;
  fs::create_directory_symlink(real, tmp_.path() / "link");
  ASSERT_EQ(Carpool({"add", "real", "--dir", real.string()}).code, 0);
  CliRun viaLink = Carpool({"add", "linked", "--dir", (tmp_.path() / "link").string()});
  ASSERT_EQ(viaLink.code, 0) << viaLink.err;
  CliRun viaDots = Carpool({"add", "dots", "--dir", (tmp_.path() / "link/../imgs/.").string()});
  ASSERT_EQ(viaDots.code, 0) << viaDots.err;
  auto catalog = OpenCatalog();
  DatasetInfo a = catalog->GetDataset("real").value(), b = catalog->GetDataset("linked").value();
  EXPECT_EQ(a.ids.cardinality(), 24u);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.ids, catalog->GetDataset("dots")->ids);
  EXPECT_EQ(a.classes, (std::vector<std::string>{"class_000", "class_001", "class_002"}));
  EXPECT_EQ(a.prepare_spec, "resize=256,crop=256");
  std::vector<SampleRecord> records = catalog->GetSamples(a.ids).value();
  ASSERT_EQ(records.size(), 24u);
  for (const SampleRecord& r : records) {
    EXPECT_EQ(r.path.find("link"), std::string::npos);
    EXPECT_GT(r.size, 30000u);  // real JPEGs, not stubs
  }
}

TEST_F(DatasetCliTest, DerivedSetsRmAndLs) {
  fs::path dir = tmp_.path() / "imgs";
  ASSERT_EQ(
      Carpool({"gen", dir.string(), "--count", "40", "--classes", "4", "--size", "64x48"}).code, 0);
  ASSERT_EQ(Carpool({"add", "all", "--dir", dir.string(), "--prepare", "crop=32,resize=48"}).code,
            0);
  ASSERT_EQ(Carpool({"add", "half", "--from", "all", "--fraction", "0.5", "--seed", "3"}).code, 0);
  ASSERT_EQ(Carpool({"add", "c0", "--from", "all", "--classes", "class_000"}).code, 0);
  ASSERT_EQ(Carpool({"add", "u", "--union", "half", "c0"}).code, 0);
  ASSERT_EQ(Carpool({"add", "i", "--intersect", "half", "c0"}).code, 0);
  ASSERT_EQ(Carpool({"add", "m", "--minus", "all", "c0"}).code, 0);
  auto catalog = OpenCatalog();
  DatasetInfo all = catalog->GetDataset("all").value();
  EXPECT_EQ(all.prepare_spec, "resize=48,crop=32");
  Roaring half = catalog->GetDataset("half")->ids, c0 = catalog->GetDataset("c0")->ids;
  EXPECT_EQ(half.cardinality(), 20u);
  EXPECT_EQ(c0.cardinality(), 10u);
  EXPECT_EQ(catalog->GetDataset("u")->ids, half | c0);
  EXPECT_EQ(catalog->GetDataset("i")->ids, half & c0);
  EXPECT_EQ(catalog->GetDataset("m")->ids.cardinality(), 30u);
  std::string lo = std::to_string(all.ids.minimum());
  ASSERT_EQ(Carpool({"add", "first5", "--from", "all", "--ids",
                     lo + ":" + std::to_string(all.ids.minimum() + 5)})
                .code,
            0);
  EXPECT_EQ(catalog->GetDataset("first5")->ids.cardinality(), 5u);
  CliRun rm = Carpool({"rm", "half"});
  EXPECT_EQ(rm.code, 0);
  CliRun ls = Carpool({"ls"});
  EXPECT_EQ(ls.code, 0);
  EXPECT_EQ(ls.out.find("\nhalf "), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("\nfirst5 "), std::string::npos) << ls.out;
  ExpectOneLineError(Carpool({"rm", "half"}), "dataset \"half\" not found");
}

TEST_F(DatasetCliTest, EveryErrorIsOneClearLine) {
  fs::path missing = tmp_.path() / "no-such-dir";
  ExpectOneLineError(Carpool({"add", "x", "--dir", missing.string()}),
                     "image folder \"" + missing.string() + "\"");
  fs::create_directories(tmp_.path() / "empty/cls");
  ExpectOneLineError(Carpool({"add", "x", "--dir", (tmp_.path() / "empty").string()}),
                     "would be empty");
  WriteTestFile(tmp_.path() / "one/a.jpg", "jpeg");
  ASSERT_EQ(Carpool({"add", "one", "--dir", (tmp_.path() / "one").string()}).code, 0);
  ExpectOneLineError(Carpool({"add", "one", "--dir", (tmp_.path() / "one").string()}),
                     "dataset \"one\" already exists; choose another name, pass --replace");
  EXPECT_EQ(Carpool({"add", "one", "--dir", (tmp_.path() / "one").string(), "--replace"}).code, 0);
  ExpectOneLineError(Carpool({"add", "x", "--from", "nope", "--classes", "0"}),
                     "dataset \"nope\" not found (known: one)");
  ExpectOneLineError(Carpool({"add", "x", "--union", "one", "nope"}), "\"nope\" not found");
  ExpectOneLineError(Carpool({"add", "x", "--from", "one", "--fraction", "0.1"}), "would be empty");
  WriteTestFile(tmp_.path() / "bad.csv", "a.jpg,0\nb.jpg 1\n");
  ExpectOneLineError(Carpool({"add", "x", "--list", (tmp_.path() / "bad.csv").string()}),
                     "bad.csv:2: malformed line \"b.jpg 1\"");
  WriteTestFile(tmp_.path() / "bad.idx", std::string("\x12\x34\x56\x78", 4));
  ExpectOneLineError(
      Carpool({"add", "x", "--idx", (tmp_.path() / "bad.idx").string(),
               (tmp_.path() / "bad.idx").string()}),
      "bad IDX header in \"" + (tmp_.path() / "bad.idx").string() + "\": magic 0x12345678");
  ExpectOneLineError(
      Carpool({"add", "x", "--dir", (tmp_.path() / "one").string(), "--prepare", "resize=big"}),
      "resize=\"big\"");
  EXPECT_EQ(Carpool({"add", "x"}).code, 2);
  EXPECT_EQ(Carpool({"add", "x", "--dir", "a", "--list", "b"}).code, 2);
  EXPECT_EQ(OpenCatalog()->ListDatasets().value(), std::vector<std::string>{"one"});
}

// issue 21: a spec that does not fit the source fails at registration, in one line naming the
// spec and the fix; it used to register, and the job failed on "IDX file ... has a bad header".
TEST_F(DatasetCliTest, RawPrepareOnTarShardsIsRejectedAtRegistration) {
  TarShardWriter writer;
  const std::vector<uint8_t> jpeg(100, 0xff), label = {'3'};
  ASSERT_TRUE(writer.Add("k0.jpg", jpeg).ok());
  ASSERT_TRUE(writer.Add("k0.cls", label).ok());
  const std::vector<uint8_t> shard = writer.Finish();
  const fs::path path = tmp_.path() / "shard-000000.tar";
  WriteTestFile(path, std::string(shard.begin(), shard.end()));
  const std::string expected = fmt::format(
      "prepare spec \"raw,channels=1\" keeps IDX records as they are, but dataset \"t\" holds 1 "
      "image (e.g. tar shard \"{}\" member \"k0.jpg\"); use an image spec, e.g. --prepare "
      "resize=256,crop=256",
      fs::canonical(path).string());
  ExpectOneLineError(Carpool({"add", "t", "--tar", path.string(), "--prepare", "raw,channels=1"}),
                     expected);
  EXPECT_FALSE(OpenCatalog()->GetDataset("t").ok());
  CliRun fits = Carpool({"add", "t", "--tar", path.string()});
  ASSERT_EQ(fits.code, 0) << fits.err;
  EXPECT_NE(fits.out.find("prepare resize=256,crop=256"), std::string::npos) << fits.out;
}

// issue 21: 2^24 records of 2^20 x 2^20 bytes in a 16-byte file, with 2^24 valid labels. The data
// size 2^64 wrapped to 0, and the file registered as 16,777,216 samples of 1 TiB each.
TEST_F(DatasetCliTest, IdxHeaderWhoseDataSizeWrapsIsRejected) {
  const fs::path images = tmp_.path() / "huge-images", labels = tmp_.path() / "huge-labels";
  WriteTestFile(images, IdxHeaderForTest({1u << 24, 1u << 20, 1u << 20}));
  WriteTestFile(labels, IdxHeaderForTest({1u << 24}) + std::string(1u << 24, '\0'));
  ExpectOneLineError(
      Carpool({"add", "huge", "--idx", images.string(), labels.string()}),
      "bad IDX header in \"" + fs::canonical(images).string() +
          "\": dims [16777216,1048576,1048576] make a record of more than 268435456 bytes, the "
          "limit");
  EXPECT_FALSE(OpenCatalog()->GetDataset("huge").ok());
}

TEST_F(DatasetCliTest, UnreadableFilesAreListedAndSkippedUnlessStrict) {
  WriteTestFile(tmp_.path() / "d/ok1.jpg", "1");
  WriteTestFile(tmp_.path() / "d/ok2.jpg", "2");
  WriteTestFile(tmp_.path() / "l.csv", "d/ok1.jpg,0\nd/gone.jpg,1\nd/ok2.jpg,1\nd,0\n");
  CliRun strict = Carpool({"add", "s", "--list", (tmp_.path() / "l.csv").string(), "--strict"});
  EXPECT_NE(strict.code, 0);
  EXPECT_NE(strict.err.find("gone.jpg: No such file"), std::string::npos) << strict.err;
  EXPECT_NE(strict.err.find("2 unreadable files"), std::string::npos) << strict.err;
  EXPECT_FALSE(OpenCatalog()->GetDataset("s").ok());
  CliRun lax = Carpool({"add", "s", "--list", (tmp_.path() / "l.csv").string()});
  ASSERT_EQ(lax.code, 0) << lax.err;
  EXPECT_NE(lax.err.find("gone.jpg: No such file"), std::string::npos) << lax.err;
  EXPECT_NE(lax.err.find("d: not a regular file"), std::string::npos) << lax.err;
  EXPECT_NE(lax.out.find("2 samples"), std::string::npos) << lax.out;
}

// kill -9 during the write transaction of a large registration (300,000 IDX records, so that no
// time goes into creating files) leaves the catalog as it was.
TEST_F(DatasetCliTest, KillDuringRegistrationLeavesCatalogUnchanged) {
  constexpr uint32_t kRecords = 300000;
  auto idx = [](int ndims, std::string body) {
    std::string header = {0, 0, 8, static_cast<char>(ndims)};
    for (int d = 0; d < ndims; ++d) {
      uint32_t dim = d == 0 ? kRecords : 1;
      for (int sh = 24; sh >= 0; sh -= 8) header.push_back(static_cast<char>((dim >> sh) & 0xff));
    }
    return header + body;
  };
  std::string labels(kRecords, '\0');
  for (uint32_t i = 0; i < kRecords; ++i) labels[i] = static_cast<char>(i % 10);
  WriteTestFile(tmp_.path() / "big-images", idx(3, std::string(kRecords, 'x')));
  WriteTestFile(tmp_.path() / "big-labels", idx(1, labels));
  WriteTestFile(tmp_.path() / "small/a.jpg", "a");
  ASSERT_EQ(Carpool({"add", "small", "--dir", (tmp_.path() / "small").string()}).code, 0);
  const Roaring small_ids = OpenCatalog()->GetDataset("small")->ids;
  const fs::path wal = state() / "catalog.db-wal";
  const uintmax_t wal_before = fs::exists(wal) ? fs::file_size(wal) : 0;

  const std::vector<std::string> add_big = {"add", "big", "--idx",
                                            (tmp_.path() / "big-images").string(),
                                            (tmp_.path() / "big-labels").string()};
  std::vector<std::string> argv = {CarpoolBin(), "dataset"};
  argv.insert(argv.end(), add_big.begin(), add_big.end());
  argv.insert(argv.end(), {"--state-dir", state().string()});
  pid_t pid = Spawn(argv);
  // The transaction is under way once it spills pages into the WAL.
  bool killed_mid_write = false;
  for (int i = 0; i < 10000; ++i) {
    std::error_code ec;
    uintmax_t size = fs::file_size(wal, ec);
    if (!ec && size > wal_before + (1 << 20)) {
      killed_mid_write = ::waitpid(pid, nullptr, WNOHANG) == 0 && ::kill(pid, SIGKILL) == 0;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(killed_mid_write) << "registration finished before it could be killed";
  ASSERT_TRUE(WIFSIGNALED(status));

  auto catalog = OpenCatalog();
  EXPECT_EQ(catalog->ListDatasets().value(), std::vector<std::string>{"small"});
  EXPECT_EQ(catalog->SampleCount().value(), 1u);
  EXPECT_EQ(catalog->GetDataset("small")->ids, small_ids);
  auto db = SqliteDb::Open(state() / "catalog.db").value();
  auto check = db->Prepare("PRAGMA integrity_check").value();
  ASSERT_TRUE(check.Step().value());
  EXPECT_EQ(check.ColumnText(0), "ok");
  // And the same registration completes afterwards.
  CliRun done = Carpool(add_big);
  ASSERT_EQ(done.code, 0) << done.err;
  EXPECT_NE(done.out.find("300000 samples (300000 new)"), std::string::npos) << done.out;
}

}  // namespace
}  // namespace carpool
