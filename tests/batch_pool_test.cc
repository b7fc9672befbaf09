#include "server/batch_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "client/slot_mapping.h"

namespace carpool {
namespace {

std::string UniqueInstance(const char* tag) { return fmt::format("test{}-{}", ::getpid(), tag); }
std::string UniqueName(const char* tag) { return BatchPool::SegmentName(UniqueInstance(tag), 7); }
size_t OwnSegments(const char* tag) {
  return BatchPool::SegmentLinks("/proc/self/fd", UniqueInstance(tag)).size();
}

// What the session sends with the job-info: a descriptor of the pool's segment.
UniqueFd Share(const BatchPool& pool) {
  Result<UniqueFd> fd = BatchPool::ShareSegment(pool.name());
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

protocol::JobInfo InfoFor(const BatchPool& pool, std::vector<uint32_t> shape) {
  protocol::JobInfo info;
  info.job_id = pool.job_id();
  info.batch_size = 4;
  info.sample_shape = std::move(shape);
  info.segment_name = pool.name();
  info.slot_count = pool.slot_count();
  info.slot_bytes = pool.slot_bytes();
  return info;
}

// Writes a batch of `n` samples of `sample_bytes` into a slot and returns its batch-ready.
protocol::BatchReady FillAndPublish(BatchPool& pool, uint32_t n, uint64_t sample_bytes,
                                    uint8_t seed) {
  auto slot = pool.TryAcquire();
  EXPECT_TRUE(slot.has_value());
  slots::BatchLayout l = slots::PlanBatchLayout(n, sample_bytes);
  EXPECT_LE(l.total_bytes, slot->data.size());
  for (uint64_t i = 0; i < l.images_bytes; ++i) slot->data[i] = static_cast<uint8_t>(seed + i);
  for (uint32_t i = 0; i < n; ++i) {
    int32_t label = seed + static_cast<int32_t>(i);
    uint32_t id = 1000u * seed + i;
    std::memcpy(slot->data.data() + l.labels_offset + 4 * i, &label, 4);
    std::memcpy(slot->data.data() + l.ids_offset + 4 * i, &id, 4);
  }
  auto gen = pool.Publish(slot->index);
  EXPECT_TRUE(gen.ok());
  return MakeBatchReady(pool.job_id(), slot->index, *gen, 0, 0, n, l);
}

TEST(BatchPoolTest, AcquirePublishReleaseWithGenerations) {
  auto pool = BatchPool::Create(UniqueName("cycle"), 7, 3, 1000);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  BatchPool& p = **pool;
  std::vector<WritableSlot> taken;
  for (int i = 0; i < 3; ++i) {
    auto s = p.TryAcquire();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->data.size(), 1000u);
    taken.push_back(*s);
  }
  EXPECT_FALSE(p.TryAcquire().has_value()) << "no credit left";
  EXPECT_EQ(p.FreeCount(), 0u);
  auto gen = p.Publish(taken[1].index);
  ASSERT_TRUE(gen.ok());
  EXPECT_EQ(*gen, 1u);
  EXPECT_FALSE(p.Publish(taken[1].index).ok()) << "already published";
  EXPECT_FALSE(p.Release(taken[1].index, 2).ok()) << "wrong generation";
  EXPECT_FALSE(p.Release(taken[0].index, 0).ok()) << "not published";
  EXPECT_FALSE(p.Release(99, 1).ok());
  EXPECT_EQ(p.PublishedCount(), 1u);
  EXPECT_TRUE(p.Release(taken[1].index, 1).ok());
  EXPECT_FALSE(p.Release(taken[1].index, 1).ok()) << "double release";
  auto again = p.TryAcquire();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->index, taken[1].index);
  EXPECT_EQ(*p.Publish(again->index), 2u) << "generation grows across reuse";
  EXPECT_TRUE(p.Abandon(taken[0].index).ok());
  EXPECT_FALSE(p.Abandon(taken[0].index).ok());
  EXPECT_EQ(p.FreeCount(), 1u);
  p.ReleaseAll();
  EXPECT_EQ(p.FreeCount(), 3u);
}

// Named nowhere in /dev/shm; reachable only through a descriptor the server hands out; 0600 and
// sealed, so the job's process, which maps it read-write, cannot resize it under the server.
TEST(BatchPoolTest, SegmentIsAPrivateSealedMemfdClosedWithThePool) {
  const std::string name = UniqueName("mode");
  const size_t live = BatchPool::LiveCount();
  {
    auto pool = BatchPool::Create(name, 7, 2, 4096);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    EXPECT_EQ(BatchPool::LiveCount(), live + 1);
    EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + name));
    EXPECT_EQ(OwnSegments("mode"), 1u)
        << "the pool holds its memfd";
    UniqueFd fd = Share(**pool);
    ASSERT_TRUE(fd.valid());
    struct stat st {};
    ASSERT_EQ(::fstat(fd.get(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), 2u * 4096);
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    EXPECT_NE(::ftruncate(fd.get(), 0), 0) << "a holder must not shrink the server's slots";
    EXPECT_EQ(errno, EPERM);
  }
  EXPECT_EQ(BatchPool::LiveCount(), live);
  EXPECT_EQ(OwnSegments("mode"), 0u)
      << "the pool's descriptor must be closed";
  EXPECT_EQ(BatchPool::ShareSegment(name).status().code(), StatusCode::kNotFound);
}

TEST(BatchPoolTest, OneLiveSegmentPerName) {
  const std::string name = UniqueName("twice");
  auto first = BatchPool::Create(name, 7, 1, 64);
  ASSERT_TRUE(first.ok());
  auto second = BatchPool::Create(name, 7, 1, 64);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(BatchPool::ShareSegment(name).ok()) << "the failed twin must not unregister it";
}

// Batch segments named in /dev/shm by a server before protocol 5 that died.
TEST(BatchPoolTest, RemovesOnlyTheInstancesStaleSegments) {
  std::string mine = fmt::format("test{}-stale", ::getpid());
  std::string other = fmt::format("test{}-stale2", ::getpid());
  for (const std::string& name :
       {BatchPool::SegmentName(mine, 1), BatchPool::SegmentName(mine, 22),
        BatchPool::SegmentName(other, 1)}) {
    UniqueFd fd(::shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
    ASSERT_TRUE(fd.valid()) << name << ": " << std::strerror(errno);
  }
  EXPECT_EQ(BatchPool::RemoveStaleSegments(mine), 2);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + BatchPool::SegmentName(mine, 1)));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + BatchPool::SegmentName(other, 1)))
      << "another instance's segment";
  EXPECT_EQ(BatchPool::RemoveStaleSegments(mine), 0);
  // Built by append: GCC 12 at -O3 warns falsely (-Wrestrict) on "/" + std::string&&.
  std::string other_path = "/";
  other_path += BatchPool::SegmentName(other, 1);
  ::shm_unlink(other_path.c_str());
}

TEST(BatchPoolTest, MoreThanMemoryHoldsIsAClearErrorNotSigbus) {
  const uint64_t total = uint64_t{static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES))} *
                         static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::string name = UniqueName("huge");
  // Two slots each larger than half of memory: ftruncate alone would accept this.
  auto pool = BatchPool::Create(name, 7, 2, total / 2 + (64u << 20));
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted) << pool.status().ToString();
  EXPECT_NE(pool.status().message().find("lower the batch size or prefetch"), std::string::npos);
  EXPECT_EQ(OwnSegments("huge"), 0u)
      << "a failed create must not leak";
  EXPECT_EQ(BatchPool::ShareSegment(name).status().code(), StatusCode::kNotFound);
}

TEST(BatchPoolTest, RejectsBadGeometryAndNames) {
  EXPECT_FALSE(BatchPool::Create(UniqueName("bad"), 7, 0, 100).ok());
  EXPECT_FALSE(BatchPool::Create(UniqueName("bad"), 7, 2, 0).ok());
  EXPECT_FALSE(BatchPool::Create(UniqueName("bad"), 7, 1u << 20, 1ull << 30).ok());
  EXPECT_FALSE(BatchPool::Create("", 7, 1, 100).ok());
  EXPECT_FALSE(BatchPool::Create("a/b", 7, 1, 100).ok());
}

TEST(BatchPoolTest, AcquireWaitsForReleaseAndShutdownWakes) {
  auto pool = BatchPool::Create(UniqueName("wait"), 7, 1, 64);
  ASSERT_TRUE(pool.ok());
  BatchPool& p = **pool;
  auto s = p.TryAcquire();
  ASSERT_TRUE(s.has_value());
  uint64_t gen = *p.Publish(s->index);
  EXPECT_FALSE(p.Acquire(std::chrono::milliseconds(20)).has_value());
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(p.Release(s->index, gen).ok());
  });
  auto got = p.Acquire(std::chrono::seconds(5));
  releaser.join();
  ASSERT_TRUE(got.has_value());
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    p.Shutdown();
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(p.Acquire(std::chrono::seconds(5)).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  stopper.join();
  EXPECT_FALSE(p.TryAcquire().has_value());
}

TEST(BatchPoolTest, ForkedClientReadsAndWritesItsBatchInPlace) {
  auto pool = BatchPool::Create(UniqueName("fork"), 7, 2, 4096);
  ASSERT_TRUE(pool.ok());
  protocol::JobInfo info = InfoFor(**pool, {2, 3, 4});  // 24 bytes per uint8 sample
  protocol::BatchReady ready = FillAndPublish(**pool, 4, 24, 9);
  UniqueFd segment = Share(**pool);

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The client side: no gtest assertions here, just an exit code per failed check.
    auto mapping = SlotMapping::Open(info, std::move(segment));
    if (!mapping.ok()) ::_exit(10);
    auto view = (*mapping)->View(ready);
    if (!view.ok()) ::_exit(11);
    for (uint64_t i = 0; i < ready.images_bytes; ++i) {
      if (view->images[i] != static_cast<uint8_t>(9 + i)) ::_exit(12);
    }
    for (uint32_t i = 0; i < 4; ++i) {
      if (view->labels[i] != static_cast<int32_t>(9 + i) || view->ids[i] != 9000u + i) {
        ::_exit(13);
      }
    }
    if ((*mapping)->State(ready.slot) != slots::SlotState::kPublished) ::_exit(14);
    // The slot is the job's alone and mapped writable: an in-place op on the batch works.
    auto* images = const_cast<uint8_t*>(view->images);
    for (uint64_t i = 0; i < ready.images_bytes; ++i) images[i] = static_cast<uint8_t>(255 - i);
    if (view->images[0] != 255) ::_exit(15);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "client check failed (see codes in the child)";
  // The job's write changed its batch, not the server's bookkeeping: the slot comes back and is
  // filled again as usual.
  EXPECT_TRUE((*pool)->Release(ready.slot, ready.generation).ok());
  EXPECT_EQ((*pool)->FreeCount(), 2u);
}

TEST(BatchPoolTest, ClientMappingRejectsInconsistentBatches) {
  auto pool = BatchPool::Create(UniqueName("reject"), 7, 2, 4096);
  ASSERT_TRUE(pool.ok());
  protocol::JobInfo info = InfoFor(**pool, {24});
  protocol::BatchReady ready = FillAndPublish(**pool, 4, 24, 1);
  auto mapping = SlotMapping::Open(info, Share(**pool));
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  EXPECT_TRUE((*mapping)->View(ready).ok());

  auto bad = ready;
  bad.generation += 1;
  EXPECT_EQ((*mapping)->View(bad).status().code(), StatusCode::kCorruption);
  bad = ready;
  bad.slot = 2;
  EXPECT_FALSE((*mapping)->View(bad).ok());
  bad = ready;
  bad.ids_offset = 4096 - 8;
  EXPECT_FALSE((*mapping)->View(bad).ok());
  bad = ready;
  bad.images_bytes = 95;
  EXPECT_FALSE((*mapping)->View(bad).ok());
  // Labels inside the slot but shorter than sample_count entries: labels() would read past them.
  bad = ready;
  bad.labels_offset = 4096 - 4;
  bad.labels_bytes = 4;
  EXPECT_EQ((*mapping)->View(bad).status().code(), StatusCode::kCorruption);
  bad = ready;
  bad.ids_offset += 2;
  bad.ids_bytes -= 4;
  EXPECT_FALSE((*mapping)->View(bad).ok());

  auto wrong = info;
  wrong.slot_count = 3;
  EXPECT_FALSE(SlotMapping::Open(wrong, Share(**pool)).ok());
  wrong = info;
  wrong.job_id = 8;
  EXPECT_EQ(SlotMapping::Open(wrong, Share(**pool)).status().code(), StatusCode::kCorruption);
  Status no_fd = SlotMapping::Open(info, UniqueFd()).status();
  EXPECT_EQ(no_fd.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_fd.message().find("came without its file descriptor"), std::string::npos)
      << no_fd.message();
}

}  // namespace
}  // namespace carpool
