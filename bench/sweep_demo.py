"""A small hyperparameter sweep of PyTorch training jobs that share one carpool server.

  python3 -m bench.sweep_demo sweep --socket S --label L --out L.json   # SWEEP, a process a job
  python3 -m bench.sweep_demo compare A.json B.json [C.json ...]         # side by side
(PYTHONPATH=client/python, from the repository root.) Each job is a process running
bench.fmnist_train, given this process's bench and carpool packages by PYTHONPATH.

scripts/demo.sh runs it twice: against a server with its cache (sharing on) and against one with
--cache-size 0 (every delivery prepared: sharing off). Datasets: fmnist (Fashion-MNIST train) and
fmnist-half (a uniform half of it), registered by demo.sh."""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import carpool

# The folders holding this bench package and the carpool package this process uses: a job
# process (python -m bench.fmnist_train) gets them first on its PYTHONPATH.
PACKAGE_PATHS = [str(pathlib.Path(__file__).resolve().parents[1]),
                 str(pathlib.Path(carpool.__file__).resolve().parents[1])]

# name, dataset, learning rate, batch size, epochs, start (None: at once; F: when job "a" has
# consumed the fraction F of its epochs).
SWEEP = [
    ("a", "fmnist", 0.05, 64, 1, None),
    ("b", "fmnist", 0.01, 64, 1, None),
    ("c", "fmnist-half", 0.05, 64, 1, None),
    ("d", "fmnist", 0.02, 128, 1, 0.3),
]


def launch_job(socket, dataset, lr, batch_size, epochs, seed, device="cpu"):
    """Starts one training process (bench.fmnist_train); its first line is {"job_id": N}."""
    cmd = [sys.executable, "-m", "bench.fmnist_train", "--socket", socket, "--dataset",
           dataset, "--lr", str(lr), "--batch-size", str(batch_size), "--epochs", str(epochs),
           "--seed", str(seed), "--device", device]
    path = os.pathsep.join(PACKAGE_PATHS + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=path))


def finish_job(proc, row):
    """Waits for a job launched by launch_job and adds its JSON lines to row; False if it failed."""
    out, _ = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    for ln in lines:
        row.update(json.loads(ln))
    return proc.returncode == 0 and "accuracy" in row


def job_progress(socket, job_id):
    for j in carpool.server_stats(socket=socket)["jobs"]:
        if j["id"] == job_id:
            return j["progress"]
    return 1.0  # gone: finished


def run_sweep(args):
    before = carpool.server_stats(socket=args.socket)
    procs, rows = {}, {}
    t0 = time.monotonic()

    def start(name, dataset, lr, bs, epochs):
        procs[name] = launch_job(args.socket, dataset, lr, bs, epochs, args.seed)
        rows[name] = {"name": name, "dataset": dataset, "lr": lr, "batch_size": bs,
                      "epochs": epochs, "start_s": time.monotonic() - t0}

    late = []
    for name, dataset, lr, bs, epochs, at in SWEEP:
        if at is None:
            start(name, dataset, lr, bs, epochs)
        else:
            late.append((at, name, dataset, lr, bs, epochs))
    first = SWEEP[0][0]
    rows[first].update(json.loads(procs[first].stdout.readline() or '{"job_id": null}'))
    while late:
        if rows[first]["job_id"] is None:
            raise SystemExit(f"job {first} did not start")
        if job_progress(args.socket, rows[first]["job_id"]) >= late[0][0]:
            start(*late.pop(0)[1:])
        time.sleep(0.2)
    failed = [name for name, p in procs.items() if not finish_job(p, rows[name])]
    after = carpool.server_stats(socket=args.socket)
    prep = after["preparations"] - before["preparations"]
    deliv = after["deliveries"] - before["deliveries"]
    result = {"label": args.label, "wall_s": time.monotonic() - t0,
              "jobs": [rows[n] for n in sorted(rows)], "preparations": prep, "deliveries": deliv,
              "sharing_ratio": deliv / prep if prep else 0.0,
              "cache_capacity_bytes": after["cache"]["capacity_bytes"]}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    print_sweep(result)
    if failed:
        raise SystemExit(f"jobs {', '.join(failed)} failed; see their errors above")


def print_sweep(r):
    print(f"\nsweep '{r['label']}': {len(r['jobs'])} jobs, {r['wall_s']:.1f} s wall")
    print(f"  {'job':3} {'dataset':12} {'lr':>6} {'batch':>5} {'start s':>7} {'samples':>8} "
          f"{'train s':>7} {'test acc':>8}")
    for j in r["jobs"]:
        print(f"  {j['name']:3} {j['dataset']:12} {j['lr']:>6} {j['batch_size']:>5} "
              f"{j['start_s']:>7.1f} {j.get('samples', 0):>8} {j.get('seconds', 0):>7.1f} "
              f"{j.get('accuracy', float('nan')):>8.4f}")
    print(f"  server: {r['preparations']} preparations, {r['deliveries']} deliveries, "
          f"sharing ratio {r['sharing_ratio']:.2f} (cache {r['cache_capacity_bytes']} bytes)")


def compare(args):
    runs = [json.loads(pathlib.Path(p).read_text()) for p in args.sweeps]
    print(f"\n{'':30}" + "".join(f" {r['label']:>16}" for r in runs))
    for jobs in zip(*(r["jobs"] for r in runs)):
        j = jobs[0]
        what = f"job {j['name']} ({j['dataset']}, lr {j['lr']})"
        print(f"{what:30}" + "".join(
            f" {'acc ' + format(k.get('accuracy', float('nan')), '.4f'):>16}" for k in jobs))
    for key, fmt in (("preparations", "d"), ("deliveries", "d"), ("sharing_ratio", ".2f"),
                     ("wall_s", ".1f")):
        print(f"{key:30}" + "".join(f" {format(r[key], fmt):>16}" for r in runs))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--socket", required=True)
    s.add_argument("--label", default="sharing on")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare")
    c.add_argument("sweeps", nargs="+", metavar="SWEEP.json", help="two or more sweeps")
    args = ap.parse_args()
    {"sweep": run_sweep, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    try:
        main()
    except carpool.CarpoolError as e:
        print(f"{os.path.basename(__file__)}: {e}", file=sys.stderr)
        sys.exit(1)
