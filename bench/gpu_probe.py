"""Where one GPU job's time goes: carpool's GPU path taken apart, on the GPU machine.

  python3 -m bench.gpu_probe [--variants drop sleep train train-cpu train-deep]
      [--max-seconds 12] [bench.gpu's options: --count, --workers, --lookahead, --prefetch, ...]

Each variant is one job on the dataset `all` of bench.gpu (same data, same server flags), run
against a fresh server for --max-seconds:
  drop        the job drops its batches: the server's rate with nothing downstream;
  sleep       the job sleeps one training step's time per batch and touches no GPU;
  train       ResNet-18 training on the batches (bench.gpu's n1 carpool side);
  train-cpu   the same training on host batches (device "cpu") copied to the GPU;
  train-deep  train with 2x the prefetch, and 2x --lookahead when it is given (else the
              server's own look-ahead);
  train-query, train-blocking: train, the loader's release thread polling its CUDA events
              (query) or waiting on blocking-sync events, instead of cudaEventSynchronize.
While a variant runs, the server's stats are read every 50 ms: the job's batches held by the
client (unreleased), its decided-not-delivered queue, the samples being prepared. At the end the
server's CPU time is split by thread name (/proc/PID/task/*/stat: carpool-worker, carpool-coord,
carpool-io, ...). The printout is one line per variant and a table of the samples' means;
--json-out keeps everything. docs/gpu.md ("Profiling one job") reads the result."""

import json
import os
import pathlib
import statistics
import sys
import threading
import time

from bench.common import import_carpool
from bench.gpu.cli import finish_args, parser
from bench.gpu.jobs import run_jobs
from bench.gpu.run import Bench

VARIANTS = ["drop", "sleep", "train", "train-cpu", "train-deep", "train-query", "train-blocking"]


def thread_cpu(pid):
    """{thread name: CPU seconds} of a process, summed over threads of the same name."""
    out = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf(
            "SC_CLK_TCK")
    return out


def system_cpu():
    """(busy, iowait, steal, total) jiffies of the whole machine, from /proc/stat."""
    f = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (f + [0] * 8)[:8]
    return user + nice + system + irq + softirq, iowait, steal, sum(f[:8])


def worker_states(pid):
    """{state letter or "S:wchan": count} over the server's carpool-worker threads."""
    out = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != "carpool-worker":
                continue
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "R":
                state += ":" + (task / "wchan").read_text().strip()
        except OSError:
            continue
        out[state] = out.get(state, 0) + 1
    return out


class StatsSampler:
    """Reads the server's stats every `period` s from a thread, until stop()."""

    def __init__(self, carpool, socket, pid, period=0.01):
        self.carpool, self.socket, self.pid, self.period = carpool, socket, pid, period
        self.rows, self._stop = [], threading.Event()
        self.states, self.cpu0 = {}, system_cpu()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from carpool.loader import _Client
        client = _Client(self.socket, None)  # one connection for all the reads
        while not self._stop.wait(self.period):
            try:
                s = client.stats()
            except Exception:  # the server is going away
                return
            for k, v in worker_states(self.pid).items():
                self.states[k] = self.states.get(k, 0) + v
            jobs = s.get("jobs", [])
            if not jobs:
                continue
            j = jobs[0]
            self.rows.append({"t": time.monotonic(), "unreleased": j.get("unreleased", 0),
                              "queue_depth": j.get("queue_depth", 0),
                              "assembling": int(bool(j.get("assembling"))),
                              "in_flight": s.get("in_flight", 0),
                              "deliveries": s.get("deliveries", 0),
                              "workers_busy": s.get("workers_busy", 0),
                              "worker_queue": s.get("worker_queue", 0),
                              "lock_wait_s": s.get("worker_lock_wait_seconds", 0.0),
                              "phases": s.get("worker_phases", {}),
                              "coordinator_s": s.get("coordinator_seconds", 0.0)})

    def stop(self):
        self._stop.set()
        self._thread.join()
        c1 = system_cpu()
        d = [b - a for a, b in zip(self.cpu0, c1)]
        self.machine = {"busy_pct": 100 * d[0] / d[3], "iowait_pct": 100 * d[1] / d[3],
                        "steal_pct": 100 * d[2] / d[3]}
        n = sum(self.states.values()) or 1
        self.worker_states_pct = {k: 100 * v / n for k, v in
                                  sorted(self.states.items(), key=lambda kv: -kv[1])}

    def means(self):
        if not self.rows:
            return {}
        keys = ("unreleased", "queue_depth", "assembling", "in_flight", "workers_busy",
                "worker_queue")
        out = {k: statistics.mean(r[k] for r in self.rows) for k in keys}
        out["unreleased_full_pct"] = None
        names = sorted({k for r in self.rows for k in r["phases"]})
        out["worker_phases"] = {k: statistics.mean(r["phases"].get(k, 0) for r in self.rows)
                                for k in names}
        return out


def run_variant(bench, name, args):
    carpool = bench.carpool
    side = {"drop": "drop", "sleep": "sleep"}.get(name, "carpool")
    kw = {}
    if name == "sleep":
        kw = {"sleep": True, "sleep_s": bench.report["step_s"]}
    if name == "train-cpu":
        kw = {"loader_device": "cpu"}
    if name == "train-deep":
        kw = {"prefetch": 2 * args.prefetch}
    if name in ("train-query", "train-blocking"):
        kw = {"release_mode": name.split("-")[1]}
    spec = bench.spec(side, 0, "all", probe=True, **kw)
    saved = args.lookahead
    if name == "train-deep" and saved is not None:
        args.lookahead = 2 * saved
    try:
        with bench.server(f"probe-{name}") as srv:
            spec["socket"] = srv.socket
            box = {}

            def before():
                box["sampler"] = StatsSampler(carpool, srv.socket, srv.proc.pid)
                box["cpu0"] = thread_cpu(srv.proc.pid)
            results, _, _ = run_jobs([spec], args.max_seconds, on_start=before)
            box["sampler"].stop()
            cpu1 = thread_cpu(srv.proc.pid)
    finally:
        args.lookahead = saved
    r = results[0]
    cpu = {k: v - box["cpu0"].get(k, 0.0) for k, v in cpu1.items()}
    rows = box["sampler"].rows
    prefetch = spec["prefetch"]
    means = box["sampler"].means()
    if rows:
        means["unreleased_full_pct"] = 100 * sum(r_["unreleased"] >= prefetch for r_ in rows) / len(
            rows)
        means["lock_wait_threads"] = (rows[-1]["lock_wait_s"] - rows[0]["lock_wait_s"]) / max(
            1e-9, rows[-1]["t"] - rows[0]["t"])
        means["coordinator_pct"] = 100 * (rows[-1]["coordinator_s"] - rows[0]["coordinator_s"]) / max(
            1e-9, rows[-1]["t"] - rows[0]["t"])
    wall = r["seconds"]
    cores = {k: v / wall for k, v in cpu.items() if v > 0}
    out = {"variant": name, "images_per_s": r["images_per_s"], "wait_fraction": r["wait_fraction"],
           "wait_ms": r["wait_ms"], "prefetch": prefetch, "stats_samples": len(rows), **means,
           "server_cores_by_thread": cores, "job_cpu_s": r["job_cpu_s"], "seconds": wall,
           "machine": box["sampler"].machine, "worker_states_pct": box["sampler"].worker_states_pct,
           "series": rows,
           **{k: r.get(k) for k in ("close_s", "close_releaser_s", "close_job_s", "close_rest_s",
                                   "fetch_s", "step_call_s", "final_sync_s", "gpu_backlog_steps", "arrivals", "releases",
                                   "start", "end")}}
    w = r["wait_ms"] or {}
    print(f"{name:10} {r['images_per_s']:7.0f} img/s  waited {100 * (r['wait_fraction'] or 0):3.0f}%"
          f" (per batch p50 {w.get('p50', 0):.1f} p90 {w.get('p90', 0):.1f} ms)  held by job "
          f"{means.get('unreleased', 0):.1f}/{prefetch} (full {means.get('unreleased_full_pct') or 0:.0f}%)"
          f"  queue {means.get('queue_depth', 0):.0f}  preparing {means.get('in_flight', 0):.0f}"
          f"  coordinator {means.get('coordinator_pct', 0):.0f}%  server cores "
          + ", ".join(f"{k} {v:.2f}" for k, v in sorted(cores.items(), key=lambda kv: -kv[1])[:4]),
          flush=True)
    m = box["sampler"].machine
    print(f"{'':10} machine busy {m['busy_pct']:.0f}% iowait {m['iowait_pct']:.0f}% steal "
          f"{m['steal_pct']:.0f}%; workers busy {means.get('workers_busy', 0):.1f}, tasks "
          f"queued {means.get('worker_queue', 0):.0f}, waiting for the engine lock "
          f"{means.get('lock_wait_threads', 0):.2f} threads; worker threads " + ", ".join(
              f"{k} {v:.0f}%" for k, v in list(out["worker_states_pct"].items())[:5]), flush=True)
    print(f"{'':10} workers by phase (mean): " + ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(means.get("worker_phases", {}).items(),
                                          key=lambda kv: -kv[1]) if v >= 0.05), flush=True)
    print(f"{'':10} GPU backlog after a step (steps) {r.get('gpu_backlog_steps')}, final "
          f"synchronize {r.get('final_sync_s') or 0:.3f} s", flush=True)
    print(f"{'':10} in step() {r.get('step_call_s') or 0:.2f} s, the loader's own waits for "
          f"batches {r.get('fetch_s') or 0:.2f} s of "
          f"{wall:.2f} s; close {r.get('close_s') or 0:.3f} s (release thread "
          f"{r.get('close_releaser_s') or 0:.3f}, job {r.get('close_job_s') or 0:.3f}, rest "
          f"{r.get('close_rest_s') or 0:.3f})", flush=True)
    return out


def main():
    ap = parser("python -m bench.gpu_probe")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    ap.set_defaults(max_seconds=12, rate_seconds=4, scenarios=["n1"])
    args = finish_args(ap.parse_args())
    bench = Bench(args)
    bench.carpool = import_carpool()
    if bench.carpool is None:
        sys.exit("bench.gpu_probe: no carpool binary or library (build it, or use the bundle)")
    import tempfile
    import shutil
    tmp = tempfile.mkdtemp(prefix="carpool-gpu-probe-")
    bench.state_dir = pathlib.Path(args.state_dir or tmp)
    bench.log_dir = pathlib.Path(args.log_dir or tmp)
    report = {"config": vars(args), "variants": []}
    try:
        bench.prepare_data()
        bench.register()
        specs = [bench.spec("synthetic", 0, "all")]
        results, ready, _ = run_jobs(specs, args.rate_seconds)
        bench.report.update(step_s=ready[0]["step_s"])
        report.update(device=ready[0]["device"], gpu_rate=results[0]["images_per_s"],
                      step_s=ready[0]["step_s"])
        print(f"{ready[0]['device']}: GPU training rate on synthetic input "
              f"{results[0]['images_per_s']:.0f} img/s, one step {1e3 * ready[0]['step_s']:.1f} ms; "
              f"in step() {results[0]['step_call_s']:.2f} s of {results[0]['seconds']:.2f} s, GPU "
              f"backlog (steps) {results[0]['gpu_backlog_steps']}", flush=True)
        for name in args.variants:
            try:
                report["variants"].append(run_variant(bench, name, args))
            except (Exception, SystemExit) as e:
                print(f"{name}: FAILED: {e}", flush=True)
                report["variants"].append({"variant": name, "error": str(e)})
    finally:
        bench.sampler.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if args.json_out:
            pathlib.Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
