"""Running the `carpool` binary from Python: a throwaway server for an experiment or a test, and
the dataset CLI. The binary is $CARPOOL_BIN, else the one inside the package (the platform wheel,
scripts/wheel.sh), else the source tree's build ($CARPOOL_BUILD_DIR, then build/), else `carpool`
on PATH."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, List, Optional, Union

from . import _args, _ffi
from ._ffi import CarpoolError


def bundled_binary() -> Optional[str]:
    """The `carpool` executable inside the package (a platform wheel's), or None."""
    p = _ffi._HERE / "bin" / "carpool"
    return str(p) if os.access(p, os.X_OK) else None


def binary() -> str:
    """The path of the `carpool` executable; raises CarpoolError naming where it looked."""
    env = os.environ.get("CARPOOL_BIN")
    if env:
        return env
    tried = []
    own = bundled_binary()
    if own is not None:
        return own
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


def _argv(args: Any) -> List[str]:
    """Command-line words: str, os.PathLike and numbers; anything else is a TypeError (a list or
    None str()-ed into one word is never what was meant)."""
    out = []
    for i, a in enumerate(args):
        if isinstance(a, os.PathLike):
            a = os.fspath(a)
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise TypeError(f"cli argument {i} is {a!r} ({type(a).__name__}); pass each word as "
                            "a str, a path or a number")
        out.append(_args.text(f"cli argument {i}", str(a)))
    return out


def cli(*args: Any, state_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
        check: bool = True) -> str:
    """Runs `carpool ARGS... [--state-dir D]` and returns its stdout. A failure raises
    CarpoolError with the command's own error line (stderr)."""
    words = _argv(args)
    state_dir = _args.optional_path("state_dir", state_dir)
    cmd = [binary(), *words]
    if state_dir is not None:
        cmd += ["--state-dir", state_dir]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise CarpoolError(f"'{' '.join(cmd)}' failed ({r.returncode}): {r.stderr.strip()}", 4)
    return r.stdout


_SETPRIV: List[List[str]] = []  # [] until looked up, then [argv prefix] (empty when unavailable)


def _death_signal_prefix() -> List[str]:
    """argv that makes the command get SIGTERM when this process dies: util-linux's
    `setpriv --pdeathsig TERM --` (Linux, util-linux >= 2.33), or [] where that does not work.
    setpriv sets PR_SET_PDEATHSIG in the child itself and then execs the server, so no Python code
    runs between fork and exec (subprocess's preexec_fn is not safe in a process with threads)."""
    if not _SETPRIV:
        prefix: List[str] = []
        setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
        if setpriv:
            try:
                ok = subprocess.run([setpriv, "--pdeathsig", "TERM", "--", "true"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=10).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                prefix = [setpriv, "--pdeathsig", "TERM", "--"]
        _SETPRIV.append(prefix)
    return list(_SETPRIV[0])


def _stop_process(proc: "subprocess.Popen[bytes]", grace: float) -> Optional[int]:
    """SIGTERM, then SIGKILL after `grace` seconds; the exit code. Also the Server's finalizer,
    so it must not refer to the Server."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Server:
    """`carpool server` as a child process, for the lifetime of a `with` block:

        with carpool.Server(state_dir, cache_size="256MiB") as srv:
            loader = carpool.Loader("fmnist", socket=srv.socket, ...)

    Keyword arguments become flags (cache_size="0" -> --cache-size 0). start() returns once the
    socket answers; stop() sends SIGTERM, then SIGKILL after `grace` seconds. A server not stopped
    is stopped the same way when the Server object is garbage-collected or the interpreter exits
    (a weakref finalizer). If this process is killed (SIGKILL), the server gets SIGTERM only where
    start() ran on the main thread, on Linux with util-linux's setpriv: the kernel sends that
    signal when the *thread* that started the child ends, so from another thread it would stop
    the server as soon as that thread returned, and it is not asked for there."""

    def __init__(self, state_dir: Union[str, "os.PathLike[str]"],
                 log: Optional[Union[str, "os.PathLike[str]"]] = None, grace: float = 10.0,
                 **flags: Any) -> None:
        self.state_dir = pathlib.Path(_args.path("state_dir", state_dir))
        log = _args.optional_path("log", log)
        grace = _args.number("grace", grace, positive=False)
        if grace < 0:
            raise ValueError(f"grace must be >= 0 seconds, got {grace}; pass e.g. grace=10")
        for k, v in flags.items():  # each becomes --k v: one word, so no lists or dicts
            if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
                raise TypeError(f"server flag {k}={v!r} ({type(v).__name__}) is not one word; "
                                f"pass a str or a number, e.g. {k}=\"...\"")
        self.socket = str(self.state_dir / "carpool.sock")
        self.flags = flags
        self.log = log
        self.grace = grace
        self.proc: "Optional[subprocess.Popen[bytes]]" = None
        self._finalizer: "Optional[weakref.finalize[[subprocess.Popen[bytes], float], Server]]" = \
            None

    def start(self, timeout: float = 30.0) -> "Server":
        timeout = _args.number("timeout", timeout)
        if self.proc is not None:
            if self.proc.poll() is None:
                raise CarpoolError(f"carpool server on {self.socket} is already running", 6)
            self.stop()  # it exited by itself: forget it and start anew
        # Everything that can fail before the child exists runs first: nothing is left behind.
        lib = _ffi.lib()
        cmd = [binary(), "server", "--state-dir", str(self.state_dir)]
        for k, v in self.flags.items():
            if v is not None:
                cmd += ["--" + k.replace("_", "-"), str(v)]
        main_thread = threading.current_thread() is threading.main_thread()
        prefix = _death_signal_prefix() if main_thread else []
        out: Any = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(prefix + cmd, stdout=out, stderr=subprocess.STDOUT)
        finally:
            if self.log:
                out.close()
        self._finalizer = weakref.finalize(self, _stop_process, self.proc, self.grace)
        try:
            self._wait_ready(lib, cmd, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, lib: Any, cmd: List[str], timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
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
                return
            if time.monotonic() > deadline:
                raise CarpoolError(f"carpool server did not answer on {self.socket} within "
                                   f"{timeout:.0f} s", 8)
            time.sleep(0.05)

    def stop(self) -> Optional[int]:
        """Stops the server; returns its exit code (None if it was not running)."""
        if self.proc is None:
            return None
        code = _stop_process(self.proc, self.grace)
        if self._finalizer is not None:
            self._finalizer.detach()
        self.proc = self._finalizer = None
        return code

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
