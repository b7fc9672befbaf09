"""Running the `carpool` binary from Python: a throwaway server for an experiment or a test, and
the dataset CLI. The binary is $CARPOOL_BIN, else the source tree's build ($CARPOOL_BUILD_DIR,
then build/), else `carpool` on PATH."""

import ctypes
import os
import pathlib
import shutil
import signal
import subprocess
import time

from . import _ffi
from ._ffi import CarpoolError


def binary():
    """The path of the `carpool` executable; raises CarpoolError naming where it looked."""
    env = os.environ.get("CARPOOL_BIN")
    if env:
        return env
    tried = []
    dirs = [os.environ["CARPOOL_BUILD_DIR"]] if os.environ.get("CARPOOL_BUILD_DIR") else []
    dirs.append(str(_ffi._SOURCE_ROOT / "build"))
    for d in dirs:
        p = pathlib.Path(d) / "tools" / "carpool"
        tried.append(str(p))
        if os.access(p, os.X_OK):
            return str(p)
    on_path = shutil.which("carpool")
    if on_path:
        return on_path
    raise CarpoolError("the carpool binary was not found (looked in: " + ", ".join(tried) +
                       ", PATH); build it with 'cmake --build build --target carpool' or set "
                       "CARPOOL_BIN", 6)


def cli(*args, state_dir=None, check=True):
    """Runs `carpool ARGS... [--state-dir D]` and returns its stdout. A failure raises
    CarpoolError with the command's own error line (stderr)."""
    cmd = [binary(), *map(str, args)]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise CarpoolError(f"'{' '.join(cmd)}' failed ({r.returncode}): {r.stderr.strip()}", 4)
    return r.stdout


def _die_with_parent():
    """In the child: SIGTERM when the parent dies (Linux), so a test or script killed with
    SIGKILL leaves no server behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """`carpool server` as a child process, for the lifetime of a `with` block:

        with carpool.Server(state_dir, cache_size="256MiB") as srv:
            loader = carpool.Loader("fmnist", socket=srv.socket, ...)

    Keyword arguments become flags (cache_size="0" -> --cache-size 0). start() returns once the
    socket answers; stop() sends SIGTERM, then SIGKILL after `grace` seconds. On Linux the server
    also gets SIGTERM if this process dies first."""

    def __init__(self, state_dir, log=None, grace=10.0, **flags):
        self.state_dir = pathlib.Path(state_dir)
        self.socket = str(self.state_dir / "carpool.sock")
        self.flags = flags
        self.log = log
        self.grace = grace
        self.proc = None

    def start(self, timeout=30.0):
        cmd = [binary(), "server", "--state-dir", str(self.state_dir)]
        for k, v in self.flags.items():
            if v is not None:
                cmd += ["--" + k.replace("_", "-"), str(v)]
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        finally:
            if self.log:
                out.close()
        deadline = time.monotonic() + timeout
        lib = _ffi.lib()
        while True:
            if self.proc.poll() is not None:
                tail = ""
                if self.log and os.path.exists(self.log):
                    tail = ": " + open(self.log, errors="replace").read()[-2000:].strip()
                raise CarpoolError(f"'{' '.join(cmd)}' exited with {self.proc.returncode}{tail}", 8)
            handle = ctypes.c_void_p()
            if os.path.exists(self.socket) and \
                    lib.carpool_connect(self.socket.encode(), ctypes.byref(handle)) == 0:
                lib.carpool_client_free(handle)
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise CarpoolError(f"carpool server did not answer on {self.socket} within "
                                   f"{timeout:.0f} s", 8)
            time.sleep(0.05)

    def stop(self):
        """Stops the server; returns its exit code (None if it was not running)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
