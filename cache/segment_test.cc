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

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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

TEST(SegmentTest, NameValidation) {
  EXPECT_EQ(*SegmentName("job-1.a_b"), "carpool-job-1.a_b");
  EXPECT_FALSE(SegmentName("").ok());
  EXPECT_FALSE(SegmentName("a/b").ok());
  EXPECT_FALSE(SegmentName(std::string(65, 'x')).ok());
}

TEST(SegmentTest, CreateOpenReadAndCleanup) {
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
    Result<std::unique_ptr<SegmentReader>> reader = SegmentReader::Open(name);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->owner_pid(), ::getpid());
    std::vector<uint8_t> out(1000);
    Result<uint64_t> n = (*reader)->Read(ref, out);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, 1000u);
    for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(out[i], static_cast<uint8_t>(42 * 7 + i));
  }
  // The destructor unlinked the name.
  Result<std::unique_ptr<SegmentReader>> gone = SegmentReader::Open(name);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
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

TEST(SegmentTest, StaleGenerationIsDetected) {
  std::string name = TestName("gen");
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  std::unique_ptr<SegmentReader> reader = SegmentReader::Open(name).value();
  const uint64_t offset = seg->data_offset() + 128;
  SlotRef old_ref = WriteSlot(*seg, offset, 1, 500, 3);
  std::vector<uint8_t> out(500);
  ASSERT_TRUE(reader->Read(old_ref, out).ok());

  seg->Retire(offset, 5);  // evicted
  EXPECT_EQ(reader->Read(old_ref, out).status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(reader->Valid(old_ref));
  SlotRef new_ref = WriteSlot(*seg, offset, 2, 500, 7);  // reused by another sample
  EXPECT_EQ(reader->Read(old_ref, out).status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(reader->Read(new_ref, out).ok());
  EXPECT_EQ(out[0], static_cast<uint8_t>(2 * 7));

  // A slot being written (odd generation) is never readable, even with a forged ref.
  seg->BeginWrite(offset, 3, 500, 9);
  EXPECT_EQ(reader->Read(SlotRef{offset, 10, 500}, out).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(reader->Read(SlotRef{offset, 9, 500}, out).status().code(),
            StatusCode::kInvalidArgument);  // odd generations are never handed out
}

// The page was carved into another size class: the stale offset now lies inside another sample's
// payload, which happens to contain the old generation where the header used to be.
TEST(SegmentTest, RecarvedPageDefeatsPayloadThatMimicsAHeader) {
  std::string name = TestName("carve");
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  std::unique_ptr<SegmentReader> reader = SegmentReader::Open(name).value();
  const uint64_t base = seg->data_offset();
  seg->MarkCarved(0, 1, 1);
  SlotRef old_ref = WriteSlot(*seg, base + 1024, 5, 256, 3);
  seg->Retire(base + 1024, 5);
  seg->MarkCarved(0, 1, 6);  // new layout: one big slot at the page start
  seg->BeginWrite(base, 6, 4000, 7);
  std::span<uint8_t> payload = seg->Payload(base, 4000);
  // Forge the old header inside the new payload: generation, sample, size.
  SlotHeader forged{};
  forged.generation.store(old_ref.generation);
  forged.sample = 5;
  forged.payload_bytes = 256;
  std::memcpy(payload.data() + 1024 - kSlotHeaderBytes, &forged, sizeof(forged));
  seg->Publish(base, 8);
  std::vector<uint8_t> out(4000);
  EXPECT_EQ(reader->Read(old_ref, out).status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(reader->Read(SlotRef{base, 8, 4000}, out).ok());
}

TEST(SegmentTest, RefsOutsideTheSegmentAreRejected) {
  std::string name = TestName("bounds");
  std::unique_ptr<Segment> seg = MakeSegment(name);
  ASSERT_NE(seg, nullptr);
  std::unique_ptr<SegmentReader> reader = SegmentReader::Open(name).value();
  std::vector<uint8_t> out(16);
  for (SlotRef bad : {SlotRef{0, 2, 16}, SlotRef{seg->data_offset() + 1, 2, 16},
                      SlotRef{seg->size(), 2, 16}, SlotRef{seg->data_offset(), 2, ~0ull},
                      SlotRef{seg->size() - 128, 2, 128}}) {
    EXPECT_EQ(reader->Read(bad, out).status().code(), StatusCode::kInvalidArgument) << bad.offset;
  }
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
  EXPECT_TRUE(SegmentReader::Open(name).ok());  // the first is untouched
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
  EXPECT_EQ((*SegmentReader::Open(name))->owner_pid(), child);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  std::unique_ptr<Segment> seg = MakeSegment(name);  // replaces the dead server's segment
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ((*SegmentReader::Open(name))->owner_pid(), ::getpid());
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
  EXPECT_EQ(SegmentReader::Open(name).status().code(), StatusCode::kCorruption);
  ::close(fd);
  ::shm_unlink(name.c_str());
}

}  // namespace
}  // namespace carpool::cache
