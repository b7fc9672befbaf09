#!/usr/bin/python3
"""CI check of `carpool status --watch SECONDS --json-lines FILE` against a real server
(ctest: carpool_status_series_test):
  1. bad values exit 2 naming the value; no server at the socket exits 1;
  2. a series recorded while a `carpool consume` job runs: one JSON object per line, timestamps
     increasing, the job listed in some records and gone from the later ones, deliveries growing;
     SIGINT ends it with exit 0;
  3. the server stopped under a recorder: it exits 0 saying the server went away.
Exit 0 when all hold, 1 otherwise."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "client" / "python"))

import carpool  # noqa: E402
from check_runner import check, run  # noqa: E402 (this folder)

FMNIST = pathlib.Path(os.environ.get("CARPOOL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))


def status(*args):
    return subprocess.run([carpool.binary(), "status", *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=30)


def check_errors(tmp):
    out = tmp / "never.jsonl"
    for args, needle in ((["--watch", "abc"], '--watch "abc"'), (["--watch", "0"], '"0"'),
                         (["--watch", "-2"], '"-2"'), ([], "add --watch SECONDS")):
        r = status(*args, "--json-lines", out, "--socket", tmp / "none.sock")
        check(r.returncode == 2 and needle in r.stderr, f"{args}: exit 2 naming {needle!r}, got "
              f"{r.returncode}: {r.stderr!r}")
    r = status("--watch", "0.1", "--json-lines", out, "--socket", tmp / "none.sock")
    check(r.returncode == 1 and "none.sock" in r.stderr, f"no server: exit 1, got {r.returncode}:"
          f" {r.stderr!r}")


def read_series(path):
    lines = path.read_text().splitlines()
    check(len(lines) >= 3, f"at least 3 records, got {len(lines)}")
    return [json.loads(ln) for ln in lines]


def check_series(records, job):
    elapsed = [r["elapsed_s"] for r in records]
    check(all(b > a for a, b in zip(elapsed, elapsed[1:])), f"elapsed_s increases: {elapsed}")
    times = [r["time"] for r in records]
    check(all(b >= a for a, b in zip(times, times[1:])), f"time does not go back: {times}")
    check(abs(times[0] - time.time()) < 600, f"time is Unix seconds: {times[0]}")
    listed = [any(j["id"] == job for j in r["status"]["jobs"]) for r in records]
    first = listed.index(True) if True in listed else None
    check(first is not None, f"job {job} appears in the series")
    check(not listed[-1] and True not in listed[listed.index(False, first):],
          f"job {job} vanishes and stays gone: {listed}")
    deliveries = [r["status"]["deliveries"] for r in records]
    check(deliveries == sorted(deliveries) and deliveries[-1] >= 10000,
          f"server deliveries grow to the job's 10,000: {deliveries}")


def record_with_job(tmp, server):
    series = tmp / "series.jsonl"
    rec = subprocess.Popen([carpool.binary(), "status", "--watch", "0.1", "--json-lines", series,
                            "--socket", server.socket], stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # a few records before the job
    consume = subprocess.run([carpool.binary(), "consume", "--dataset", "fm", "--batch-size",
                              "100", "--epochs", "1", "--step-ms", "10", "--json", "--socket",
                              server.socket], stdout=subprocess.PIPE, text=True, timeout=120,
                             check=True)
    job = json.loads(consume.stdout)["job"]
    # The job leaves the server's list once its close is handled (a loaded CI machine can take
    # longer than any fixed sleep), then a few more records without it.
    deadline = time.monotonic() + 30
    while any(j["id"] == job for j in carpool.server_stats(socket=server.socket)["jobs"]):
        check(time.monotonic() < deadline, f"job {job} still listed 30 s after it ended")
        time.sleep(0.1)
    time.sleep(0.5)
    rec.send_signal(signal.SIGINT)
    _, err = rec.communicate(timeout=10)
    check(rec.returncode == 0 and "stopped by signal" in err,
          f"SIGINT: exit 0, got {rec.returncode}: {err!r}")
    records = read_series(series)
    check_series(records, job)
    print(f"recorded {len(records)} records; job {job} seen then gone", flush=True)
    return series


def record_until_server_stops(tmp, server):
    series = tmp / "until-stop.jsonl"
    rec = subprocess.Popen([carpool.binary(), "status", "--watch", "0.1", "--json-lines", series,
                            "--socket", server.socket], stderr=subprocess.PIPE, text=True)
    # Three records before the stop, however slow the recorder (0.5 s gave 2 under TSan).
    deadline = time.monotonic() + 30
    while not series.exists() or len(series.read_text().splitlines()) < 3:
        check(time.monotonic() < deadline and rec.poll() is None,
              f"the recorder wrote 3 records within 30 s (exit {rec.poll()})")
        time.sleep(0.1)
    server.stop()
    _, err = rec.communicate(timeout=10)
    check(rec.returncode == 0 and err.count("went away") == 1,
          f"server stopped: exit 0 with one message, got {rec.returncode}: {err!r}")
    read_series(series)


def main():
    with tempfile.TemporaryDirectory(prefix="carpool-series-") as name:
        tmp = pathlib.Path(name)
        check_errors(tmp)
        carpool.cli("dataset", "add", "fm", "--idx", FMNIST / "t10k-images-idx3-ubyte.gz",
                    FMNIST / "t10k-labels-idx1-ubyte.gz", "--quiet", state_dir=tmp)
        with carpool.Server(tmp, log=str(tmp / "server.log"), cache_size="16MiB", workers=2,
                            lease="1s") as server:
            record_with_job(tmp, server)
            record_until_server_stops(tmp, server)
    print("status series check: passed")
    return 0


if __name__ == "__main__":
    run(main, "status series check")
