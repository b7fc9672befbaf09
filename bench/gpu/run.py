"""One run of the GPU benchmark (class Bench): the data, the machine's limits, then each
scenario's sides; the report as JSON and Markdown."""

import json
import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from bench.common import (PREPARE, SAMPLE_BYTES, catalog_ids, ensure_jpegs, epoch_check,
                          import_carpool, order_z, pair_checks, tensorsocket_compat,
                          tensorsocket_producers, versions)
from bench.gpu.dmon import Dmon
from bench.gpu.jobs import (GpuUtilSampler, aggregate, batches_key, cpu_seconds, gpu_index,
                            ratio, run_jobs, tree_cpu_seconds)
from bench.gpu.mps import Mps
from bench.gpu.report import markdown
from bench.gpu.scenarios import OVERLAP_PARTS, SCENARIOS, STALL_GRACE_S, job_batches
from bench.gpu.sides import tensorsocket_producer
from bench.torchvision_jobs import job_workers


class Bench:
    """One run: the data, the machine's limits, then each scenario's sides; the report as JSON."""

    def __init__(self, args):
        self.args = args
        self.cores = len(os.sched_getaffinity(0))
        self.gpu = gpu_index(args.device)
        self.sampler = GpuUtilSampler(self.gpu)
        self.report = {"config": {k: v for k, v in vars(args).items()}, "cores": self.cores,
                       "cuda_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset"),
                       "scenarios": {}}
        self.datasets = {}  # key -> (carpool name, ImageFolder indices or None, size)
        self.errors = self.report["errors"] = []

    def spec(self, side, job, key, **kw):
        a = self.args
        name, indices, size = self.datasets.get(key, (key, None, a.count))
        s = {"side": side, "job": job, "dataset_key": key, "dataset": name, "indices": indices,
             "device": a.device, "batch_size": a.batch_size, "epochs": a.epochs, "model": a.model,
             "classes": self.classes, "transform": a.transform, "socket": None,
             "prefetch": a.prefetch, "root": str(self.root), "seed": job + 1, "workers": 0,
             "warmup": a.warmup, "repeat": 1, "sleep": False,
             "decode_probe": a.decode_probe,
             "planned": a.epochs * size}
        s.update(kw)
        s["tail"] = size % s["batch_size"]
        return s

    # -- data
    def prepare_data(self):
        a = self.args
        self.root = ensure_jpegs(a.data_dir, "bench-gpu", a.count, self.carpool)
        from torchvision.datasets import ImageFolder  # the order the baseline jobs index
        folder = ImageFolder(str(self.root))
        self.classes = len(folder.classes)
        self.paths = [os.path.realpath(p) for p, _ in folder.samples]
        s, h = len(self.paths), len(self.paths) // OVERLAP_PARTS
        self.ranges = {"all": [(0, s)], "core": [(0, h)]}
        for i in range(4):
            self.ranges[f"priv{i}"] = [(h * (1 + i), h * (2 + i))]
            self.ranges[f"ov{i}"] = [(0, h), (h * (1 + i), h * (2 + i))]
        for key, rs in self.ranges.items():
            idx = [k for lo, hi in rs for k in range(lo, hi)]
            self.datasets[key] = (key, None if key == "all" else idx, len(idx))

    def register(self):
        """The catalog: `all` from the folder; for the overlap scenario core = the first S/5
        ImageFolder positions, priv_i = the (i+2)-th fifth, ov_i = core ∪ priv_i (--ids ranges,
        then --union), so every pair of the 4 jobs shares exactly half of its dataset."""
        cli, sd = self.carpool.cli, self.state_dir
        cli("dataset", "add", "all", "--dir", self.root, "--prepare", PREPARE, "--quiet",
            state_dir=sd)
        if "overlap" not in self.args.scenarios:
            return
        ids = catalog_ids(sd, self.paths)
        for key in ["core"] + [f"priv{i}" for i in range(4)]:
            (lo, hi), = self.ranges[key]
            if ids[lo:hi] != list(range(ids[lo], ids[lo] + hi - lo)):
                raise SystemExit(f"bench.gpu: catalog ids of {self.root} [{lo}, {hi}) are not "
                                 "contiguous in ImageFolder order; cannot derive the overlap sets")
            cli("dataset", "add", key, "--from", "all", "--ids", f"{ids[lo]}:{ids[hi - 1] + 1}",
                "--quiet", state_dir=sd)
        for i in range(4):
            cli("dataset", "add", f"ov{i}", "--union", "core", f"priv{i}", "--quiet",
                state_dir=sd)

    # -- sides
    def server(self, label, gpus=None, cache=None):
        """A carpool server with `cache` (one of args.caches; default the first). Flags left at
        None (--lookahead unless given) are not passed: the server's defaults apply."""
        a = self.args
        cache = cache or a.caches[0]
        flags = {"workers": a.workers, "cache_size": cache["cache_size"], "lookahead": a.lookahead}
        if self.gpu is not None:
            flags.update(gpus=gpus or str(self.gpu), gpu_cache_size=cache["gpu_cache_size"],
                         gpu_decode=a.gpu_decode, job_decode=a.job_decode)
        return self.carpool.Server(self.state_dir, log=str(self.log_dir / f"server-{label}.log"),
                                   **flags)

    def carpool_run(self, label, specs, cache=None, **kw):
        """run_jobs against a fresh server; adds the server's deltas to the aggregate."""
        with self.server(label, cache=cache) as srv:
            for s in specs:
                s["socket"] = srv.socket
            snap = {}

            def before():
                snap.update(stats=self.carpool.server_stats(socket=srv.socket),
                            cpu=cpu_seconds(srv.proc.pid))
            series = self.status_series(label, srv.socket)
            try:
                with Dmon(self.gpu) as dmon:
                    results, ready, _ = run_jobs(specs, self.args.max_seconds, on_start=before,
                                                 **kw)
            finally:
                if series:
                    series.send_signal(signal.SIGINT)
                    series.wait()
            after = self.carpool.server_stats(socket=srv.socket)
            cpu = cpu_seconds(srv.proc.pid) - snap["cpu"]
        agg = aggregate(results, self.sampler)
        agg.update(server_deltas(snap["stats"], after, self.gpu or 0))
        agg["gpu_utilization"] = dmon.summary()
        prep, deliv = agg["preparations"], agg["deliveries"]
        agg.update(server_cpu_s=cpu, server_cpu_ms_per_image=ratio(cpu * 1e3, deliv),
                   server_cores_pct=100 * cpu / agg["wall_s"] / self.cores,
                   prep_per_delivery=ratio(prep, deliv))
        if deliv != agg["images"]:
            print(f"  note: server deliveries {deliv} != images the jobs trained on "
                  f"{agg['images']} (batches prefetched before a stop)", flush=True)
        return agg, ready

    def status_series(self, label, socket):
        """With --status-series DIR: `carpool status --watch` of this server into
        DIR/status-LABEL.jsonl while its jobs run (pacing, cache and each job over time); LABEL
        keeps letters, digits, '.', '_' and '-'."""
        if not self.args.status_series:
            return None
        folder = pathlib.Path(self.args.status_series)
        folder.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", label)  # n1@10% -> n1_10_
        return subprocess.Popen([self.carpool.binary(), "status", "--watch", "0.25",
                                 "--json-lines", str(folder / f"status-{name}.jsonl"),
                                 "--socket", socket], stdout=subprocess.DEVNULL)

    def baseline_run(self, specs, **kw):
        for s in specs:
            s["workers"] = job_workers(self.args.workers, len(specs), s["job"])
        results, ready, _ = run_jobs(specs, self.args.max_seconds, **kw)
        agg = aggregate(results, self.sampler)
        cpu = sum(r["workers_cpu_s"] for r in results)
        agg.update(workers_cpu_s=cpu, workers_cpu_ms_per_image=ratio(cpu * 1e3, agg["images"]),
                   workers_cores_pct=100 * cpu / agg["wall_s"] / self.cores, prep_per_delivery=1.0)
        return agg, ready

    def tensorsocket_run(self, specs, late=()):
        """TensorSocket (issue 13.3): its producers as bench.peers plans them
        (tensorsocket_producers: one per dataset with its jobs' shares of the W workers; a late
        job's own one with --ts-late own, started as it joins, else one epoch more in the shared
        one), each a spawned process over the baseline's DataLoader, and the jobs as its
        consumers; the producers stay up until every job has ended. Adds each job's epoch checks
        from the delivered ids, and the producers' CPU (their workers' included)."""
        a = self.args
        plan, ports, notes = tensorsocket_producers(
            [s["dataset_key"] for s in specs], [s["batch_size"] for s in specs], a.workers,
            a.epochs, late=late, late_own=a.ts_late == "own")
        for s, port in zip(specs, ports):
            s["ts_port"] = port
        ctx = mp.get_context("spawn")
        out, done = ctx.Queue(), ctx.Event()
        # A producer of late jobs only starts its workers when its first job goes.
        gos = [ctx.Event() for _ in plan]
        late_of = [all(i in late for i in h["jobs"]) for h in plan]
        procs = [ctx.Process(target=tensorsocket_producer, args=(self.spec(
            "tensorsocket-producer", h["job"], h["dataset"], seed=-h["job"], workers=h["workers"],
            batch_size=h["batch"], producer_batch=h["producer_batch"], ts_port=h["ts_port"],
            epochs=h["epochs"]), go, done, out)) for h, go in zip(plan, gos)]
        errors, cpu = [], {}

        def drain(timeout):
            try:
                kind, job, payload = out.get(timeout=timeout)
            except queue_mod.Empty:
                return None
            if kind == "error":
                print(payload, file=sys.stderr, flush=True)
                errors.append(f"producer {-job}: {payload.strip().splitlines()[-1]}")
            return kind

        def before():
            for go, is_late in zip(gos, late_of):
                if not is_late:
                    go.set()
            cpu["start"] = tree_cpu_seconds([p.pid for p in procs])

        def on_late(job):
            for go, h in zip(gos, plan):
                if job in h["jobs"]:
                    go.set()
        try:
            for p in procs:
                p.start()
            ready, deadline = 0, time.monotonic() + 300
            while ready < len(procs) and not errors:
                if time.monotonic() > deadline:
                    raise SystemExit("TensorSocket producers not ready after 300 s")
                ready += drain(0.5) == "ready"
            if errors:
                raise SystemExit("; ".join(errors))
            results, _, _ = run_jobs(specs, a.max_seconds, late=late, on_start=before,
                                     stall_grace=STALL_GRACE_S, on_late=on_late)
            cpu["end"] = tree_cpu_seconds([p.pid for p in procs])
        finally:
            done.set()
            for go in gos:
                go.set()
            for k, p in enumerate(procs):
                p.join(5)
                if p.is_alive():  # not back in its loop: its stack to stderr, then end it
                    notes.append(f"producer {k + 1} did not end when told (stack on stderr)")
                    os.kill(p.pid, signal.SIGUSR1)
                    time.sleep(1)
                    p.terminate()
                    p.join()
            while drain(0.1):
                pass
        checked = [{"epochs": r.pop("epochs", []), "checksums": r.get("checksums", {})}
                   for r in results]
        for s, r, c in zip(specs, results, checked):
            expected = self.expected_ids(s["dataset_key"])
            r["epoch_check"] = r.get("stalled") or epoch_check(c["epochs"], expected)
            r["order_z"] = order_z(c["epochs"][0], expected) if c["epochs"] else None
        agg = aggregate(results, self.sampler)
        rho, same_pixels = pair_checks(checked) if len(checked) > 1 else (None, False)
        used = (cpu["end"] - cpu["start"]) if None not in (cpu.get("start"), cpu.get("end")) \
            else None
        agg.update(producers=len(plan), producer_batch=plan[0]["producer_batch"], notes=notes,
                   order_rho_max=rho, same_pixels=same_pixels, producer_errors=errors,
                   producer_cpu_s=used,
                   producer_cpu_ms_per_image=ratio(used and used * 1e3, agg["images"]),
                   prep_per_delivery=None)
        return agg, None

    def expected_ids(self, key):
        """The ImageFolder indices of a dataset (what each of its epochs must hold once)."""
        _, indices, size = self.datasets[key]
        return list(range(size)) if indices is None else indices

    # -- the machine's limits
    def measure_limits(self):
        a = self.args
        specs = [self.spec("synthetic", 0, "all")]
        results, ready, _ = run_jobs(specs, a.rate_seconds)
        self.gpu_rate = results[0]["images_per_s"]
        self.report.update(gpu_rate=self.gpu_rate, device=ready[0]["device"],
                           torch=ready[0]["torch"], step_s=ready[0]["step_s"])
        print(f"GPU training rate alone ({ready[0]['device']}, synthetic input, "
              f"{results[0]['seconds']:.1f} s): {self.gpu_rate:.0f} img/s", flush=True)
        # N training processes share the GPU by time-slicing, which costs throughput: the GPU's
        # bound for an N-job scenario is N processes on synthetic input, measured the same way.
        # Keyed by the jobs' batch sizes ("256+256"): a smaller batch trains fewer images a second.
        self.gpu_rate_by_jobs = {batches_key((a.batch_size,)): self.gpu_rate}
        for batches in sorted({job_batches(name, a.batch_size) for name in a.scenarios}):
            if batches_key(batches) in self.gpu_rate_by_jobs:
                continue
            specs = [self.spec("synthetic", i, "all", batch_size=b) for i, b in enumerate(batches)]
            results, _, _ = run_jobs(specs, a.rate_seconds)
            self.gpu_rate_by_jobs[batches_key(batches)] = sum(r["images_per_s"] for r in results)
            print(f"GPU training rate, {len(batches)} processes (batch {batches_key(batches)}) on "
                  f"synthetic input: {self.gpu_rate_by_jobs[batches_key(batches)]:.0f} img/s",
                  flush=True)
        self.report["gpu_rate_by_jobs"] = self.gpu_rate_by_jobs
        self.prep_rate = self.report["prepare_rate_images_per_s"] = None
        if self.carpool:
            try:
                agg, _ = self.carpool_run("prepare-rate", [self.spec("drop", 0, "all")])
            except (Exception, SystemExit) as e:
                self.errors.append(f"prepare rate: {e}")
                print(f"server prepare rate FAILED: {e}", flush=True)
                return
            self.prep_rate = agg["preparations"] / agg["wall_s"]
            self.report["prepare_rate_images_per_s"] = self.prep_rate
            self.report["prepare_rate"] = {k: v for k, v in agg.items() if k != "jobs"}
            print(f"server prepare rate ({a.workers} workers, a job that drops its batches): "
                  f"{self.prep_rate:.0f} img/s, server CPU {agg['server_cores_pct']:.0f}% of "
                  f"{self.cores} cores", flush=True)
            print_build_phases("  GPU builds alone", agg)

    def limit(self, keys, repeats, batches):
        """min(prepare rate x deliveries per unique sample, GPU rate of as many processes x
        deliveries per trained image): carpool prepares a sample once for all the jobs that read
        it, and the GPU trains every delivery (twice for a job that trains twice on each batch)."""
        sets = [set(k for lo, hi in self.ranges[key] for k in range(lo, hi)) for key in keys]
        share = sum(map(len, sets)) / len(set().union(*sets))
        work = sum(map(len, sets)) / sum(len(x) * r for x, r in zip(sets, repeats))
        if self.prep_rate is None:
            return share, None
        gpu = self.gpu_rate_by_jobs.get(batches_key(batches), self.gpu_rate)
        return share, min(self.prep_rate * share, gpu * work)

    def scenario(self, name):
        """Every side at the first cache (row `name`), then the carpool side at each other cache
        (row `name@10%`, ...), whose other sides are the first row's (they have no such cache)."""
        a = self.args
        what, keys, late, slow, _ = SCENARIOS[name]
        batches = job_batches(name, a.batch_size)
        slow_kw = {"repeat": 2} if a.slow_mode == "twice" else {"sleep": True}
        kws = [dict(slow_kw if i in slow else {}, batch_size=b) for i, b in enumerate(batches)]
        share, limit = self.limit(keys, [kw.get("repeat", 1) for kw in kws], batches)
        first = None
        # Rows at other caches only where carpool runs: the others would be empty.
        caches = a.caches if "carpool" in a.sides and self.carpool else a.caches[:1]
        for cache in caches:
            key = name if first is None else f"{name}@{cache['label']}"
            row = {"what": what, "jobs": len(keys), "datasets": keys, "late": list(late),
                   "slow": list(slow), "batches": list(batches), "share": share,
                   "limit_images_per_s": limit, "cache": cache}
            if first is not None:
                row["peers_from"] = name
            self.report["scenarios"][key] = row
            for side in a.sides if first is None else ["carpool"]:
                if side == "carpool" and not self.carpool:
                    continue
                specs = [self.spec(side, i, k, **kw) for i, (k, kw) in enumerate(zip(keys, kws))]
                self.run_side(key, row, side, specs, late, cache)
            peers = row if first is None else first
            row["carpool_vs_baseline"] = ratio(row.get("carpool", {}).get("images_per_s"),
                                               peers.get("baseline", {}).get("images_per_s"))
            row["carpool_vs_limit"] = ratio(row.get("carpool", {}).get("images_per_s"), limit)
            row["cpu_per_image_baseline_vs_carpool"] = ratio(
                peers.get("baseline", {}).get("workers_cpu_ms_per_image"),
                row.get("carpool", {}).get("server_cpu_ms_per_image"))
            first = first or row
            self.save()

    def run_side(self, key, row, side, specs, late, cache):
        """One side of a scenario row into row[side]; a failure is recorded, not raised."""
        t = time.monotonic()
        try:
            agg, _ = (self.carpool_run(key, specs, cache=cache, late=late) if side == "carpool"
                      else self.tensorsocket_run(specs, late=late) if side == "tensorsocket"
                      else self.baseline_run(specs, late=late))
        except (Exception, SystemExit) as e:  # one broken side must not lose the others
            row[side] = {"error": str(e)}
            self.errors.append(f"{key} {side}: {e}")
            print(f"{key:8} {side:8} FAILED: {e}", flush=True)
            return
        for r in agg["jobs"]:
            r["start_offset_s"] = r["start"] - agg["start"]
        row[side] = agg
        waits = [r.get("wait_fraction") for r in agg["jobs"] if r.get("wait_fraction")]
        at = f" ({cache['label']} cache)" if side == "carpool" else ""
        print(f"{key:8} {side:8} {agg['images']:7d} images {agg['wall_s']:6.1f} s "
              f"{agg['images_per_s']:8.0f} img/s{at} ({time.monotonic() - t:.0f} s with "
              f"start-up); jobs waited for data {100 * sum(waits) / max(1, len(waits)):.0f}% of "
              "the time", flush=True)
        print_build_phases(" " * 17 + "GPU builds", agg)
        print_pacing(" " * 17 + "pacing", agg)
        self.save()

    def save(self):
        if self.args.json_out:
            pathlib.Path(self.args.json_out).write_text(json.dumps(self.report, indent=1))

    def run(self):
        a = self.args
        self.carpool = import_carpool() if "carpool" in a.sides else None
        if self.carpool is None and "carpool" in a.sides:
            print("carpool binary or library not found: the carpool side is skipped", flush=True)
        if "tensorsocket" in a.sides:
            try:
                tensorsocket_compat()
            except Exception as e:  # noqa: BLE001  any import failure: no tensorsocket side
                self.errors.append(f"tensorsocket: {type(e).__name__}: {e}")
                print(f"tensorsocket side skipped: {e} (scripts/peer_wheels.sh)", flush=True)
                a.sides = [x for x in a.sides if x != "tensorsocket"]
        self.report["versions"] = versions()
        tmp = tempfile.mkdtemp(prefix="carpool-gpu-bench-")
        self.state_dir = pathlib.Path(a.state_dir or tmp)
        self.log_dir = pathlib.Path(a.log_dir or tmp)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        mps = Mps() if a.mps else None  # before any CUDA process of the run
        try:
            if mps:
                mps.start()
            self.prepare_data()
            if self.carpool:
                self.register()
            self.measure_limits()
            for name in a.scenarios:
                self.scenario(name)
        finally:
            self.sampler.stop()
            if mps:
                mps.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        self.report["run_s"] = time.monotonic() - t
        self.save()
        text = markdown(self.report)
        print("\n" + text)
        if a.md_out:
            pathlib.Path(a.md_out).write_text(text)
        if self.errors:
            sys.exit("bench.gpu: failed: " + "; ".join(self.errors))


def print_build_phases(what, agg):
    """Where the GPU's builds spent their time, in ms a build (servers since issue 23)."""
    g = agg.get("gpu") or {}
    phases = g.get("build_phase_seconds")
    if not phases or not g.get("batches"):
        return
    per = 1000 / g["batches"]
    print(f"{what}, ms a build of {agg['deliveries'] / g['batches']:.0f} images: " +
          ", ".join(f"{k} {v * per:.2f}" for k, v in phases.items()) +
          f"; whole build {g['assemble_seconds'] * per:.2f}", flush=True)


def print_pacing(what, agg):
    """The server's pacing in the scenario: holds and lifts, and its capacity and window at the
    end (scheduler.md, "Pacing"), to tell jobs held together from jobs let go."""
    p = agg.get("pacing")
    if p:
        print(f"{what}: {p['holds']} holds, {p['lifts']} lifts; at the end capacity "
              f"{p['capacity_samples']} samples, window {p['window']}", flush=True)


def server_deltas(s0, s1, gpu):
    """Counters of the scenario: stats after minus before, the GPU's from "gpus"."""
    prep = s1["preparations"] - s0["preparations"]
    deliv = s1["deliveries"] - s0["deliveries"]
    g0, g1 = gpu_entry(s0, gpu), gpu_entry(s1, gpu)
    out = {"preparations": prep, "deliveries": deliv}
    if "pacing" in s1:  # servers since issue 20
        p0, p1 = s0.get("pacing", {}), s1["pacing"]
        out["pacing"] = {"holds": p1["holds"] - p0.get("holds", 0),
                         "lifts": p1["lifts"] - p0.get("lifts", 0),
                         "capacity_samples": p1["capacity_samples"], "window": p1["window"]}
    if g0 is None or g1 is None:
        return out
    d = {k: g1[k] - g0[k] for k in ("batches", "images", "uploads", "upload_bytes",
                                     "resident_hits", "resident_evictions", "assemble_seconds")}
    for k in ("gpu_decodes", "cpu_fallbacks", "decoded_bytes", "undecodable", "decode_seconds",
              "job_decodes", "job_decode_failures", "job_decode_seconds", "overlapped_builds"):
        if k in g1:  # servers with GPU decode (issue 23)
            d[k] = g1[k] - g0.get(k, 0)
    if "build_phase_seconds" in g1:  # where builds spend their time
        p0 = g0.get("build_phase_seconds", {})
        d["build_phase_seconds"] = {k: round(v - p0.get(k, 0), 4)
                                    for k, v in g1["build_phase_seconds"].items()}
    out.update(decoder=g1.get("decoder", "cpu"))
    out.update(gpu=d, resident_bytes=g1["resident_bytes"], pool_bytes=g1["pool_bytes"],
               h2d_bytes_per_image=ratio(d["upload_bytes"], deliv),
               unique_bytes_per_image=ratio(d["uploads"] * SAMPLE_BYTES, deliv),
               uploads_per_preparation=ratio(d["uploads"], prep))
    return out


def gpu_entry(stats, gpu):
    """The "gpus" entry of device `gpu` (its index, or "cuda:N"); None without one."""
    for g in stats.get("gpus", []):
        if str(g.get("device")) in (str(gpu), f"cuda:{gpu}"):
            return g
    return None
