// Derived datasets: subsets of one registered dataset, or set operations on two. Pure functions
// of their inputs (the class filter also reads sample labels from the catalog). Thread-compatible.
#ifndef CARPOOL_DATASETS_DERIVED_H_
#define CARPOOL_DATASETS_DERIVED_H_

#include <cstdint>
#include <string_view>

#include "carpool/status.h"
#include "datasets/catalog.h"

namespace carpool {

// The ids, classes, prepare spec and description of a derived dataset; labels are not renumbered,
// so classes stay those of the source.
struct DerivedSet {
  Roaring ids;
  DatasetMeta meta;  // name left empty for the caller
};

// `classes` is comma-separated class names or indices into from.classes, e.g. "0,2,4,6" or
// "cat,dog". Names are matched first.
Result<DerivedSet> SelectClasses(const Catalog& catalog, const DatasetInfo& from,
                                 std::string_view classes);

// round(fraction * |from|) ids drawn uniformly without replacement; the same seed gives the same
// subset on every platform. REQUIRES: 0 < fraction <= 1.
Result<DerivedSet> SelectFraction(const DatasetInfo& from, double fraction, uint64_t seed);

// The ids of `from` in the half-open sample-id range "LO:HI"; either bound may be omitted.
Result<DerivedSet> SelectIdRange(const DatasetInfo& from, std::string_view range);

enum class SetOp { kUnion, kIntersect, kMinus };

// A op B. The prepare spec must agree unless `prepare` overrides it (non-empty); classes are A's,
// and a warning is logged when B's differ.
Result<DerivedSet> Combine(SetOp op, const DatasetInfo& a, const DatasetInfo& b,
                           std::string_view prepare);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_DERIVED_H_
