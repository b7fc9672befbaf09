"""`carpool report FILE [--out PNG]`: one PNG of a series that
`carpool status --watch SECONDS --json-lines FILE` recorded. Top: each job's samples/s over time
(from its delivered count between records, so it shows jobs that have since left). Bottom: the
server's preparations against its deliveries, cumulative, and the sharing ratio at the end.

    python3 -m carpool.report FILE [--out PNG]      # what `carpool report` runs

Needs matplotlib (Debian: python3-matplotlib). docs/python.md, "A sweep summary"."""

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

Record = Dict[str, Any]


class ReportError(Exception):
    """A series that cannot be read or drawn; the message names the file, line and fix."""


def load(path: str) -> List[Record]:
    """The records of a JSON-lines series, checked: each has "time", "elapsed_s", "status"."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ReportError(f"cannot read the series {path!r}: {e.strerror}; record one with "
                          "'carpool status --watch 1 --json-lines FILE'") from None
    records = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            if number == len(lines):  # a recorder killed mid-write leaves a partial last line
                break
            raise ReportError(f"{path}:{number}: not JSON ({e.msg}); the file must be what "
                              "'carpool status --json-lines' wrote") from None
        if not (isinstance(record, dict) and isinstance(record.get("status"), dict)
                and isinstance(record.get("elapsed_s"), (int, float))):
            raise ReportError(f"{path}:{number}: expected an object with \"time\", \"elapsed_s\" "
                              "and \"status\", as 'carpool status --json-lines' writes")
        records.append(record)
    if not records:
        raise ReportError(f"the series {path!r} has no records; record while the server runs "
                          "('carpool status --watch 1 --json-lines FILE')")
    return records


def job_rates(records: List[Record]) -> Dict[str, Tuple[List[float], List[float]]]:
    """Per job ("job ID (dataset)"): times and samples/s, from its deliveries between two records
    that both list it. A job seen in one record only has no rate."""
    rates: Dict[str, Tuple[List[float], List[float]]] = {}
    previous: Dict[Any, Tuple[float, float]] = {}
    for r in records:
        now: Dict[Any, Tuple[float, float]] = {}
        for job in r["status"].get("jobs", []):
            t, delivered = float(r["elapsed_s"]), float(job.get("deliveries", 0))
            now[job.get("id")] = (t, delivered)
            if job.get("id") in previous:
                t0, d0 = previous[job.get("id")]
                label = f"job {job.get('id')} ({job.get('dataset', '?')})"
                times, values = rates.setdefault(label, ([], []))
                times.append(t)
                values.append((delivered - d0) / (t - t0) if t > t0 else 0.0)
        previous = now
    return rates


def totals(records: List[Record]) -> Tuple[List[float], List[float], List[float]]:
    """Times, cumulative preparations and deliveries of the server."""
    return ([float(r["elapsed_s"]) for r in records],
            [float(r["status"].get("preparations", 0)) for r in records],
            [float(r["status"].get("deliveries", 0)) for r in records])


def summary(records: List[Record]) -> str:
    jobs = {j.get("id") for r in records for j in r["status"].get("jobs", [])}
    last = records[-1]["status"]
    return (f"{len(records)} records over {records[-1]['elapsed_s'] - records[0]['elapsed_s']:.1f}"
            f" s, {len(jobs)} jobs; at the end {last.get('deliveries', 0)} deliveries, "
            f"{last.get('preparations', 0)} preparations, sharing ratio "
            f"{last.get('sharing_ratio', 0):.2f}")


def render(records: List[Record], out: str, title: Optional[str] = None) -> None:
    """Writes the two plots to `out` (PNG)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(f"matplotlib is not importable by {sys.executable}; install "
                          "python3-matplotlib (scripts/setup.sh) or set CARPOOL_PYTHON to a "
                          "Python that has it") from None
    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    rates = job_rates(records)
    for label, (times, values) in rates.items():
        top.plot(times, values, marker=".", label=label)
    top.set_ylabel("samples/s")
    top.set_ylim(bottom=0)
    top.set_title(title or "each job's samples/s")
    if rates:
        top.legend(fontsize="small", ncol=2)
    else:
        top.text(0.5, 0.5, "no job seen in two records", ha="center", transform=top.transAxes)
    times, preparations, deliveries = totals(records)
    bottom.plot(times, preparations, label="preparations (decodes)")
    bottom.plot(times, deliveries, label="deliveries (samples to jobs)")
    bottom.set_xlabel("seconds since the first record")
    bottom.set_ylabel("samples, cumulative")
    bottom.set_title(f"server: sharing ratio {records[-1]['status'].get('sharing_ratio', 0):.2f} "
                     "at the end (deliveries per preparation)")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="carpool report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("series", metavar="FILE", help="JSON lines from carpool status --json-lines")
    ap.add_argument("--out", metavar="PNG", help="the image (default: FILE with .png)")
    args = ap.parse_args(argv)
    out = args.out or (args.series[:-6] if args.series.endswith(".jsonl") else args.series) + ".png"
    try:
        records = load(args.series)
        render(records, out)
    except ReportError as e:
        print(f"carpool report: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # savefig: a folder that does not exist, no permission
        print(f"carpool report: cannot write {out!r}: {e.strerror}; pass a writable --out",
              file=sys.stderr)
        return 1
    print(f"carpool report: {out}: {summary(records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
