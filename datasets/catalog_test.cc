#include "datasets/catalog.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "datasets/idx.h"
#include "datasets/sqlite_db.h"
#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

// A scan of `n` files "f<i>" in one directory, labels i % 3.
SourceScan FakeScan(const std::string& dir, int n, int first = 0) {
  SourceScan scan;
  scan.dirs = {dir};
  scan.classes = {"a", "b", "c"};
  scan.description = "test";
  for (int i = first; i < first + n; ++i) {
    // fmt::format, not "f" + std::to_string(i): GCC 12 at -O3 warns falsely (-Wrestrict) on that.
    scan.samples.push_back({0, fmt::format("f{}", i), -1, 10u + i, i % 3});
  }
  return scan;
}

DatasetMeta Meta(std::string name, std::string prepare = "resize=32") {
  return {std::move(name), std::move(prepare), {"a", "b", "c"}, "test"};
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Catalog>> c = Catalog::Open(dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    catalog_ = std::move(*c);
  }
  TempDirForTest dir_;
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(CatalogTest, OpensInWalModeWithSchemaVersion) {
  Result<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(dir_.path() / "catalog.db");
  ASSERT_TRUE(db.ok());
  Result<int64_t> version = (*db)->QueryInt("PRAGMA user_version");
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, kCatalogSchemaVersion);
  Result<SqliteStmt> mode = (*db)->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(mode.ok());
  ASSERT_TRUE(*mode->Step());
  EXPECT_EQ(mode->ColumnText(0), "wal");
}

TEST_F(CatalogTest, RejectsNewerSchema) {
  {
    Result<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(dir_.path() / "catalog.db");
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version=99").ok());
  }
  Result<std::unique_ptr<Catalog>> c = Catalog::Open(dir_.path());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("schema version 99"), std::string::npos);
}

TEST_F(CatalogTest, UpgradesVersion1InPlaceKeepingIds) {
  Result<RegisterReport> a = catalog_->Register(Meta("a"), FakeScan("/data", 10), false);
  ASSERT_TRUE(a.ok());
  catalog_.reset();
  {
    Result<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(dir_.path() / "catalog.db");
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("ALTER TABLE samples DROP COLUMN byte_offset").ok());
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version=1").ok());
  }
  Result<std::unique_ptr<Catalog>> c = Catalog::Open(dir_.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Result<std::vector<SampleRecord>> recs = (*c)->GetSamples(a->info.ids);
  ASSERT_TRUE(recs.ok()) << recs.status().ToString();
  ASSERT_EQ(recs->size(), 10u);
  EXPECT_EQ(recs->front().source, "file");
  EXPECT_EQ(recs->front().offset, -1);
  Result<RegisterReport> again = (*c)->Register(Meta("b"), FakeScan("/data", 10), false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->new_samples, 0u);
  EXPECT_EQ(again->info.ids, a->info.ids);
}

TEST_F(CatalogTest, SameSampleGetsSameIdInEveryDataset) {
  Result<RegisterReport> a = catalog_->Register(Meta("a"), FakeScan("/data", 100), false);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->info.ids.cardinality(), 100u);
  EXPECT_EQ(a->new_samples, 100u);
  // Overlapping range f50..f149: 50 shared ids, 50 new.
  Result<RegisterReport> b = catalog_->Register(Meta("b"), FakeScan("/data", 100, 50), false);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->new_samples, 50u);
  EXPECT_EQ(a->info.ids.and_cardinality(b->info.ids), 50u);
  EXPECT_EQ(*catalog_->SampleCount(), 150u);
  Result<DatasetInfo> got = catalog_->GetDataset("b");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->ids, b->info.ids);
  EXPECT_EQ(got->classes, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(got->prepare_spec, "resize=32");
  EXPECT_EQ(*catalog_->ListDatasets(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(CatalogTest, NewIdsFollowPathOrderAndDuplicatesCollapse) {
  SourceScan scan;
  scan.dirs = {"/z", "/a"};
  scan.samples = {{0, "x", -1, 1, 0}, {1, "y", -1, 2, 0}, {1, "b", -1, 3, 0}, {1, "y", -1, 2, 0}};
  Result<RegisterReport> r = catalog_->Register(Meta("d"), scan, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->duplicates, 1u);
  Result<std::vector<SampleRecord>> recs = catalog_->GetSamples(r->info.ids);
  ASSERT_TRUE(recs.ok());
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ((*recs)[0].path, "/a/b");
  EXPECT_EQ((*recs)[1].path, "/a/y");
  EXPECT_EQ((*recs)[2].path, "/z/x");
  EXPECT_EQ((*recs)[2].size, 1u);
  EXPECT_EQ((*recs)[0].source, "file");
}

TEST_F(CatalogTest, GetSamplesSparseAndDense) {
  Result<RegisterReport> r = catalog_->Register(Meta("a"), FakeScan("/d", 1000), false);
  ASSERT_TRUE(r.ok());
  Roaring sparse;
  sparse.add(r->info.ids.minimum());
  sparse.add(r->info.ids.maximum());
  Result<std::vector<SampleRecord>> recs = catalog_->GetSamples(sparse);
  ASSERT_TRUE(recs.ok());
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ((*recs)[1].id, r->info.ids.maximum());
  recs = catalog_->GetSamples(r->info.ids);
  ASSERT_TRUE(recs.ok());
  ASSERT_EQ(recs->size(), 1000u);
  for (const SampleRecord& s : *recs) {
    int i = std::stoi(s.path.substr(4));
    EXPECT_EQ(s.label, i % 3);
    EXPECT_EQ(s.size, 10u + i);
  }
  Roaring missing;
  missing.add(r->info.ids.maximum() + 5);
  EXPECT_EQ(catalog_->GetSamples(missing).status().code(), StatusCode::kNotFound);
}

TEST_F(CatalogTest, NameRulesDuplicatesReplaceAndEmpty) {
  ASSERT_TRUE(catalog_->Register(Meta("a"), FakeScan("/d", 5), false).ok());
  Result<RegisterReport> dup = catalog_->Register(Meta("a"), FakeScan("/d", 7), false);
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(dup.status().message().find("--replace"), std::string::npos);
  Result<RegisterReport> rep = catalog_->Register(Meta("a"), FakeScan("/d", 7), true);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(catalog_->GetDataset("a")->ids.cardinality(), 7u);
  EXPECT_EQ(catalog_->Register(Meta("bad name"), FakeScan("/d", 1), false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->Register(Meta("e"), FakeScan("/d", 0), false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->AddDataset(Meta("e"), Roaring(), false).status().code(),
            StatusCode::kInvalidArgument);
  Roaring unknown;
  unknown.add(1000000);
  EXPECT_FALSE(catalog_->AddDataset(Meta("e"), unknown, false).ok());
  EXPECT_FALSE(catalog_->GetDataset("e").ok());
}

TEST_F(CatalogTest, RemoveKeepsSampleIds) {
  Result<RegisterReport> a = catalog_->Register(Meta("a"), FakeScan("/d", 20), false);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(catalog_->RemoveDataset("a").ok());
  Result<DatasetInfo> gone = catalog_->GetDataset("a");
  ASSERT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("known: none"), std::string::npos);
  EXPECT_EQ(catalog_->RemoveDataset("a").code(), StatusCode::kNotFound);
  Result<RegisterReport> again = catalog_->Register(Meta("a2"), FakeScan("/d", 20), false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->info.ids, a->info.ids);
  EXPECT_EQ(again->new_samples, 0u);
}

TEST_F(CatalogTest, DamagedBitmapIsReportedNotTrusted) {
  ASSERT_TRUE(catalog_->Register(Meta("a"), FakeScan("/d", 20), false).ok());
  {
    Result<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(dir_.path() / "catalog.db");
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("UPDATE datasets SET ids=substr(ids, 1, 6) WHERE name='a'").ok());
  }
  Result<DatasetInfo> info = catalog_->GetDataset("a");
  ASSERT_EQ(info.status().code(), StatusCode::kCorruption);
  EXPECT_NE(info.status().message().find("dataset rm a"), std::string::npos);
}

// A prepare spec must fit the samples it registers (issue 21): "raw" keeps IDX records, every
// other spec decodes images. Each case used to register and fail only when a job read a sample.
TEST_F(CatalogTest, RawSpecOnImageFilesOrTarMembersIsRejectedNamingTheFix) {
  Result<RegisterReport> files =
      catalog_->Register(Meta("imgs", "raw,channels=1"), FakeScan("/data", 3), false);
  ASSERT_EQ(files.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(files.status().message(),
            "prepare spec \"raw,channels=1\" keeps IDX records as they are, but dataset \"imgs\" "
            "holds 3 images (e.g. \"/data/f0\"); use an image spec, e.g. --prepare "
            "resize=256,crop=256");
  SourceScan tar;
  tar.dirs = {"/t/shard-000000.tar"};
  tar.samples = {{0, "k0.jpg", -1, 10, 0, 512}, {0, "k1.jpg", -1, 10, 0, 1536}};
  Result<RegisterReport> members = catalog_->Register(Meta("tars", "raw"), tar, false);
  ASSERT_EQ(members.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(members.status().message().find(
                "holds 2 images (e.g. tar shard \"/t/shard-000000.tar\" member \"k0.jpg\")"),
            std::string::npos)
      << members.status().message();
  EXPECT_EQ(catalog_->ListDatasets()->size(), 0u);
  EXPECT_EQ(*catalog_->SampleCount(), 0u);
  EXPECT_TRUE(
      catalog_->Register(Meta("imgs", "resize=64,crop=32"), FakeScan("/data", 3), false).ok());
}

class CatalogIdxTest : public CatalogTest {
 protected:
  // Registers an IDX pair of 4 records of 2x3 bytes, labelled 0..3, with `prepare`.
  Result<RegisterReport> RegisterIdx(const std::string& name, const std::string& prepare) {
    WriteTestFile(images(), IdxHeaderForTest({4, 2, 3}) + std::string(4 * 6, 'x'));
    WriteTestFile(dir_.path() / "labels", IdxHeaderForTest({4}) + std::string("\0\1\2\3", 4));
    Result<SourceScan> scan = ReadIdxPair(images(), dir_.path() / "labels");
    if (!scan.ok()) return scan.status();
    return catalog_->Register(Meta(name, prepare), *scan, false);
  }
  std::filesystem::path images() const { return dir_.path() / "images"; }
};

TEST_F(CatalogIdxTest, ImageSpecOrWrongChannelsOnIdxRecordsIsRejected) {
  Result<RegisterReport> decoded = RegisterIdx("x", "resize=32");
  ASSERT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded.status().message(),
            fmt::format("prepare spec \"resize=32\" decodes images, but dataset \"x\" holds 4 IDX "
                        "records (e.g. \"{}\"), which are not images; use --prepare "
                        "raw,channels=1",
                        images().string()));
  Result<RegisterReport> rgb = RegisterIdx("x", "raw");
  ASSERT_EQ(rgb.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rgb.status().message().find("as 2x3x3 = 18 bytes, but a record holds 6; use "
                                        "--prepare raw,channels=1"),
            std::string::npos)
      << rgb.status().message();
  EXPECT_EQ(catalog_->ListDatasets()->size(), 0u);
  Result<RegisterReport> ok = RegisterIdx("x", "raw,channels=1");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
}

// Derived datasets and unions are checked against the samples they hold.
TEST_F(CatalogIdxTest, DerivedDatasetsMustFitTheirSamples) {
  Result<RegisterReport> idx = RegisterIdx("idx", "raw,channels=1");
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  Result<RegisterReport> imgs = catalog_->Register(Meta("imgs"), FakeScan("/data", 3), false);
  ASSERT_TRUE(imgs.ok()) << imgs.status().ToString();
  Result<DatasetInfo> mixed =
      catalog_->AddDataset(Meta("u", "raw,channels=1"), idx->info.ids | imgs->info.ids, false);
  ASSERT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.status().message().find("dataset \"u\" mixes 4 IDX records"), std::string::npos)
      << mixed.status().message();
  EXPECT_NE(mixed.status().message().find("and 3 images (e.g. \"/data/f0\"), and no prepare "
                                          "spec fits both"),
            std::string::npos)
      << mixed.status().message();
  EXPECT_EQ(catalog_->AddDataset(Meta("u", "resize=32"), idx->info.ids | imgs->info.ids, false)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->AddDataset(Meta("sub", "resize=32"), idx->info.ids, false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->AddDataset(Meta("sub", "raw"), idx->info.ids, false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->AddDataset(Meta("sub", "raw"), imgs->info.ids, false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(*catalog_->ListDatasets(), (std::vector<std::string>{"idx", "imgs"}));
  EXPECT_TRUE(catalog_->AddDataset(Meta("sub", "raw,channels=1"), idx->info.ids, false).ok());
  EXPECT_TRUE(catalog_->AddDataset(Meta("sub2", "channels=1"), imgs->info.ids, false).ok());
}

TEST_F(CatalogTest, NotFoundListsKnownNames) {
  ASSERT_TRUE(catalog_->Register(Meta("tiny"), FakeScan("/d", 2), false).ok());
  ASSERT_TRUE(catalog_->Register(Meta("imagenet"), FakeScan("/d", 3), false).ok());
  Result<DatasetInfo> info = catalog_->GetDataset("imagenet-sub");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().message(),
            "dataset \"imagenet-sub\" not found (known: imagenet, tiny); register it with "
            "'carpool dataset add'");
}

}  // namespace
}  // namespace carpool
