#!/usr/bin/python3
"""CI check of examples/optuna_sweep.py, tiny (ctest: carpool_optuna_sweep_test). Two runs:
  1. 2 trials in 2 processes, to the end: a best trial, the server's sharing ratio, each
     completed epoch exactly once, no job or reference left, the sweep's datasets removed
     afterwards, and (--record) each job of the series, the sharing bound and its replay in
     carpool sim;
  2. 2 trials that a threshold pruner stops after their first epoch: each pruned trial's job is
     gone from the server right after its Loader's with-block, and their epochs exactly once;
  3. 1 trial without the Fashion-MNIST files: synthetic IDX data, said so.
First, the negative controls of the epoch check: it fails an epoch with a repeat, a hole, an
extra sample, a foreign id or a wrong label; and, end to end, a server told to repeat samples
(CARPOOL_INJECT_FAULTS=repeat=…) fails the sweep.
Exit 0 when both hold, 1 otherwise, 77 (skipped) when optuna or torch is not importable."""

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from check_runner import source_env  # this folder

ROOT = pathlib.Path(__file__).resolve().parents[3]
SWEEP = ROOT / "examples" / "optuna_sweep.py"
TINY = ["--trials", "2", "--parallel", "2", "--train-samples", "1200", "--test-samples", "1000",
        "--batch-size", "100"]


def run(*args, env=None):
    r = subprocess.run([sys.executable, str(SWEEP), *TINY, *args], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=500, env=source_env(env))
    print(f"$ optuna_sweep.py {' '.join(TINY + list(args))}\n{r.stdout}", flush=True)
    if r.returncode != 0:
        raise AssertionError(f"optuna_sweep.py exited with {r.returncode}")
    return r.stdout


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    try:
        import optuna  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e}; install python3-optuna and python3-torch (scripts/setup.sh)")
        return 77
    # Negative controls of the sweep's epoch check. The base: ids 10..15 for records 0..5 with
    # labels 0 1 0 1 2 0; the subset of classes 0 and 1 is ids 10 11 12 13 15. A permutation with
    # the right labels passes; a repeat, a hole, an extra sample, a foreign id in a sample's place
    # (same count, no repeat) and a sample with another record's label each fail it.
    controls = subprocess.run(
        [sys.executable, "-c", "import numpy as np; from optuna_sweep import exactly_once as e, "
         "expected_epoch as x; a = np.array; "
         "E = x(a([0, 1, 0, 1, 2, 0, 1]), {'name': 'b', 'ids': [10, 15], 'samples': 6}, [0, 1]); "
         "L = {10: 0, 11: 1, 12: 0, 13: 1, 14: 2, 15: 0, 9: 0}; "
         "f = lambda *bs: e([a(b) for b in bs], [a([L[i] for i in b]) for b in bs], E); "
         "print([f([13, 10], [15, 12, 11]), f([13, 10], [15, 12, 12]), f([13, 10], [15, 12]), "
         "f([13, 10, 14], [15, 12, 11]), f([13, 10], [15, 9, 11]), "
         "e([a([13, 10]), a([15, 12, 11])], [a([1, 0]), a([0, 1, 1])], E), "
         "e([], [], x(a([0]), {'name': 'b', 'ids': [3, 3], 'samples': 1}, [5]))])"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
        env=dict(source_env(), PYTHONPATH=os.pathsep.join([str(ROOT / "examples"),
                                                            source_env()["PYTHONPATH"]])))
    check(controls.stdout.strip().endswith("[True, False, False, False, False, False, True]"),
          f"exactly_once passes a permutation with its labels and fails a repeat, a hole, an "
          f"extra sample, a foreign id and a wrong label: {controls.stdout}")
    with tempfile.TemporaryDirectory(prefix="carpool-optuna-check-") as tmp:
        # 6,000 samples: trials of a second or a few, recorded every 0.2 s (at 1 s an idle
        # machine ran a trial between two records, and the series saw no deliveries).
        out = run("--epochs", "1", "--state-dir", tmp, "--prefix", "ci-sweep-", "--record",
                  str(pathlib.Path(tmp) / "series.jsonl"), "--record-every", "0.2",
                  "--train-samples", "6000")
        check(re.search(r"  job \d+: \S+ \(\d+ classes\) from \d+ s to \d+ s, \d+ deliveries",
                        out), "a trial's job found in the --record series")
        bound = re.search(r"sharing bound, 1 s windows: .* at most (\d+\.\d+)", out)
        check(bound and float(bound.group(1)) >= 1.0, "a sharing bound >= 1")
        replay = re.search(r"replay, carpool's scheduler .* sharing (\d+\.\d+) over (\d+) "
                           r"deliveries; the best eviction on the same deliveries \(Belady\) "
                           r"(\d+\.\d+)", out)
        served = re.search(r"server: (\d+) deliveries", out)
        check(replay and served and 1.0 <= float(replay.group(1)) <= float(replay.group(3)),
              "the replay in carpool sim: a sharing >= 1 and at most Belady's on its deliveries")
        # Every completed epoch of every trial replayed: the server's deliveries less at most a
        # prefetch (batches taken but not trained on) per trial.
        check(served and replay and 0 <= int(served.group(1)) - int(replay.group(2)) <= 2 * 1024,
              f"the replay delivers the trials' epochs: {replay and replay.group(2)} against "
              f"the server's {served and served.group(1)}")
        check("2 trials in" in out and "2 complete" in out, "both trials complete")
        check(re.search(r"best trial: #\d accuracy 0\.\d+ classes \S+ lr \S+", out),
              "a best trial line")
        m = re.search(r"sharing ratio (\d+\.\d+)", out)
        check(m and float(m.group(1)) >= 1.0, "the server's sharing ratio, >= 1")
        check("2 epochs completed; 2 of them held every sample of their dataset exactly once"
              in out, "each completed epoch exactly once")
        check("after the sweep 0 jobs, refcount 0" in out, "no job or reference left")
        check("removed the sweep's" in out, "the sweep removed its datasets")
        left = subprocess.run([sys.executable, str(SWEEP), "--remove", "ci-sweep-",
                               "--state-dir", tmp], stdout=subprocess.PIPE, text=True, check=True,
                              env=source_env())
        check("removed: []" in left.stdout, f"no ci-sweep- dataset left: {left.stdout}")
    out = run("--epochs", "3", "--prune-below", "1.01")
    pruned = [json.loads(ln) for ln in out.splitlines() if ln.startswith('{"trial"')]
    check(len(pruned) == 2 and "2 pruned" in out, "both trials pruned")
    for p in pruned:
        check(p["pruned_after_epoch"] == 0, f"pruned after the first epoch: {p}")
        check(p["job"] not in p["server_jobs_after_close"], f"the pruned job left the server: {p}")
    check("best trial: none completed" in out, "no best trial when all are pruned")
    check("2 epochs completed; 2 of them held every sample" in out and
          "after the sweep 0 jobs, refcount 0" in out, "pruned trials: epochs once, no job left")
    # End to end: a server that delivers a sample twice (an injected sampling fault) must make the
    # sweep report an epoch that is not exactly once and exit non-zero.
    repeat = ",".join(str(i) for i in range(300))  # catalog ids; every class subset holds some
    bad = subprocess.run([sys.executable, str(SWEEP), *TINY, "--trials", "1", "--parallel", "1",
                          "--epochs", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=500,
                         env=source_env(dict(os.environ, CARPOOL_INJECT_FAULTS=f"repeat={repeat}")))
    print(f"$ CARPOOL_INJECT_FAULTS=repeat=0,...,299 optuna_sweep.py (1 trial)\n{bad.stdout}")
    check(bad.returncode != 0 and "1 epochs completed; 0 of them held every sample" in bad.stdout
          and "an epoch was not exactly once" in bad.stdout,
          "a server that repeats samples fails the sweep's exactly-once check")
    with tempfile.TemporaryDirectory(prefix="carpool-optuna-nofm-") as empty:
        out = run("--trials", "1", "--parallel", "1", "--epochs", "1",
                  env=dict(os.environ, CARPOOL_FMNIST_DIR=empty))
    check("using synthetic IDX data" in out and "1 complete" in out, "a synthetic-data sweep")
    print("optuna sweep check: passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"optuna sweep check FAILED: {e}")
        sys.exit(1)
