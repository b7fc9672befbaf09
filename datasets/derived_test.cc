#include "datasets/derived.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

class DerivedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    catalog_ = Catalog::Open(dir_.path()).value();
    SourceScan scan;
    scan.dirs = {"/d"};
    scan.classes = {"cat", "dog", "eel", "fox"};
    for (int i = 0; i < 1000; ++i) scan.samples.push_back({0, std::to_string(i), -1, 1, i % 4});
    Result<RegisterReport> r =
        catalog_->Register({"all", "resize=32", scan.classes, "test"}, scan, false);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    all_ = r->info;
  }
  TempDirForTest dir_;
  std::unique_ptr<Catalog> catalog_;
  DatasetInfo all_;
};

TEST_F(DerivedTest, ClassesByNameAndIndex) {
  Result<DerivedSet> d = SelectClasses(*catalog_, all_, "cat,2");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->ids.cardinality(), 500u);
  Result<std::vector<SampleRecord>> recs = catalog_->GetSamples(d->ids);
  ASSERT_TRUE(recs.ok());
  for (const SampleRecord& r : *recs) EXPECT_TRUE(r.label == 0 || r.label == 2) << r.label;
  EXPECT_EQ(d->meta.classes, all_.classes);
  Result<DerivedSet> bad = SelectClasses(*catalog_, all_, "cat,gnu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"gnu\""), std::string::npos);
  EXPECT_FALSE(SelectClasses(*catalog_, all_, "4").ok());
}

TEST_F(DerivedTest, FractionIsExactSizeSubsetAndSeeded) {
  Result<DerivedSet> a = SelectFraction(all_, 0.3, 7);
  Result<DerivedSet> b = SelectFraction(all_, 0.3, 7);
  Result<DerivedSet> c = SelectFraction(all_, 0.3, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->ids.cardinality(), 300u);
  EXPECT_TRUE(a->ids.isSubset(all_.ids));
  EXPECT_EQ(a->ids, b->ids);
  EXPECT_NE(a->ids, c->ids);
  EXPECT_EQ(SelectFraction(all_, 1.0, 1)->ids, all_.ids);
  EXPECT_FALSE(SelectFraction(all_, 0.0, 1).ok());
  EXPECT_FALSE(SelectFraction(all_, 1.5, 1).ok());
}

// Each id is chosen with probability k/n; over 400 seeds the count per id is Binomial(400, 0.1).
// A z bound of 5.5 over 1000 ids gives a false alarm rate below 1e-4 for the whole test.
TEST_F(DerivedTest, FractionIsUniform) {
  std::vector<int> hits(all_.ids.maximum() + 1, 0);
  const int kSeeds = 400;
  for (int s = 0; s < kSeeds; ++s) {
    Result<DerivedSet> d = SelectFraction(all_, 0.1, s);
    for (uint32_t id : d->ids) ++hits[id];
  }
  const double mean = kSeeds * 0.1, sd = std::sqrt(kSeeds * 0.1 * 0.9);
  for (uint32_t id : all_.ids) EXPECT_LT(std::abs(hits[id] - mean) / sd, 5.5) << id;
}

TEST_F(DerivedTest, IdRange) {
  uint32_t lo = all_.ids.minimum();
  Result<DerivedSet> d =
      SelectIdRange(all_, std::to_string(lo + 10) + ":" + std::to_string(lo + 20));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ids.cardinality(), 10u);
  EXPECT_EQ(d->ids.minimum(), lo + 10);
  EXPECT_EQ(SelectIdRange(all_, ":" + std::to_string(lo + 5))->ids.cardinality(), 5u);
  EXPECT_EQ(SelectIdRange(all_, std::to_string(lo + 995) + ":")->ids.cardinality(), 5u);
  EXPECT_FALSE(SelectIdRange(all_, "5").ok());
  EXPECT_FALSE(SelectIdRange(all_, "9:3").ok());
  EXPECT_FALSE(SelectIdRange(all_, "a:b").ok());
}

TEST_F(DerivedTest, SetOperationsMatchStdSet) {
  DatasetInfo a = all_, b = all_;
  a.ids = SelectFraction(all_, 0.5, 1)->ids;
  b.ids = SelectFraction(all_, 0.5, 2)->ids;
  std::set<uint32_t> sa(a.ids.begin(), a.ids.end()), sb(b.ids.begin(), b.ids.end());
  size_t inter = 0;
  for (uint32_t x : sa) inter += sb.count(x);
  EXPECT_EQ(Combine(SetOp::kIntersect, a, b, "")->ids.cardinality(), inter);
  EXPECT_EQ(Combine(SetOp::kUnion, a, b, "")->ids.cardinality(), sa.size() + sb.size() - inter);
  EXPECT_EQ(Combine(SetOp::kMinus, a, b, "")->ids.cardinality(), sa.size() - inter);
  b.prepare_spec = "resize=256,crop=256";
  EXPECT_FALSE(Combine(SetOp::kUnion, a, b, "").ok());
  Result<DerivedSet> forced = Combine(SetOp::kUnion, a, b, "raw,channels=1");
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->meta.prepare_spec, "raw,channels=1");
}

}  // namespace
}  // namespace carpool
