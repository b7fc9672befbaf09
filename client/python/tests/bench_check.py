#!/usr/bin/python3
"""CI check of the bench/ package (ctest: carpool_bench_test), run as the shell wrappers run it:
`python -m bench.X` with the repository root and client/python on PYTHONPATH, from another
folder:
  1. every entry point answers --help (its imports, no circular ones, resolve);
  2. none of bench/ and examples/ edits sys.path, and no .py file of bench/, examples/ and
     client/python is over 700 lines (issue 22);
  3. `python -m bench.gpu --smoke --scenarios n1`: the whole GPU benchmark's orchestration on the
     CPU (spawned jobs import bench.gpu's modules by name), a carpool and a DataLoader side;
     its pacing counters and --status-series; and `--mps` without a GPU refused with its reason;
  4. bench.gpu.mps tells a running MPS daemon from none (a fake /proc);
  5. bench.stagger_floor on a coarse grid gives the values checked by hand (in step, the
     overcharged model is the sync schedule's 0.5 and the lower bound is under it).
Exit 0 when all hold, 1 otherwise, 77 (skipped) when torch or torchvision is missing."""

import json
import pathlib
import re
import subprocess
import sys
import tempfile

from check_runner import ROOT, check, missing, run, source_env  # this folder

ENTRY_POINTS = ["gpu", "peers", "ddp_gpu", "gpu_probe", "accuracy_fidelity", "fmnist_train",
                "check_wds_carpool", "sweep_demo", "torchvision_jobs"]
MAX_LINES = 700


def python(tmp, *args, timeout=60):
    return subprocess.run([sys.executable, *args], cwd=tmp, env=source_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def bench(tmp, *args, timeout=60):
    return python(tmp, "-m", *args, timeout=timeout)


def check_sources():
    for folder in ("bench", "examples", "client/python"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            text = f.read_text()
            lines = text.count("\n")
            check(lines <= MAX_LINES, f"{f.relative_to(ROOT)}: {lines} lines, over {MAX_LINES}")
            if folder != "client/python":
                check(not re.search(r"\bsys\.path\b", text),
                      f"{f.relative_to(ROOT)} edits sys.path; rely on PYTHONPATH instead")


def check_mps_daemon(tmp):
    """bench.gpu.mps finds the MPS control daemon by its command line, zombies aside: the
    kernel's 15-character process name ("nvidia-cuda-mps") never matches `pgrep -x`."""
    proc = pathlib.Path(tmp) / "proc"
    procs = {"12": (b"/usr/bin/nvidia-cuda-mps-control\0-d\0", "S"),
             "13": (b"nvidia-cuda-mps-control\0-d\0", "Z"),
             "14": (b"python3\0-m\0bench.gpu\0", "R")}
    for pid, (cmdline, state) in procs.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(cmdline)
        (proc / pid / "stat").write_text(f"{pid} (nvidia-cuda-mps) {state} 1 1 1 0 -1\n")
    (proc / "self").mkdir()
    probe = ("import sys; from bench.gpu.mps import daemon_alive; "
             "print(daemon_alive(sys.argv[1]))")
    r = python(tmp, "-c", probe, str(proc))
    check(r.stdout.strip() == "True", f"a running daemon is found: {r.stdout[-300:]}")
    for f in (proc / "12").iterdir():
        f.unlink()
    (proc / "12").rmdir()
    r = python(tmp, "-c", probe, str(proc))
    check(r.stdout.strip() == "False", f"a zombie daemon is not running: {r.stdout[-300:]}")
    print("bench.gpu.mps: the daemon found by its command line, a zombie not", flush=True)


def check_stagger_floor(tmp):
    """The LP at k = 1 (10 segments an epoch, seconds) against the values recorded in session 41
    (docs/benchmarks.md, "The floor with the cache's capacity"): in step, the overcharged model is the sync schedule exactly (0.5: each pair of
    takes fills the cache for its segment) and the lower bound is under it (0.44: holds across the
    epoch boundary cost less); with a lag of 0.6 N, 0.5575. A capacity or independence row lost,
    or a hold charged for a segment it does not span, moves one of them."""
    try:
        import scipy  # noqa: F401  (bench.stagger_floor's LP)
    except ImportError:
        print("bench.stagger_floor: not checked, no SciPy (scripts/setup.sh installs "
              "python3-scipy)")
        return

    def floor(*args):
        r = bench(tmp, "bench.stagger_floor", "--k", "1", *args, timeout=120)
        check(r.returncode == 0, f"bench.stagger_floor {args}: exit {r.returncode}: {r.stdout}")
        value = re.search(r"(?:>=|overcharged:) ([0-9.]+)", r.stdout)
        check(value, f"bench.stagger_floor {args} printed no bound: {r.stdout}")
        return float(value.group(1))
    for args, expected in ((("--lead", "0"), 0.44), (("--lead", "0", "--charge", "all"), 0.5),
                           (("--lead", "0.6"), 0.5575)):
        got = floor(*args)
        check(abs(got - expected) < 1e-3, f"bench.stagger_floor --k 1 {' '.join(args)}: {got}, "
              f"expected {expected}")
    print("bench.stagger_floor: in step 0.44 (overcharged 0.5), lag 0.6 N 0.5575", flush=True)


def main():
    skip = missing(["torch", "torchvision"], "python3-torch and python3-torchvision")
    if skip:
        return skip
    check_sources()
    print("bench/, examples/: no sys.path edits; every .py file at most 700 lines", flush=True)
    with tempfile.TemporaryDirectory(prefix="carpool-bench-check-") as tmp:
        for name in ENTRY_POINTS:
            r = bench(tmp, f"bench.{name}", "--help")
            check(r.returncode == 0 and "usage:" in r.stdout,
                  f"python -m bench.{name} --help: exit {r.returncode}: {r.stdout[-1500:]}")
        print(f"{len(ENTRY_POINTS)} entry points answer --help", flush=True)
        check_mps_daemon(tmp)
        check_stagger_floor(tmp)
        out = pathlib.Path(tmp) / "smoke.json"
        series = pathlib.Path(tmp) / "series"
        r = bench(tmp, "bench.gpu", "--smoke", "--scenarios", "n1", "--max-seconds", "20",
                  "--data-dir", str(pathlib.Path(tmp) / "jpeg"), "--json-out", str(out),
                  "--status-series", str(series), timeout=400)
        print(r.stdout[-1200:], flush=True)
        check(r.returncode == 0, f"python -m bench.gpu --smoke exited {r.returncode}")
        report = json.loads(out.read_text())
        n1 = report["scenarios"]["n1"]
        check(n1["baseline"].get("images", 0) > 0, "the DataLoader side trained on images")
        check(n1["carpool"].get("images", 0) > 0, "the carpool side trained on images")
        check("holds" in n1["carpool"].get("pacing", {}), "the carpool side's pacing counters")
        lines = (series / "status-n1.jsonl").read_text().splitlines() \
            if (series / "status-n1.jsonl").exists() else []
        check(lines and "pacing" in json.loads(lines[0])["status"],
              f"--status-series wrote the n1 server's status: {sorted(series.glob('*'))}")
        r = bench(tmp, "bench.gpu", "--smoke", "--mps", "--scenarios", "n1")
        check(r.returncode != 0 and "--mps needs a CUDA device" in r.stdout,
              f"--mps without a GPU is refused with a reason: {r.stdout[-300:]}")
    print("bench check: passed")
    return 0


if __name__ == "__main__":
    run(main, "bench check")
