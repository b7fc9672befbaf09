#include "datasets/tar_shards.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "datasets/catalog.h"
#include "datasets/derived.h"
#include "datasets/sample_reader.h"
#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Distinct, position-dependent bytes, so that a read at a wrong offset cannot pass.
std::vector<uint8_t> FakeImage(int key, size_t size) {
  std::vector<uint8_t> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(key * 131 + i * 7);
  return out;
}

void WriteShard(const fs::path& file, const std::vector<uint8_t>& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A shard of keys [first, first + n): KEY.jpg (size varies with the key) and KEY.cls = key % 3.
std::vector<uint8_t> MakeShard(int first, int n) {
  TarShardWriter w;
  for (int k = first; k < first + n; ++k) {
    // fmt::format, not "s" + std::to_string(k): GCC 12 at -O3 warns falsely (-Wrestrict) on that.
    std::string key = fmt::format("s{}", k);
    EXPECT_TRUE(w.Add(key + ".jpg", FakeImage(k, 100 + 37 * k)).ok());
    EXPECT_TRUE(w.Add(key + ".cls", Bytes(std::to_string(k % 3))).ok());
  }
  return w.Finish();
}

Status List(const std::vector<uint8_t>& shard, std::vector<TarMember>* out) {
  return ListTarMembersInMemory("test.tar", shard, out);
}

// Sets header `block`'s type flag and recomputes its checksum.
void Retype(std::vector<uint8_t>* shard, size_t header_at, char type) {
  uint8_t* h = shard->data() + header_at;
  h[156] = static_cast<uint8_t>(type);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) sum += h[i];
  std::snprintf(reinterpret_cast<char*>(h + 148), 8, "%06o", sum);
}

TEST(TarShardsTest, WriterAndParserAgreeOnNamesOffsetsAndSizes) {
  TarShardWriter w;
  std::string long_name = std::string(120, 'd') + "/" + std::string(90, 'n') + ".jpg";
  ASSERT_TRUE(w.Add("a.jpg", FakeImage(1, 513)).ok());
  ASSERT_TRUE(w.Add(long_name, FakeImage(2, 0)).ok());
  ASSERT_TRUE(w.Add("a.cls", Bytes("7\n")).ok());
  EXPECT_EQ(w.Add(std::string(300, 'x'), {}).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> shard = w.Finish();
  EXPECT_EQ(shard.size() % kTarBlock, 0u);
  std::vector<TarMember> m;
  ASSERT_TRUE(List(shard, &m).ok());
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].name, "a.jpg");
  EXPECT_EQ(m[0].offset, 512u);
  EXPECT_EQ(m[0].size, 513u);
  EXPECT_EQ(m[1].name, long_name);
  EXPECT_EQ(m[1].offset, 512u + 512 + 1024);
  EXPECT_EQ(m[2].name, "a.cls");
  EXPECT_EQ(std::vector<uint8_t>(shard.begin() + m[0].offset, shard.begin() + m[0].offset + 513),
            FakeImage(1, 513));
}

// Differential check against GNU tar: it lists our shard, and we parse its ustar archive.
TEST(TarShardsTest, InteroperatesWithGnuTar) {
  if (std::system("tar --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no tar on PATH";
  TempDirForTest tmp;
  WriteShard(tmp.path() / "ours.tar", MakeShard(0, 3));
  std::string cmd = "cd " + tmp.path().string() + " && tar -tf ours.tar > list.txt";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream list(tmp.path() / "list.txt");
  std::string all((std::istreambuf_iterator<char>(list)), {});
  EXPECT_EQ(all, "s0.jpg\ns0.cls\ns1.jpg\ns1.cls\ns2.jpg\ns2.cls\n");

  WriteTestFile(tmp.path() / "src" / "k1.png", "png-bytes");
  WriteTestFile(tmp.path() / "src" / "k1.cls", "4");
  cmd = "cd " + tmp.path().string() + "/src && tar --format=ustar -cf ../theirs.tar k1.png k1.cls";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  Result<SourceScan> scan = ScanTarShards({(tmp.path() / "theirs.tar").string()}, nullptr);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  ASSERT_EQ(scan->samples.size(), 1u);
  EXPECT_EQ(scan->samples[0].name, "k1.png");
  EXPECT_EQ(scan->samples[0].label, 4);
  EXPECT_EQ(scan->samples[0].size, 9u);
  EXPECT_EQ(scan->classes.size(), 5u);
  EXPECT_TRUE(scan->unreadable.empty());
}

TEST(TarShardsTest, RejectsBadChecksumsAndExtensionHeaders) {
  std::vector<uint8_t> shard = MakeShard(0, 2);
  std::vector<TarMember> m;
  std::vector<uint8_t> bad = shard;
  bad[1024 + 3] ^= 1;  // the name of the second header (s0.cls), after s0.jpg's 512 data bytes
  Status s = List(bad, &m);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("bad checksum"), std::string::npos) << s.message();
  EXPECT_EQ(m.size(), 1u);  // the member before the damage

  // A pax header whose records are not "LENGTH KEY=VALUE\n" (here: image bytes).
  std::vector<uint8_t> ext = shard;
  Retype(&ext, 0, 'x');
  m.clear();
  s = List(ext, &m);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("pax header at byte 0"), std::string::npos) << s.message();
}

// Python's tarfile (and so the webdataset library) writes pax headers, GNU tar long-name ones:
// their path (and pax's size) name the next member.
TEST(TarShardsTest, ReadsPaxAndGnuLongNameHeaders) {
  if (std::system("/usr/bin/python3 -c '' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  TempDirForTest tmp;
  const std::string long_key(120, 'k');  // beyond ustar's 100-byte name field
  std::string py = "/usr/bin/python3 -c \"import io, tarfile, time\n"
                   "t = tarfile.open('" + (tmp.path() / "pax.tar").string() +
                   "', 'w', format=tarfile.PAX_FORMAT)\n"
                   "for name, data in [('" + long_key + ".jpg', b'jpeg-bytes'), ('" + long_key +
                   ".cls', b'6'), ('short.png', b'png'), ('short.cls', b'2')]:\n"
                   "    i = tarfile.TarInfo(name); i.size = len(data); i.mtime = time.time()\n"
                   "    t.addfile(i, io.BytesIO(data))\n"
                   "t.close()\"";
  ASSERT_EQ(std::system(py.c_str()), 0) << py;
  Result<SourceScan> scan = ScanTarShards({(tmp.path() / "pax.tar").string()}, nullptr);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  ASSERT_EQ(scan->samples.size(), 2u);
  std::map<std::string, std::pair<int32_t, uint64_t>> got;
  for (const auto& smp : scan->samples) got[smp.name] = {smp.label, smp.size};
  EXPECT_EQ(got[long_key + ".jpg"], (std::pair<int32_t, uint64_t>{6, 10}));
  EXPECT_EQ(got["short.png"], (std::pair<int32_t, uint64_t>{2, 3}));
  EXPECT_TRUE(scan->unreadable.empty());

  if (std::system("tar --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no tar on PATH";
  WriteTestFile(tmp.path() / "src" / (long_key + ".png"), "png-bytes");
  WriteTestFile(tmp.path() / "src" / (long_key + ".cls"), "4");
  const std::string cmd = "cd " + tmp.path().string() + "/src && tar --format=gnu -cf ../gnu.tar " +
                          long_key + ".png " + long_key + ".cls";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  scan = ScanTarShards({(tmp.path() / "gnu.tar").string()}, nullptr);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  ASSERT_EQ(scan->samples.size(), 1u);
  EXPECT_EQ(scan->samples[0].name, long_key + ".png");
  EXPECT_EQ(scan->samples[0].label, 4);
}

TEST(TarShardsTest, TruncatedShardKeepsEarlierMembersAndReportsTheRest) {
  TempDirForTest tmp;
  std::vector<uint8_t> shard = MakeShard(0, 3);
  shard.resize(512 + 512 + 512 + 512 + 512 + 100);  // s0.jpg, s0.cls, then s1.jpg cut short
  WriteShard(tmp.path() / "cut.tar", shard);
  Result<SourceScan> scan = ScanTarShards({(tmp.path() / "cut.tar").string()}, nullptr);
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->samples.size(), 1u);
  EXPECT_EQ(scan->samples[0].name, "s0.jpg");
  ASSERT_EQ(scan->unreadable.size(), 1u);
  EXPECT_NE(scan->unreadable[0].find("is truncated: member \"s1.jpg\""), std::string::npos)
      << scan->unreadable[0];
}

TEST(TarShardsTest, ReportsImagesWithoutLabelsAndLabelsWithoutImages) {
  TempDirForTest tmp;
  TarShardWriter w;
  ASSERT_TRUE(w.Add("good.jpg", FakeImage(1, 10)).ok());
  ASSERT_TRUE(w.Add("good.cls", Bytes(" 2\n")).ok());
  ASSERT_TRUE(w.Add("nolabel.jpeg", FakeImage(2, 10)).ok());
  ASSERT_TRUE(w.Add("orphan.cls", Bytes("1")).ok());
  ASSERT_TRUE(w.Add("badlabel.png", FakeImage(3, 10)).ok());
  ASSERT_TRUE(w.Add("badlabel.cls", Bytes("cat")).ok());
  ASSERT_TRUE(w.Add("meta.json", Bytes("{}")).ok());  // other members are ignored
  WriteShard(tmp.path() / "a.tar", w.Finish());
  Result<SourceScan> scan = ScanTarShards(
      {(tmp.path() / "a.tar").string(), (tmp.path() / "missing.tar").string()}, nullptr);
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->samples.size(), 1u);
  EXPECT_EQ(scan->samples[0].name, "good.jpg");
  EXPECT_EQ(scan->samples[0].label, 2);
  EXPECT_EQ(scan->samples[0].offset, 512);
  std::string all;
  for (const std::string& u : scan->unreadable) all += u + "\n";
  EXPECT_EQ(scan->unreadable.size(), 4u) << all;
  EXPECT_NE(all.find("member nolabel.jpeg has no nolabel.cls label"), std::string::npos) << all;
  EXPECT_NE(all.find("member orphan.cls has no image orphan.jpg"), std::string::npos) << all;
  EXPECT_NE(all.find("label \"cat\" is not a non-negative decimal integer"), std::string::npos);
  EXPECT_NE(all.find("missing.tar: No such file or directory"), std::string::npos) << all;
}

TEST(TarShardsTest, ShardsWithoutAnyLabelAreUnlabelled) {
  TempDirForTest tmp;
  TarShardWriter w;
  ASSERT_TRUE(w.Add("x.jpg", FakeImage(1, 10)).ok());
  WriteShard(tmp.path() / "u.tar", w.Finish());
  Result<SourceScan> scan = ScanTarShards({(tmp.path() / "u.tar").string()}, nullptr);
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->samples.size(), 1u);
  EXPECT_EQ(scan->samples[0].label, -1);
  EXPECT_TRUE(scan->classes.empty());
  EXPECT_TRUE(scan->unreadable.empty());
}

TEST(TarShardsTest, ExpandsBraceRangesGlobsAndPlainPaths) {
  Result<std::vector<std::string>> r = ExpandShardPattern("/d/train-{000008..000011}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"/d/train-000008.tar", "/d/train-000009.tar",
                                          "/d/train-000010.tar", "/d/train-000011.tar"}));
  r = ExpandShardPattern("/d/{1..2}-{0..1}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 4u);
  EXPECT_EQ(r->back(), "/d/2-1.tar");
  EXPECT_EQ(ExpandShardPattern("/d/{5..3}.tar").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpandShardPattern("/d/{a..3}.tar").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ExpandShardPattern("/d/one.tar"), std::vector<std::string>{"/d/one.tar"});
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "b.tar", "");
  WriteTestFile(tmp.path() / "a.tar", "");
  r = ExpandShardPattern((tmp.path() / "*.tar").string());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{(tmp.path() / "a.tar").string(),
                                          (tmp.path() / "b.tar").string()}));
  EXPECT_EQ(ExpandShardPattern((tmp.path() / "*.none").string()).status().code(),
            StatusCode::kNotFound);
}

class TarCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteShard(tmp_.path() / "shards" / "train-000000.tar", MakeShard(0, 5));
    WriteShard(tmp_.path() / "shards" / "train-000001.tar", MakeShard(5, 5));
    Result<std::unique_ptr<Catalog>> c = Catalog::Open(tmp_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    catalog_ = std::move(*c);
  }
  Result<RegisterReport> Register(const std::string& name, const std::string& pattern,
                                  bool replace = false) {
    Result<SourceScan> scan = ScanTarShards({pattern}, nullptr);
    if (!scan.ok()) return scan.status();
    EXPECT_TRUE(scan->unreadable.empty());
    return catalog_->Register({name, scan->default_prepare, scan->classes, scan->description},
                              *scan, replace);
  }
  std::string Pattern() const { return (tmp_.path() / "shards" / "train-{000000..000001}.tar"); }

  TempDirForTest tmp_;
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(TarCatalogTest, RegistersMembersAndReadsThemByteExact) {
  Result<RegisterReport> r = Register("tars", Pattern());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->info.ids.cardinality(), 10u);
  EXPECT_EQ(r->info.classes, (std::vector<std::string>{"0", "1", "2"}));
  Result<std::vector<SampleRecord>> recs = catalog_->GetSamples(r->info.ids);
  ASSERT_TRUE(recs.ok());
  SampleReader reader;
  for (const SampleRecord& rec : *recs) {
    ASSERT_EQ(rec.source, "tar");
    int key = std::stoi(rec.member.substr(1));
    EXPECT_EQ(rec.label, key % 3);
    EXPECT_EQ(fs::path(rec.path).filename(), key < 5 ? "train-000000.tar" : "train-000001.tar");
    Result<std::vector<uint8_t>> bytes = reader.Read(rec);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(*bytes, FakeImage(key, 100 + 37 * key)) << rec.member;
  }
}

TEST_F(TarCatalogTest, IdentityIsShardAndMemberSoDerivedSetsOverlap) {
  Result<RegisterReport> all = Register("all", Pattern());
  ASSERT_TRUE(all.ok());
  // The second shard alone, through a symlinked folder: the same samples, the same ids.
  fs::create_directory_symlink(tmp_.path() / "shards", tmp_.path() / "link");
  Result<RegisterReport> second = Register("second", (tmp_.path() / "link" / "train-000001.tar"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->new_samples, 0u);
  EXPECT_EQ(second->info.ids.cardinality(), 5u);
  EXPECT_TRUE(second->info.ids.isSubset(all->info.ids));
  Result<DerivedSet> u = Combine(SetOp::kUnion, second->info, all->info, "");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->ids, all->info.ids);
  Result<DerivedSet> cls = SelectClasses(*catalog_, all->info, "1");
  ASSERT_TRUE(cls.ok());
  EXPECT_EQ(cls->ids.cardinality(), 3u);  // keys 1, 4, 7

  // The shard rewritten with its members in another order: same ids, the new offsets are read.
  TarShardWriter w;
  for (int k = 9; k >= 5; --k) {
    std::string key = fmt::format("s{}", k);
    ASSERT_TRUE(w.Add(key + ".cls", Bytes(std::to_string(k % 3))).ok());
    ASSERT_TRUE(w.Add(key + ".jpg", FakeImage(k, 100 + 37 * k)).ok());
  }
  WriteShard(tmp_.path() / "shards" / "train-000001.tar", w.Finish());
  Result<RegisterReport> again = Register("second", Pattern(), /*replace=*/true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->new_samples, 0u);
  EXPECT_EQ(again->info.ids, all->info.ids);
  Result<std::vector<SampleRecord>> recs = catalog_->GetSamples(second->info.ids);
  ASSERT_TRUE(recs.ok());
  for (const SampleRecord& rec : *recs) {
    int key = std::stoi(rec.member.substr(1));
    EXPECT_EQ(*ReadSample(rec), FakeImage(key, 100 + 37 * key)) << rec.member;
  }
}

TEST_F(TarCatalogTest, ReadOfAShardThatShrankIsCorruption) {
  Result<RegisterReport> r = Register("tars", Pattern());
  ASSERT_TRUE(r.ok());
  Result<std::vector<SampleRecord>> recs = catalog_->GetSamples(r->info.ids);
  ASSERT_TRUE(recs.ok());
  fs::resize_file(recs->back().path, 1024);
  Result<std::vector<uint8_t>> bytes = ReadSample(recs->back());
  EXPECT_EQ(bytes.status().code(), StatusCode::kCorruption);
  EXPECT_NE(bytes.status().message().find("re-register"), std::string::npos);
}

}  // namespace
}  // namespace carpool
