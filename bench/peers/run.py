"""One run of the peers benchmark (class Bench): data, catalog, each scenario's configurations;
the report as JSON and Markdown."""

import json
import math
import os
import pathlib
import shutil
import tempfile
import time

from bench.common import (PREPARE, TS_PORTS, catalog_ids, ensure_jpegs, epoch_check, fmt,
                          order_z, pair_checks, tensorsocket_compat, tensorsocket_producers,
                          versions)
from bench.peers.report import markdown
from bench.peers.runner import Run, TreeCpu
from bench.peers.scenarios import SCENARIOS
from bench.peers.shards import shard_layout, shard_mix, write_shards
from bench.torchvision_jobs import job_workers


class Bench:
    def __init__(self, args):
        self.args = args
        self.report = {"config": vars(args), "cores": len(os.sched_getaffinity(0)),
                       "versions": versions(), "scenarios": {}, "skipped": {}}

    # -- data and catalog
    def prepare_data(self):
        a = self.args
        import carpool  # the same generator as `carpool bench e2e`
        self.root = ensure_jpegs(a.data_dir, "bench-peers", a.count, carpool)
        from torchvision.datasets import ImageFolder
        samples = ImageFolder(str(self.root)).samples
        self.paths = [os.path.realpath(p) for p, _ in samples]
        s, third = len(self.paths), len(self.paths) // 3
        # Overlap: job 0 reads the first two thirds, job 1 the last two, so half of each job's
        # dataset is the other's.
        self.ranges = {"all": [(0, s)], "ov0": [(0, 2 * third)], "ov1": [(third, 3 * third)]}
        self.indices = {k: [i for lo, hi in r for i in range(lo, hi)]
                        for k, r in self.ranges.items()}
        # webdataset's shards, and each sample's shard (the shard-mix check of every config)
        self.shard_of = {k: shard_layout(ix, a.wds_shard_size) for k, ix in self.indices.items()}
        self.shards = ({k: write_shards(self.root, samples, ix, a.wds_shard_size, k)
                        for k, ix in self.indices.items()}
                       if "webdataset" in a.configs and "webdataset" not in self.report["skipped"]
                       else {})

    def register(self, state_dir):
        """Registers `all`, and ov0/ov1 as contiguous --ids ranges of it (`carpool dataset add
        --from all --ids LO:HI`); returns catalog id -> ImageFolder index."""
        import carpool
        carpool.cli("dataset", "add", "all", "--dir", self.root, "--prepare", PREPARE, "--quiet",
                    state_dir=state_dir)
        ids = catalog_ids(state_dir, self.paths)
        if ids != list(range(ids[0], ids[0] + len(ids))):
            raise SystemExit("bench.peers: catalog ids are not contiguous in ImageFolder "
                             "order; cannot register the overlap datasets as ranges")
        for key in ("ov0", "ov1"):
            (lo, hi), = self.ranges[key]
            carpool.cli("dataset", "add", key, "--from", "all", "--ids",
                        f"{ids[lo]}:{ids[hi - 1] + 1}", "--quiet", state_dir=state_dir)
        return {c: i for i, c in enumerate(ids)}

    # -- specs
    def spec(self, config, job_index, job, n_jobs, scenario):
        a = self.args
        step = a.speeds_step_ms if scenario == "speeds" else a.step_ms
        return {"config": config, "job": job_index, "dataset": job.dataset, "batch": job.batch,
                "late": job.late, "step_s": step * job.speed / 1e3, "epochs": a.epochs,
                "indices": self.indices[job.dataset], "paths": self.paths, "root": str(self.root),
                "workers": job_workers(a.workers, n_jobs, job_index),
                "planned": a.epochs * len(self.indices[job.dataset]),
                "socket": None, "catalog_to_index": None, "ts_port": TS_PORTS,
                "wds_urls": self.shards.get(job.dataset)}

    def tensorsocket_plan(self, name, specs):
        helpers, ports, notes = tensorsocket_producers(
            [s["dataset"] for s in specs], [s["batch"] for s in specs], self.args.workers,
            self.args.epochs, late=[i for i, s in enumerate(specs) if s["late"]])
        for s, port in zip(specs, ports):
            s["ts_port"] = port
        return [dict(specs[h["jobs"][0]], **h) for h in helpers], notes

    # -- one configuration of one scenario
    def run_config(self, name, config, jobs, cache=None):
        """One configuration of a scenario; carpool's server with `cache` (one of args.caches;
        default the first)."""
        cache = cache or self.args.caches[0]
        specs = [self.spec(config, i, j, len(jobs), name) for i, j in enumerate(jobs)]
        helpers, notes = ([], [])
        if config == "tensorsocket":
            helpers, notes = self.tensorsocket_plan(name, specs)
        server, tmp = None, None
        try:
            if config == "carpool":
                import carpool
                tmp = tempfile.mkdtemp(prefix="carpool-peers-")
                to_index = self.register(tmp)
                server = carpool.Server(tmp, workers=self.args.workers,
                                        cache_size=cache["cache_size"],
                                        log=os.path.join(tmp, "server.log")).start()
                for s in specs:
                    s.update(socket=server.socket, catalog_to_index=to_index,
                             dataset=s["dataset"])
            run, cpu = Run(specs, helpers, self.args.max_seconds), TreeCpu()
            try:
                before = carpool.server_stats(socket=server.socket) if server else None
                results = run.go(cpu)
                after = carpool.server_stats(socket=server.socket) if server else None
            finally:
                cpu_s = cpu.stop() if cpu.running else None
                run.close()
        finally:
            if server:
                server.stop()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        return self.summarize(specs, results, cpu_s, before, after, notes)

    def summarize(self, specs, results, cpu_s, before, after, notes):
        start, end = min(r["start"] for r in results), max(r["end"] for r in results)
        images = sum(r["images"] for r in results)
        jobs = []
        for s, r in zip(specs, results):
            expected = self.indices[s["dataset"]]
            secs = r["end"] - r["start"]
            jobs.append({"dataset": s["dataset"], "batch": s["batch"], "images": r["images"],
                         "seconds": secs, "samples_per_s": r["images"] / secs if secs else 0,
                         "start_offset_s": r["start"] - start, "first_batch_s": r["first_batch_s"],
                         "epochs": r.get("stalled") or epoch_check(r["epochs"], expected),
                         "order_z": order_z(r["epochs"][0], expected) if r["epochs"] else None,
                         "shard_mix": (shard_mix(r["epochs"][0], self.shard_of[s["dataset"]])
                                       if r["epochs"] else None)})
        rho, same_pixels = pair_checks(results) if len(results) > 1 else (None, False)
        out = {"samples_per_s": images / (end - start), "images": images, "wall_s": end - start,
               "cpu_s": cpu_s, "cpu_ms_per_sample": 1e3 * cpu_s / images if images else None,
               "order_rho_max": rho, "same_pixels": same_pixels, "jobs": jobs, "notes": notes}
        if before is not None:
            prep = after["preparations"] - before["preparations"]
            deliv = after["deliveries"] - before["deliveries"]
            distinct = len(set().union(*(set(i for e in r["epochs"] for i in e) for r in results)))
            out.update(preparations=prep, deliveries=deliv,
                       prep_per_delivery=prep / deliv if deliv else None,
                       lower_bound=distinct / images if images else None)
        return out

    def scenario(self, name):
        """Every configuration at the first cache (row `name`), then carpool at each other cache
        (row `name@10%`, ...), whose other configurations are the first row's."""
        what, jobs = SCENARIOS[name]
        specs = [self.spec(None, i, j, len(jobs), name) for i, j in enumerate(jobs)]
        # Rows at other caches only where carpool runs: the others would be empty.
        carpool = "carpool" in self.args.configs and "carpool" not in self.report["skipped"]
        caches = self.args.caches if carpool else self.args.caches[:1]
        for c, cache in enumerate(caches):
            key = name if c == 0 else f"{name}@{cache['label']}"
            row = self.report["scenarios"][key] = {"what": what, "results": {}, "cache": cache,
                                                   "asked": [asked_rate(s) for s in specs],
                                                   "ceiling": step_ceiling(specs)}
            if c > 0:
                row["peers_from"] = name
            for config in self.args.configs if c == 0 else ["carpool"]:
                why = self.report["skipped"].get(config)
                if why:
                    row["results"][config] = {"skipped": why}
                    continue
                t = time.monotonic()
                try:
                    r = self.run_config(name, config, jobs, cache)
                except (Exception, SystemExit) as e:  # one broken peer must not lose the others
                    row["results"][config] = {"error": str(e)}
                    print(f"{key:8} {config:12} FAILED: {e}", flush=True)
                    continue
                row["results"][config] = r
                per_job = " ".join(f"{j['samples_per_s']:.0f}" for j in r["jobs"])
                at = f" ({cache['label']} cache)" if config == "carpool" else ""
                print(f"{key:8} {config:12} {r['samples_per_s']:6.0f} samples/s{at} (jobs "
                      f"{per_job}), {fmt(r['cpu_ms_per_sample'], '.1f')} CPU ms/sample, "
                      f"{time.monotonic() - t:.0f} s", flush=True)
                self.save()
            self.save()

    def save(self):
        if self.args.json_out:
            pathlib.Path(self.args.json_out).write_text(json.dumps(self.report, indent=1))

    def run(self):
        self.report["skipped"] = available(self.args.configs)
        for config, why in self.report["skipped"].items():
            print(f"skipping {config}: {why}", flush=True)
        t = time.monotonic()
        self.prepare_data()
        for name in self.args.scenarios:
            self.scenario(name)
        self.report["run_s"] = time.monotonic() - t
        self.save()
        text = markdown(self.report)
        print("\n" + text)
        if self.args.md_out:
            pathlib.Path(self.args.md_out).write_text(text)


def job_sleep_s(spec):
    """Seconds a job sleeps in its training steps over its planned samples."""
    batches = spec["epochs"] * math.ceil(spec["planned"] / spec["epochs"] / spec["batch"])
    return batches * spec["step_s"] * spec["batch"] / 64


def asked_rate(spec):
    """Samples/s the job would train at with a loader that never keeps it waiting."""
    return spec["planned"] / job_sleep_s(spec)


def step_ceiling(specs):
    """The aggregate no loader can pass: every sample over the longest job's sleep alone. None
    with a late joiner, whose start depends on the loader."""
    if any(s["late"] for s in specs):
        return None
    return sum(s["planned"] for s in specs) / max(job_sleep_s(s) for s in specs)


# ---------------------------------------------------------------- peers and versions

def available(configs):
    """{config: why it cannot run} for each configuration whose packages are missing."""
    checks = {"carpool": check_carpool, "dataloader": lambda: __import__("torchvision"),
              "webdataset": lambda: __import__("webdataset"),
              "dali": lambda: __import__("nvidia.dali.fn"),
              "tensorsocket": tensorsocket_compat}
    missing = {}
    for c in configs:
        try:
            checks[c]()
        except Exception as e:  # noqa: BLE001  any import failure means: skip this peer
            missing[c] = (f"{type(e).__name__}: {e}; install the peers with "
                          "scripts/bench_peers_venv.sh and run this script with its python")
    return missing


def check_carpool():
    import carpool
    carpool.binary()
    carpool.library_path()
