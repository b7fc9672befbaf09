#include "protocol/segment_fd.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace carpool::protocol {
namespace {

struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.Reset(fds[0]);
    b.Reset(fds[1]);
  }
};

UniqueFd Memfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("carpool-segment-fd-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  return fd;
}

ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

TEST(SegmentFdTest, OnlyJobInfoAndDecodeSegmentCarryAnFd) {
  for (uint16_t t = kMinMessageType; t <= kMaxMessageType; ++t) {
    const auto type = static_cast<MessageType>(t);
    const bool carries = type == MessageType::kJobInfo || type == MessageType::kDecodeSegment;
    EXPECT_EQ(CarriesFd(type), carries) << MessageTypeName(type);
    EXPECT_TRUE(CheckFrameFds(type, carries ? 1 : 0).ok()) << MessageTypeName(type);
    EXPECT_EQ(CheckFrameFds(type, carries ? 0 : 1).code(), StatusCode::kCorruption)
        << MessageTypeName(type);
  }
  EXPECT_TRUE(CheckFrameFds(MessageType::kJobInfo, 1).ok());
  EXPECT_TRUE(CheckFrameFds(MessageType::kBatchReady, 0).ok());
  Status missing = CheckFrameFds(MessageType::kJobInfo, 0);
  EXPECT_EQ(missing.code(), StatusCode::kCorruption);
  EXPECT_NE(missing.message().find("without its batch segment"), std::string::npos)
      << missing.message();
  EXPECT_EQ(CheckFrameFds(MessageType::kBatchReady, 1).code(), StatusCode::kCorruption);
  EXPECT_EQ(CheckFrameFds(MessageType::kJobInfo, 2).code(), StatusCode::kCorruption);
}

// A decode-segment frame carries the memfd its decode work's JPEGs lie in; without it the message
// names that segment, not the batch segment.
TEST(SegmentFdTest, DecodeSegmentCarriesItsSegment) {
  EXPECT_TRUE(CarriesFd(MessageType::kDecodeSegment));
  EXPECT_FALSE(CarriesFd(MessageType::kDecodeWork));
  EXPECT_FALSE(CarriesFd(MessageType::kDecodeDone));
  EXPECT_TRUE(CheckFrameFds(MessageType::kDecodeSegment, 1).ok());
  EXPECT_TRUE(CheckFrameFds(MessageType::kDecodeWork, 0).ok());
  EXPECT_TRUE(CheckFrameFds(MessageType::kDecodeDone, 0).ok());
  Status missing = CheckFrameFds(MessageType::kDecodeSegment, 0);
  EXPECT_EQ(missing.code(), StatusCode::kCorruption);
  EXPECT_NE(missing.message().find("the decode-segment frame came without its decode segment"),
            std::string::npos)
      << missing.message();
  EXPECT_EQ(CheckFrameFds(MessageType::kDecodeSegment, 2).code(), StatusCode::kCorruption);
  EXPECT_EQ(CheckFrameFds(MessageType::kDecodeWork, 1).code(), StatusCode::kCorruption);
  EXPECT_EQ(CheckFrameFds(MessageType::kDecodeDone, 1).code(), StatusCode::kCorruption);
}

// The fd arrives with the first byte, not with the bytes after it, and names the sender's file.
TEST(SegmentFdTest, TheFdArrivesWithTheFirstByteOfTheFrame) {
  SocketPair s;
  UniqueFd segment = Memfd(4096);
  const char before[] = "abc", frame[] = "frame", after[] = "xyz";
  ASSERT_EQ(::send(s.a.get(), before, 3, 0), 3);
  const int fd = segment.get();
  ASSERT_EQ(SendWithFds(s.a.get(), frame, 5, {&fd, 1}), 5);
  ASSERT_EQ(::send(s.a.get(), after, 3, 0), 3);

  std::vector<UniqueFd> fds;
  char buf[8];
  ASSERT_EQ(RecvWithFds(s.b.get(), buf, 3, fds), 3);
  EXPECT_TRUE(fds.empty()) << "the bytes before the frame carry nothing";
  ASSERT_EQ(RecvWithFds(s.b.get(), buf, 5, fds), 5);
  EXPECT_EQ(std::memcmp(buf, frame, 5), 0);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(Inode(fds[0].get()), Inode(segment.get()));
  EXPECT_NE(fds[0].get(), segment.get()) << "the receiver gets its own descriptor";
  ASSERT_EQ(RecvWithFds(s.b.get(), buf, 8, fds), 3);
  EXPECT_EQ(fds.size(), 1u) << "the bytes after the frame carry nothing";
}

// Why every read on the client goes through RecvWithFds: a plain recv drops the descriptor.
TEST(SegmentFdTest, APlainRecvDropsTheFd) {
  SocketPair s;
  UniqueFd segment = Memfd(4096);
  const int fd = segment.get();
  ASSERT_EQ(SendWithFds(s.a.get(), "x", 1, {&fd, 1}), 1);
  ASSERT_EQ(::send(s.a.get(), "y", 1, 0), 1);
  char c;
  ASSERT_EQ(::recv(s.b.get(), &c, 1, 0), 1);
  std::vector<UniqueFd> fds;
  ASSERT_EQ(RecvWithFds(s.b.get(), &c, 1, fds), 1);
  EXPECT_TRUE(fds.empty());
}

TEST(SegmentFdTest, TooManyFdsAreAnErrorNotATruncation) {
  SocketPair s;
  std::vector<UniqueFd> many;
  for (int i = 0; i < 6; ++i) many.push_back(Memfd(64));
  int raw[6];
  for (int i = 0; i < 6; ++i) raw[i] = many[i].get();
  ASSERT_EQ(SendWithFds(s.a.get(), "z", 1, raw), 1);
  std::vector<UniqueFd> fds;
  char b;
  EXPECT_EQ(RecvWithFds(s.b.get(), &b, 1, fds), -1);
  EXPECT_EQ(errno, EBADMSG);
}

TEST(SegmentFdTest, MappingsOfOneSegmentShareBytesAndCheckItsSize) {
  UniqueFd segment = Memfd(8192);
  auto writer = SharedMapping::Map(segment.get(), 8192, "a test segment");
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  auto reader = SharedMapping::Map(segment.get(), 4096, "a test segment");
  ASSERT_TRUE(reader.ok());
  segment.Reset();  // the mappings outlive the fd
  (*writer)->data()[100] = 42;
  EXPECT_EQ((*reader)->data()[100], 42);

  UniqueFd small = Memfd(4096);
  Status too_small = SharedMapping::Map(small.get(), 8192, "a small segment").status();
  EXPECT_EQ(too_small.code(), StatusCode::kCorruption);
  EXPECT_NE(too_small.message().find("a small segment is 4096 bytes, expected at least 8192"),
            std::string::npos)
      << too_small.message();
}

}  // namespace
}  // namespace carpool::protocol
