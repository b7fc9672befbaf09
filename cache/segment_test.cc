#include "cache/segment.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace carpool::cache {
namespace {

constexpr uint64_t kPage = 64 << 10;

std::string TestName(const char* tag) {
  return fmt::format("carpool-test-{}-{}", ::getpid(), tag);
}

std::unique_ptr<Segment> MakeSegment(const std::string& name) {
  Result<std::unique_ptr<Segment>> seg = Segment::Create({name, 8 * kPage, kPage});
  EXPECT_TRUE(seg.ok()) << seg.status().ToString();
  return seg.ok() ? std::move(*seg) : nullptr;
}

// Writes `bytes` of sample-derived content into the slot at `offset` and publishes it.
SlotRef WriteSlot(Segment& seg, uint64_t offset, uint32_t sample, uint64_t bytes,
                  uint64_t odd_gen) {
  seg.BeginWrite(offset, sample, bytes, odd_gen);
  std::span<uint8_t> data = seg.Payload(offset, bytes);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(sample * 7 + i);
  seg.Publish(offset, odd_gen + 1);
  return SlotRef{offset, odd_gen + 1, bytes};
}

bool HoldsSample(Segment& seg, const SlotRef& ref, uint32_t sample) {
  std::span<uint8_t> data = seg.Payload(ref.offset, ref.bytes);
  for (uint64_t i = 0; i < ref.bytes; ++i) {
    if (data[i] != static_cast<uint8_t>(sample * 7 + i)) return false;
  }
  return true;
}

// The owner pid in the header of segment `name`, as another server starting with that name reads
// it; -1 if the segment does not exist or is not a carpool segment.
pid_t OwnerPid(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return -1;
  void* mem = ::mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mem == MAP_FAILED) return -1;
  const auto* h = static_cast<const SegmentHeader*>(mem);
  pid_t pid = h->magic.load(std::memory_order_acquire) == kSegmentMagic ? h->owner_pid : -1;
  ::munmap(mem, kHeaderBytes);
  return pid;
}

TEST(SegmentTest, NameValidation) {
  EXPECT_EQ(*SegmentName("job-1.a_b"), "carpool-job-1.a_b");
  EXPECT_FALSE(SegmentName("").ok());
  EXPECT_FALSE(SegmentName("a/b").ok());
  EXPECT_FALSE(SegmentName(std::string(65, 'x')).ok());
}

TEST(SegmentTest, CreateWriteReadAndCleanup) {
  std::string name = TestName("basic");
  {
    std::unique_ptr<Segment> seg = MakeSegment(name);
    ASSERT_NE(seg, nullptr);
    EXPECT_EQ(seg->data_bytes(), 8 * kPage);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_uid, ::getuid());

    SlotRef ref = WriteSlot(*seg, seg->data_offset(), 42, 1000, 1);
    EXPECT_EQ(OwnerPid(name), ::getpid());
    EXPECT_EQ(seg->RefAt(ref.offset), ref);
    EXPECT_TRUE(HoldsSample(*seg, ref, 42));
  }
  // The destructor unlinked the name.
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + name));
}

// The header page, then the data pages; the mapping covers both.
TEST(SegmentTest, LayoutIsTheHeaderThenTheData) {
  std::string name = TestName("layout");
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->data_offset(), kHeaderBytes);
  EXPECT_EQ(seg->page_bytes(), kPage);
  EXPECT_EQ(seg->size(), kHeaderBytes + 8 * kPage);
  EXPECT_EQ(seg->Mapping().size(), seg->size());
  EXPECT_EQ(std::filesystem::file_size("/dev/shm/" + name), seg->size());
}

// Clients never map the cache, so it is the server's alone, also under --group.
TEST(SegmentTest, IsTheServersUserAlone) {
  std::string name = TestName("owner");
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

// A slot's generation: odd while written or after retirement, even once published; a reused slot
// holds the new sample's size and bytes.
TEST(SegmentTest, GenerationsFollowWritesAndRetirement) {
  std::string name = TestName("gen");
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  const uint64_t offset = seg->data_offset() + 128;
  SlotRef old_ref = WriteSlot(*seg, offset, 1, 500, 3);
  EXPECT_EQ(seg->RefAt(offset), old_ref);
  EXPECT_TRUE(HoldsSample(*seg, old_ref, 1));

  seg->Retire(offset, 5);  // evicted
  EXPECT_EQ(seg->RefAt(offset).generation, 5u);
  SlotRef new_ref = WriteSlot(*seg, offset, 2, 300, 7);  // reused by another sample
  EXPECT_EQ(seg->RefAt(offset), new_ref);
  EXPECT_NE(new_ref, old_ref);
  EXPECT_TRUE(HoldsSample(*seg, new_ref, 2));

  seg->BeginWrite(offset, 3, 500, 9);  // being written: odd, with the new size
  EXPECT_EQ(seg->RefAt(offset), (SlotRef{offset, 9, 500}));
}

TEST(SegmentTest, MoreThanDevShmHoldsIsAClearErrorNotSigbus) {
  struct statvfs fs {};
  ASSERT_EQ(::statvfs("/dev/shm", &fs), 0);
  const uint64_t total = uint64_t{fs.f_blocks} * fs.f_frsize;
  std::string name = TestName("huge");
  Result<std::unique_ptr<Segment>> seg = Segment::Create({name, total + 64 * kPage, kPage});
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), StatusCode::kResourceExhausted) << seg.status().ToString();
  EXPECT_NE(seg.status().message().find("--cache-size"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + name)) << "a failed create must not leak";
}

TEST(SegmentTest, LiveOwnerIsAlreadyInUse) {
  std::string name = TestName("live");
  std::unique_ptr<Segment> first = MakeSegment(name);
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<Segment>> second = Segment::Create({name, 8 * kPage, kPage});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find(std::to_string(::getpid())), std::string::npos);
  EXPECT_EQ(OwnerPid(name), ::getpid());  // the first is untouched
}

TEST(SegmentTest, SegmentOfKilledServerIsReplaced) {
  std::string name = TestName("stale");
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<std::unique_ptr<Segment>> seg = Segment::Create({name, 8 * kPage, kPage});
    char c = seg.ok() ? 'y' : 'n';
    (void)!::write(pipefd[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  EXPECT_EQ(OwnerPid(name), child);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  std::unique_ptr<Segment> seg = MakeSegment(name);  // replaces the dead server's segment
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(OwnerPid(name), ::getpid());
}

TEST(SegmentTest, HalfInitializedSegmentIsReplacedAndForeignOneIsNot) {
  std::string name = TestName("half");
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 8192), 0);  // zeros: a server died before writing its header
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  seg.reset();
  ::close(fd);

  fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 8192), 0);
  uint64_t junk = 0x1234;
  ASSERT_EQ(::pwrite(fd, &junk, sizeof(junk), 0), static_cast<ssize_t>(sizeof(junk)));
  Result<std::unique_ptr<Segment>> foreign = Segment::Create({name, 8 * kPage, kPage});
  EXPECT_EQ(foreign.status().code(), StatusCode::kFailedPrecondition);
  uint64_t still = 0;  // the foreign segment is left as it was
  ASSERT_EQ(::pread(fd, &still, sizeof(still), 0), static_cast<ssize_t>(sizeof(still)));
  EXPECT_EQ(still, junk);
  EXPECT_EQ(OwnerPid(name), -1);
  ::close(fd);
  ::shm_unlink(name.c_str());
}

}  // namespace
}  // namespace carpool::cache
