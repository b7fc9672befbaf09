#include "datasets/catalog.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

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

DatasetMeta Meta(std::string name) { return {std::move(name), "raw", {"a", "b", "c"}, "test"}; }

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
  EXPECT_EQ(got->prepare_spec, "raw");
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
