"""carpool.Server: a `carpool server` child that neither outlives its owner nor dies with the
wrong thread, and that leaves nothing running when it cannot start."""

import gc
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import carpool
from carpool import _ffi, server as server_module

FLAGS = dict(cache_size="16MiB", workers=1, lease="1s")


def children_on(state_dir):
    """pids of this process's children whose command line names `state_dir`."""
    pids = []
    for task in pathlib.Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    found = []
    for pid in pids:
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(state_dir).encode() in cmdline:
            found.append(pid)
    return found


def running(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@unittest.skipUnless(os.path.isdir("/proc/self/task"), "needs Linux /proc")
class ServerLifetimeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="carpool-srvtest-")
        self.addCleanup(self.tmp.cleanup)
        self.state = pathlib.Path(self.tmp.name)

    def test_a_library_that_fails_to_load_leaves_no_server_behind(self):
        srv = carpool.Server(self.state, **FLAGS)
        self.addCleanup(srv.stop)
        real = _ffi.lib

        def broken():
            raise carpool.CarpoolError("libcarpool.so not found (test)", 6)

        _ffi.lib = broken
        try:
            with self.assertRaises(carpool.CarpoolError):
                srv.start()
        finally:
            _ffi.lib = real
        self.assertEqual(children_on(self.state), [], "a server was left running")

    def test_a_server_started_from_a_worker_thread_outlives_the_thread(self):
        srv = carpool.Server(self.state, **FLAGS)
        self.addCleanup(srv.stop)
        errors = []

        def start():
            try:
                srv.start()
            except Exception as e:  # surfaced below
                errors.append(e)

        t = threading.Thread(target=start)
        t.start()
        t.join(60)
        self.assertEqual(errors, [])
        time.sleep(1.0)  # a death signal tied to the thread arrives at once; shutdown takes ms
        self.assertIsNone(srv.proc.poll(), "the server ended with the thread that started it")
        self.assertEqual(carpool.server_stats(socket=srv.socket)["jobs"], [])
        self.assertEqual(srv.stop(), 0)

    def test_a_server_object_dropped_without_stop_stops_its_server(self):
        srv = carpool.Server(self.state, **FLAGS).start()
        proc = srv.proc
        try:
            del srv
            gc.collect()
            self.assertEqual(proc.wait(15), 0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def test_a_killed_owner_takes_its_server_along(self):
        if not server_module._death_signal_prefix():
            self.skipTest("setpriv --pdeathsig is not available")
        env = dict(os.environ)
        pkg = os.path.dirname(os.path.dirname(carpool.__file__))
        env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
        script = ("import sys, time, carpool\n"
                  "srv = carpool.Server(sys.argv[1], cache_size='16MiB', workers=1).start()\n"
                  "print(srv.proc.pid, flush=True)\n"
                  "time.sleep(120)\n")
        owner = subprocess.Popen([sys.executable, "-c", script, str(self.state)], env=env,
                                 stdout=subprocess.PIPE, text=True)
        server_pid = None
        try:
            server_pid = int(owner.stdout.readline())
            self.assertTrue(running(server_pid))
            owner.kill()
            owner.wait(10)
            deadline = time.monotonic() + 15
            while running(server_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertFalse(running(server_pid), "the server outlived its killed owner")
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait()
            if server_pid is not None and running(server_pid):
                os.kill(server_pid, signal.SIGKILL)


if __name__ == "__main__":
    unittest.main()
