// The job's side of GPU decode in its own process (server/job_decode.h says why): a thread that
// takes the server's decode work, decodes it with libcarpool_job_decode.so (loaded with dlopen,
// so libcarpool itself needs no CUDA or nvJPEG) into a device buffer it exports, and answers.
// Thread-safe: Post from the reader thread, the destructor from the Job's.
#ifndef CARPOOL_CLIENT_JOB_DECODE_H_
#define CARPOOL_CLIENT_JOB_DECODE_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "carpool/status.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"
#include "protocol/segment_fd.h"

namespace carpool {

class FrameSocket;

// Whether this process offers to decode for the server (CreateJob::decode_in_job): the library
// is found and $CARPOOL_JOB_DECODE is not "0". Loads nothing; a stat or two.
bool JobDecodeOffered();

class JobDecodeWorker {
 public:
  // Decodes on CUDA device `device` of this process, answering on `socket`. Starts its thread.
  JobDecodeWorker(int device, uint64_t job_id, FrameSocket* socket);
  ~JobDecodeWorker();  // stops the thread; frees the decoder and its buffer
  JobDecodeWorker(const JobDecodeWorker&) = delete;
  JobDecodeWorker& operator=(const JobDecodeWorker&) = delete;

  // A decode segment (with its fd) or decode work from the server. O(1).
  void Post(protocol::Message message, UniqueFd fd);

 private:
  struct Library;
  struct Item {
    protocol::Message message;
    UniqueFd fd;
  };
  void Run();
  // Answers one work; a failure is sent as the answer's status.
  protocol::DecodeDone Decode(const protocol::DecodeWork& work);

  const int device_;
  const uint64_t job_id_;
  FrameSocket* socket_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  // The decode thread's own.
  std::unique_ptr<protocol::SharedMapping> segment_;
  bool segment_registered_ = false;  // page-locked by the decoder (or tried and failed)
  void* decoder_ = nullptr;
  Status load_failure_;
  std::thread thread_;
};

}  // namespace carpool

#endif  // CARPOOL_CLIENT_JOB_DECODE_H_
