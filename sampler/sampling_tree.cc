#include "sampler/sampling_tree.h"

#include <fmt/core.h>

#include <cassert>
#include <utility>

#include "sampler/roaring_node.h"

namespace carpool {

SamplingTree::SamplingTree(uint64_t seed) : rng_(seed) {}

uint64_t SamplingTree::Remaining(JobId job) const {
  auto it = index_.find(job);
  return it == index_.end() ? 0 : jobs_[it->second].size;
}

const Roaring* SamplingTree::RemainingSet(JobId job) const {
  auto it = index_.find(job);
  return it == index_.end() ? nullptr : &jobs_[it->second].remaining;
}

std::vector<SamplingTree::NodeStats> SamplingTree::Nodes() const {
  std::vector<NodeStats> out;
  out.reserve(jobs_.size());
  for (size_t p = 0; p < jobs_.size(); ++p) {
    out.push_back({jobs_[p].id, jobs_[p].size, spine_size_[p], jobs_[p].leaf_size});
  }
  return out;
}

Status SamplingTree::AddJob(JobId job, const Roaring& dataset) {
  if (Contains(job)) {
    return Status::AlreadyExists(fmt::format(
        "job {} is already in the sampling tree; remove it first or use a new id", job));
  }
  if (dataset.isEmpty()) {
    return Status::InvalidArgument(
        fmt::format("job {} has an empty dataset; a job needs at least one sample id", job));
  }
  Job j{job, dataset, WithoutRuns(dataset), Roaring(), dataset.cardinality(), 0};
  return Insert(std::move(j));
}

Status SamplingTree::AddJob(JobId job, const Roaring& dataset, const Roaring& remaining) {
  if (remaining.isEmpty() || !remaining.isSubset(dataset)) {
    return Status::InvalidArgument(fmt::format(
        "job {}: the samples left in its epoch ({}) must be a non-empty part of its dataset ({} "
        "samples, {} of the left ones outside it)",
        job, remaining.cardinality(), dataset.cardinality(), (remaining - dataset).cardinality()));
  }
  if (Contains(job)) return AddJob(job, dataset);  // the same error
  Job j{job, dataset, WithoutRuns(remaining), Roaring(), remaining.cardinality(), 0};
  return Insert(std::move(j));
}

Status SamplingTree::RemoveJob(JobId job) {
  auto it = index_.find(job);
  if (it == index_.end()) {
    return Status::NotFound(fmt::format("job {} is not in the sampling tree", job));
  }
  Erase(it->second);
  return Status::OK();
}

Status SamplingTree::ResetEpoch(JobId job) {
  auto it = index_.find(job);
  if (it == index_.end()) {
    return Status::NotFound(fmt::format("job {} is not in the sampling tree; add it first", job));
  }
  Job j = Erase(it->second);
  j.remaining = WithoutRuns(j.dataset);
  j.size = j.dataset.cardinality();
  return Insert(std::move(j));
}

Status SamplingTree::Return(JobId job, const Roaring& samples) {
  auto it = index_.find(job);
  if (it == index_.end()) {
    return Status::NotFound(fmt::format("job {} is not in the sampling tree; add it first", job));
  }
  const Job& j = jobs_[it->second];
  if (!samples.isSubset(j.dataset) || samples.intersect(j.remaining)) {
    return Status::InvalidArgument(fmt::format(
        "job {}: {} samples to return, {} outside its dataset and {} still in its R; only drawn "
        "samples of its dataset go back",
        job, samples.cardinality(), (samples - j.dataset).cardinality(),
        (samples & j.remaining).cardinality()));
  }
  if (samples.isEmpty()) return Status::OK();
  Job moved = Erase(it->second);
  moved.remaining |= samples;
  moved.remaining = WithoutRuns(moved.remaining);
  moved.size = moved.remaining.cardinality();
  return Insert(std::move(moved));
}

Status SamplingTree::Take(JobId job, const Roaring& samples) {
  auto it = index_.find(job);
  if (it == index_.end()) {
    return Status::NotFound(fmt::format("job {} is not in the sampling tree; add it first", job));
  }
  const Job& j = jobs_[it->second];
  if (!samples.isSubset(j.remaining)) {
    return Status::InvalidArgument(
        fmt::format("job {}: {} samples to take, {} of them not in its R; only samples still to "
                    "draw this epoch can be taken",
                    job, samples.cardinality(), (samples - j.remaining).cardinality()));
  }
  // Each sample moves as a round's draw by this job alone would move it (ApplyDraw), then the
  // job's new size is sorted in: far cheaper than a removal and an insertion, which rebuild the
  // nodes below it (a follower takes a few samples every round).
  const size_t p = it->second;
  for (SampleId x : samples) TakeOne(p, x);
  Resort();
  return Status::OK();
}

void SamplingTree::TakeOne(size_t p, SampleId x) {
  Job& job = jobs_[p];
  job.remaining.remove(x);
  --job.size;
  if (job.leaf.contains(x)) {
    job.leaf.remove(x);
    --job.leaf_size;
    return;
  }
  for (size_t q = 0; q <= p; ++q) {
    if (!spine_[q].contains(x)) continue;
    // Still needed by the jobs in [q, n) but p: those before p hold it in their leaves now, the
    // rest in N_{p+1}.
    spine_[q].remove(x);
    --spine_size_[q];
    for (size_t r = q; r < p; ++r) {
      jobs_[r].leaf.add(x);
      ++jobs_[r].leaf_size;
    }
    if (p + 1 < jobs_.size()) {
      spine_[p + 1].add(x);
      ++spine_size_[p + 1];
    }
    return;
  }
}

size_t SamplingTree::InsertPosition(const Job& job) const {
  size_t lo = 0, hi = jobs_.size();
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (Before(jobs_[mid], job)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

Roaring SamplingTree::SpineUnion(size_t last) const {
  std::vector<const Roaring*> parts;
  parts.reserve(last + 1);
  for (size_t q = 0; q <= last; ++q) {
    if (spine_size_[q] != 0) parts.push_back(&spine_[q]);
  }
  if (parts.empty()) return Roaring();
  return Roaring::fastunion(parts.size(), parts.data());
}

// Inserting at p leaves N_q for q > p+1 alone: S'_{p+1} is the old S_p, and every S'_q with
// q <= p is one intersection away from the one above it.
Status SamplingTree::Insert(Job job) {
  const size_t n = jobs_.size();
  const size_t p = InsertPosition(job);
  Roaring s_top = p == n ? job.remaining : SpineUnion(p);
  const size_t top = p == n ? p : p + 1;
  jobs_.insert(jobs_.begin() + static_cast<std::ptrdiff_t>(p), std::move(job));
  spine_.insert(spine_.begin() + static_cast<std::ptrdiff_t>(p), Roaring());
  spine_size_.insert(spine_size_.begin() + static_cast<std::ptrdiff_t>(p), 0);
  for (size_t q = p; q < jobs_.size(); ++q) index_[jobs_[q].id] = q;
  RebuildDown(top, std::move(s_top));
  return Status::OK();
}

// Deleting at p: the new S'_p is the old S_{p+1}; if p was last, the new last job's S is its R.
SamplingTree::Job SamplingTree::Erase(size_t pos) {
  const size_t n = jobs_.size();
  Roaring s_top;
  if (pos + 1 < n) s_top = SpineUnion(pos + 1);
  Job job = std::move(jobs_[pos]);
  index_.erase(job.id);
  jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(pos));
  spine_.erase(spine_.begin() + static_cast<std::ptrdiff_t>(pos));
  spine_size_.erase(spine_size_.begin() + static_cast<std::ptrdiff_t>(pos));
  for (size_t q = pos; q < jobs_.size(); ++q) index_[jobs_[q].id] = q;
  if (jobs_.empty()) return job;
  if (pos + 1 < n) {
    RebuildDown(pos, std::move(s_top));
  } else {
    RebuildDown(jobs_.size() - 1, jobs_.back().remaining);
  }
  return job;
}

void SamplingTree::RebuildDown(size_t top, Roaring s) {
  uint64_t s_size = s.cardinality();
  for (size_t q = top + 1; q-- > 0;) {
    Job& job = jobs_[q];
    Roaring below = q > 0 ? (jobs_[q - 1].remaining & s) : Roaring();
    const uint64_t below_size = q > 0 ? below.cardinality() : 0;
    job.leaf = job.remaining - s;
    job.leaf_size = job.size - s_size;
    s -= below;
    spine_[q] = std::move(s);
    spine_size_[q] = s_size - below_size;
    s = std::move(below);
    s_size = below_size;
  }
}

// With T = S_{p+2} and a, b the jobs at p, p+1 (old order): N'_{p+1} = (T \ S_p) ∩ L_a,
// N'_{p+2} = (T \ S_p) \ L_a, L'_b = L_b ∪ N_{p+1}, L'_a = L_a \ N'_{p+1}; T \ S_p is
// N_{p+1} ∪ N_{p+2}. When b is last, N'_{p+1} = L_a, L'_b = N_{p+1} and L'_a = {}.
void SamplingTree::SwapAdjacent(size_t p) {
  Job& a = jobs_[p];
  Job& b = jobs_[p + 1];
  if (p + 2 == jobs_.size()) {
    b.leaf = std::move(spine_[p + 1]);
    b.leaf_size = spine_size_[p + 1];
    spine_[p + 1] = std::move(a.leaf);
    spine_size_[p + 1] = a.leaf_size;
    a.leaf = Roaring();
    a.leaf_size = 0;
  } else {
    Roaring both = spine_[p + 1] | spine_[p + 2];
    Roaring first = both & a.leaf;
    const uint64_t first_size = first.cardinality();
    both -= first;
    b.leaf |= spine_[p + 1];
    b.leaf_size += spine_size_[p + 1];
    a.leaf -= first;
    a.leaf_size -= first_size;
    spine_size_[p + 2] = spine_size_[p + 1] + spine_size_[p + 2] - first_size;
    spine_size_[p + 1] = first_size;
    spine_[p + 1] = std::move(first);
    spine_[p + 2] = std::move(both);
  }
  std::swap(jobs_[p], jobs_[p + 1]);
  index_[jobs_[p].id] = p;
  index_[jobs_[p + 1].id] = p + 1;
  ++swaps_;
}

void SamplingTree::Resort() {
  for (size_t i = 1; i < jobs_.size(); ++i) {
    for (size_t j = i; j > 0 && Before(jobs_[j], jobs_[j - 1]); --j) SwapAdjacent(j - 1);
  }
}

// A sample taken from N_q by the jobs at positions P stays needed by the non-takers in [q, n):
// those up to max(P) now hold it in their leaves and the rest in N_{max(P)+1}.
void SamplingTree::ApplyDraw(const Draw& d) {
  const uint32_t* takers = taker_pos_.data() + d.first;
  for (uint32_t i = 0; i < d.count; ++i) {
    Job& job = jobs_[takers[i]];
    job.remaining.remove(d.sample);
    --job.size;
  }
  if (d.spine < 0) {
    Job& job = jobs_[takers[0]];
    job.leaf.remove(d.sample);
    --job.leaf_size;
    return;
  }
  const size_t q = static_cast<size_t>(d.spine);
  spine_[q].remove(d.sample);
  --spine_size_[q];
  const size_t last = takers[d.count - 1];
  uint32_t t = 0;
  for (size_t r = q; r <= last; ++r) {
    if (t < d.count && takers[t] == r) {
      ++t;
      continue;
    }
    jobs_[r].leaf.add(d.sample);
    ++jobs_[r].leaf_size;
  }
  if (last + 1 < jobs_.size()) {
    spine_[last + 1].add(d.sample);
    ++spine_size_[last + 1];
  }
}

SampleId SamplingTree::CoupledLeafDraw(size_t p, SampleId x, size_t q) {
  const Roaring& from = jobs_[p].leaf;  // A, of which x is a uniform draw
  const Roaring& to = jobs_[q].leaf;    // B
  const uint64_t a = jobs_[p].leaf_size, b = jobs_[q].leaf_size;
  // Maximal coupling of Unif(A) and Unif(B): keep x with probability min(1, a / b) when x is in
  // B, which gives each element of A∩B probability 1 / max(a, b) ...
  if (to.contains(x) && (a >= b || rng_.Bernoulli(a, b))) return x;
  // ... and the rest of Unif(B) otherwise: 1/b - 1/a on each element of A∩B (only when a > b)
  // and 1/b on each of B\A, by rejection from Unif(B) (one try expected per round, as the
  // rejected mass is what the kept x already took).
  for (;;) {
    const SampleId y = UniformElement(to, b, rng_);
    if (!from.contains(y) || (a > b && rng_.Bernoulli(a - b, a))) return y;
  }
}

void SamplingTree::RunRound(std::span<const JobId> participants, std::vector<Assignment>* out) {
  const size_t n = jobs_.size();
  in_round_.assign(n, 0);
  for (JobId id : participants) {
    auto it = index_.find(id);
    if (it != index_.end() && jobs_[it->second].size != 0) in_round_[it->second] = 1;
  }
  group_.clear();
  for (size_t p = 0; p < n; ++p) {
    if (in_round_[p]) group_.push_back(static_cast<uint32_t>(p));
  }
  draws_.clear();
  taker_pos_.clear();
  // X = the spine nodes [0, next_node) used so far; `used` = |∪X|, subtracted from every w_j.
  size_t next_node = 0;
  uint64_t used = 0;
  int64_t last_leaf = -1;  // position of the round's latest leaf draw, and its sample
  SampleId last_leaf_sample = 0;
  for (size_t gi = 0; gi < group_.size();) {
    const size_t p = group_[gi];
    uint64_t c = 0;  // |C|: nodes next_node..p
    for (size_t q = next_node; q <= p; ++q) c += spine_size_[q];
    uint64_t w_prev = jobs_[p].size - used;
    assert(w_prev > 0);
    Draw d{0, -1, static_cast<uint32_t>(taker_pos_.size()), 1};
    taker_pos_.push_back(static_cast<uint32_t>(p));
    if (c == w_prev || rng_.Bernoulli(c, w_prev)) {
      // Jobs follow the previous taker with probability w_prev / w (exact integer draws).
      while (gi + d.count < group_.size()) {
        const uint32_t pos = group_[gi + d.count];
        const uint64_t w = jobs_[pos].size - used;
        if (w != w_prev && !rng_.Bernoulli(w_prev, w)) break;
        taker_pos_.push_back(pos);
        w_prev = w;
        ++d.count;
      }
      uint64_t r = rng_.Uniform(c);
      size_t q = next_node;
      while (r >= spine_size_[q]) r -= spine_size_[q++];
      d.sample = UniformElement(spine_[q], spine_size_[q], rng_);
      d.spine = static_cast<int32_t>(q);
    } else {
      d.sample = last_leaf >= 0
                     ? CoupledLeafDraw(static_cast<size_t>(last_leaf), last_leaf_sample, p)
                     : UniformElement(jobs_[p].leaf, jobs_[p].leaf_size, rng_);
      last_leaf = static_cast<int64_t>(p);
      last_leaf_sample = d.sample;
    }
    gi += d.count;
    draws_.push_back(d);
    used += c;
    next_node = p + 1;
  }
  // Two draws of a round can meet by chance (a leaf draw and a later job's draw); report them as
  // one Assignment, since the sample is shared all the same. Spine draws never meet each other.
  const size_t first_out = out->size();
  for (const Draw& d : draws_) {
    Assignment* a = nullptr;
    for (size_t i = first_out; i < out->size(); ++i) {
      if ((*out)[i].sample == d.sample) a = &(*out)[i];
    }
    if (a == nullptr) {
      out->push_back(Assignment{d.sample, {}});
      a = &out->back();
      a->jobs.reserve(d.count);
    }
    for (uint32_t i = 0; i < d.count; ++i) a->jobs.push_back(jobs_[taker_pos_[d.first + i]].id);
    ApplyDraw(d);
  }
  Resort();
}

}  // namespace carpool
