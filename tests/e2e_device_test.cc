// Issue 9, the device checks that run on every machine: a job asking for a GPU the server does not
// serve gets a clear error naming the device and the fix, the server refuses --gpus it cannot
// serve, and CPU jobs are unaffected. (The GPU path itself is tested on a GPU machine by
// client/python/tests/test_gpu.py, which skips without one.)
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

void RegisterSmall(E2eEnv& env) {
  env.Dataset({"add", "fm", "--idx", (kFmnist / "train-images-idx3-ubyte.gz").string(),
               (kFmnist / "train-labels-idx1-ubyte.gz").string()});
  env.Dataset({"add", "small", "--from", "fm", "--ids", "1:257"});
}

TEST(E2eDeviceTest, GpuJobOnAServerWithoutGpusIsAClearErrorAndCpuJobsStillRun) {
  E2eEnv env;
  RegisterSmall(env);
  env.StartServer({"--gpus", "none"});
  CliResult gpu = env.Wait(
      env.Consume({"--dataset", "small", "--batch-size", "64", "--device", "cuda:0"}, "gpu"),
      "gpu");
  EXPECT_NE(gpu.code, 0);
  EXPECT_NE(gpu.err.find("device \"cuda:0\" is not served by this server"), std::string::npos)
      << gpu.err;
  EXPECT_NE(gpu.err.find("--gpus"), std::string::npos) << gpu.err;
  CliResult bad = env.Wait(
      env.Consume({"--dataset", "small", "--batch-size", "64", "--device", "gpu0"}, "bad"), "bad");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("\"gpu0\" is not \"cpu\" or \"cuda:N\""), std::string::npos) << bad.err;
  CliResult cpu = env.Wait(
      env.Consume({"--dataset", "small", "--batch-size", "64", "--json"}, "cpu"), "cpu");
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_EQ(JsonNumber(cpu.out, "samples"), 256) << cpu.out;
  // Refused jobs leave nothing behind.
  const std::string s = env.Status();
  EXPECT_EQ(JsonNumber(s, "jobs_created"), 1) << s;
  EXPECT_NE(s.find("\"gpus\":[]"), std::string::npos) << s;
  env.StopServer(SIGTERM);
}

TEST(E2eDeviceTest, ServerRefusesGpusItCannotServe) {
  E2eEnv env;
  CliResult bad_list = env.Run({"server", "--state-dir", env.state().string(), "--gpus", "x,0"},
                               "bad-list");
  EXPECT_NE(bad_list.code, 0);
  EXPECT_NE(bad_list.err.find("\"x\" is not a device index"), std::string::npos) << bad_list.err;
  CliResult twice = env.Run({"server", "--state-dir", env.state().string(), "--gpus", "0,0"},
                            "twice");
  EXPECT_NE(twice.code, 0);
  // Device 64 exists on no machine: the error names it and the count.
  CliResult missing = env.Run({"server", "--state-dir", env.state().string(), "--gpus", "64"},
                              "missing");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("CUDA device 64 does not exist"), std::string::npos) << missing.err;
  CliResult size = env.Run(
      {"server", "--state-dir", env.state().string(), "--gpu-cache-size", "lots"}, "size");
  EXPECT_NE(size.code, 0);
  EXPECT_NE(size.err.find("--gpu-cache-size"), std::string::npos) << size.err;
}

}  // namespace
}  // namespace carpool::e2e
