// Names the calling thread as `top -H`, `ps -L` and /proc/PID/task/TID/comm show it, so that
// profiles (python -m bench.gpu_probe) can tell the server's workers, coordinator and io apart.
// Cost: one syscall. Linux keeps 15 characters; longer names are cut.
#ifndef CARPOOL_SERVER_THREAD_NAME_H_
#define CARPOOL_SERVER_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace carpool {

inline void NameThisThread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());  // best effort
}

}  // namespace carpool

#endif  // CARPOOL_SERVER_THREAD_NAME_H_
