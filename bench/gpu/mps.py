"""NVIDIA MPS for `python -m bench.gpu --mps`: the control daemon started before the run's first
CUDA process and stopped after its last, so that the server's kernels and the training
processes' run side by side instead of in time slices (docs/gpu.md, "MPS, the operator's
switch"). A daemon already running is used and left running."""

import os
import shutil
import subprocess
import time

CONTROL = "nvidia-cuda-mps-control"


def pipe_dir():
    """Where the daemon's control pipe lives (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps)."""
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


def daemon_alive(proc="/proc"):
    """Whether a live (not zombie) process runs CONTROL. By its command line: the kernel's
    process name stops at 15 characters ("nvidia-cuda-mps"), so `pgrep -x` never matches it."""
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
            with open(os.path.join(proc, pid, "stat")) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if os.path.basename(argv0) == CONTROL and state != "Z":
            return True
    return False


class Mps:
    def __init__(self):
        self.control = shutil.which(CONTROL)
        if self.control is None:
            raise SystemExit(f"bench.gpu: --mps: {CONTROL} is not on PATH; it comes with the "
                             "NVIDIA driver's utilities. Run without --mps, or on a machine that "
                             "has them")
        self.started = False

    def running(self):
        # A daemon that quit may leave its pipe behind: a daemon process must exist too.
        return daemon_alive() and os.path.exists(os.path.join(pipe_dir(), "control"))

    def start(self):
        if self.running():
            print(f"MPS: a control daemon is already running ({pipe_dir()}): using it, and "
                  "leaving it running", flush=True)
            return
        subprocess.run([self.control, "-d"], check=True, timeout=60)
        self.started = True
        print(f"MPS: started '{CONTROL} -d' ({pipe_dir()})", flush=True)

    def stop(self):
        if not self.started:
            return
        subprocess.run([self.control], input="quit\n", text=True, timeout=60, check=False)
        self.started = False
        # quit returns at once; the next run must not find this daemon still going.
        deadline = time.monotonic() + 30
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        print("MPS: stopped the daemon this run started" +
              (" (still exiting after 30 s)" if self.running() else ""), flush=True)
