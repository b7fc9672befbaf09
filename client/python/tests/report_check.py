#!/usr/bin/python3
"""CI check of `carpool report` (ctest: carpool_report_test) on a fixture series written here: two
jobs at known rates (400 and 1000 samples/s), the second leaving halfway, and a partial last line
as a killed recorder leaves. Checks the rates it derives, that `carpool report` (the CLI, which
runs carpool.report) writes a PNG of non-trivial size, and its errors. Exit 0 when all hold, 1
otherwise, 77 (skipped) when matplotlib is not importable."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "client" / "python"))

import carpool  # noqa: E402
from check_runner import check, missing, run  # noqa: E402 (this folder)
from carpool import report  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RATES = {1: 400.0, 2: 1000.0}  # samples/s of the fixture's jobs


def fixture_series(path):
    """20 records 0.5 s apart; job 2 leaves after record 10. Ends with a partial line."""
    lines = []
    for i in range(20):
        t = 0.5 * i
        jobs = [{"id": 1, "dataset": "fm", "deliveries": int(RATES[1] * t)}]
        if i < 10:
            jobs.append({"id": 2, "dataset": "fm-small", "deliveries": int(RATES[2] * t)})
        delivered = sum(j["deliveries"] for j in jobs) + (int(RATES[2] * 4.5) if i >= 10 else 0)
        lines.append(json.dumps({"time": 1.79e9 + t, "elapsed_s": t, "status": {
            "jobs": jobs, "deliveries": delivered, "preparations": int(delivered / 1.25),
            "sharing_ratio": 1.25}}))
    path.write_text("\n".join(lines) + '\n{"time": 1.79e9, "elap')
    return len(lines)


def check_rates(path, count):
    records = report.load(str(path))
    check(len(records) == count, f"{count} records read, the partial line dropped: {len(records)}")
    rates = report.job_rates(records)
    check(sorted(rates) == ["job 1 (fm)", "job 2 (fm-small)"], f"both jobs: {sorted(rates)}")
    for job, label in ((1, "job 1 (fm)"), (2, "job 2 (fm-small)")):
        times, values = rates[label]
        check(all(abs(v - RATES[job]) < 1e-6 for v in values),
              f"{label} at {RATES[job]}/s: {values}")
        check(len(times) == (19 if job == 1 else 9), f"{label}: a rate per pair of records")


def run_cli(*args):
    return subprocess.run([carpool.binary(), "report", *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def main():
    skip = missing(["matplotlib"], "python3-matplotlib (scripts/setup.sh)")
    if skip:
        return skip
    with tempfile.TemporaryDirectory(prefix="carpool-report-") as name:
        tmp = pathlib.Path(name)
        series = tmp / "series.jsonl"
        check_rates(series, fixture_series(series))
        r = run_cli(series)  # default --out: series.png beside it
        png = tmp / "series.png"
        check(r.returncode == 0, f"carpool report exit 0: {r.returncode} {r.stderr}")
        check("20 records" in r.stdout and "sharing ratio 1.25" in r.stdout, f"summary: {r.stdout}")
        data = png.read_bytes()
        check(data.startswith(PNG_MAGIC) and len(data) > 20000,
              f"a PNG of non-trivial size: {len(data)} bytes, starts {data[:8]!r}")
        print(f"carpool report wrote {len(data)} bytes", flush=True)
        r = run_cli(tmp / "missing.jsonl")
        check(r.returncode == 1 and "missing.jsonl" in r.stderr, f"missing file: {r.stderr!r}")
        bad = tmp / "bad.jsonl"
        bad.write_text('{"time": 1}\n{"time": 2}\n')
        r = run_cli(bad)
        check(r.returncode == 1 and "bad.jsonl:1" in r.stderr, f"bad record named: {r.stderr!r}")
        r = run_cli(series, "--out", tmp / "no" / "such" / "dir.png")
        check(r.returncode == 1 and "dir.png" in r.stderr, f"unwritable --out: {r.stderr!r}")
    print("report check: passed")
    return 0


if __name__ == "__main__":
    run(main, "report check")
