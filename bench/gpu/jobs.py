"""A GPU benchmark job's process (its training loop and timings) and the orchestrator that runs
a scenario's jobs together, with the machine's CPU and GPU accounting."""

import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import shutil
import subprocess
import sys
import threading
import time
import traceback

from bench.common import CROP
from bench.gpu.sides import (baseline_batches, carpool_batches, gpudecode_batches,
                             gpudecode_loader, inproc_batches, make_model, make_step,
                             synthetic_batches, tensorsocket_batches, torchvision_loader)


def run_job(spec, go, stop, progress, out, wrap=None):
    """One job's process body; `wrap` wraps its model (DistributedDataParallel for a DDP rank)."""
    import torch
    torch.set_num_threads(1)  # the cores belong to the loaders
    tv = tv_first = None
    if spec["side"] in ("baseline", "gpudecode", "inproc"):  # workers forked now, before CUDA
        tv = (torchvision_loader(spec, torch, go) if spec["side"] == "baseline"
              else gpudecode_loader(spec, torch, go, packed=spec["side"] == "inproc"))
        tv_first = iter(tv)
    dev = torch.device(spec["device"])
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    step, step_s = None, 0.0
    if spec["side"] not in ("drop", "sleep"):
        model, opt = make_model(torch, spec, dev)
        if wrap is not None:
            model = wrap(model)
        step = make_step(torch, model, opt, dev)
        b = spec["batch_size"]
        x0 = torch.randn(b, 3, CROP, CROP, device=dev).to(memory_format=torch.channels_last)
        x0, y0 = x0.half() if cuda else x0, torch.randint(0, spec["classes"], (b,), device=dev)
        # The epoch's last, partial batch has a shape of its own: cuDNN (benchmark mode) would
        # pick its kernels on the clock (H100: 1.1 s, a fifth of a 20,000-image epoch).
        if spec["tail"]:
            step(x0[:spec["tail"]], y0[:spec["tail"]])
        for _ in range(spec["warmup"] + 1):  # cuDNN picks its kernels here, before the clock
            t = time.monotonic()
            step(x0, y0)
            if cuda:
                torch.cuda.synchronize()
            step_s = time.monotonic() - t
    out.put(("ready", spec["job"], {"torch": torch.__version__, "step_s": step_s,
                                    "device": torch.cuda.get_device_name(dev) if cuda else "cpu"}))
    go.wait()
    start, cpu0 = time.monotonic(), os.times()
    timing = {}
    batches = (carpool_batches(spec, timing) if spec["side"] in ("carpool", "drop", "sleep")
               else gpudecode_batches(spec, tv, dev, torch, tv_first)
               if spec["side"] == "gpudecode"
               else inproc_batches(spec, tv, dev, torch, tv_first)
               if spec["side"] == "inproc"
               else tensorsocket_batches(spec, dev, torch, timing)
               if spec["side"] == "tensorsocket"
               else baseline_batches(spec, tv, dev, torch, tv_first) if tv is not None
               else synthetic_batches(x0, y0))
    # Rates are steady-state on both sides: from the first batch's arrival, that batch not
    # counted. What came before (the DataLoader starting its workers, a carpool job joining and
    # waiting for its first batch) is reported as startup_s.
    images = steps = first_images = 0
    go_t, first_t, batch_device = start, None, None
    wait_s = 0.0  # time the training loop waited for its next batch, after the first
    waits = []  # each batch's wait, ms
    step_call_s = 0.0  # in step(): launching the GPU work (and waiting, where torch blocks)
    backlog, backlogs = [], []  # events of unfinished steps; their count after each step
    while True:
        t_wait = time.monotonic()
        try:
            batch = next(batches)
        except StopIteration:
            break
        if batch is None:  # the end of data, before the loader closes
            break
        x, y = batch
        if first_t is not None:
            wait_s += time.monotonic() - t_wait
            waits.append(1e3 * (time.monotonic() - t_wait))
        if first_t is None:
            first_t = time.monotonic()
            start, images, first_images = first_t, -len(y), len(y)
            batch_device = str(x.device)
        t_step = time.monotonic()
        for _ in range(spec["repeat"] if step else 0):
            step(x, y)
            steps += 1
        step_call_s += time.monotonic() - t_step
        if cuda and step:  # the GPU's backlog: steps launched and not finished yet
            backlog.append(torch.cuda.Event())
            backlog[-1].record()
            while backlog and backlog[0].query():
                backlog.pop(0)
            backlogs.append(len(backlog))
        if spec["sleep"]:
            time.sleep(spec.get("sleep_s") or step_s)
        images += len(y)
        progress[spec["job"]] = images
        if stop.is_set():
            break
    t_sync = time.monotonic()
    if cuda:
        torch.cuda.synchronize()
    end = time.monotonic()
    sync_s = end - t_sync
    # The DataLoader's workers come from a forkserver, so they are not this process's children:
    # read their CPU time before they exit (persistent workers live on the loader's iterator).
    worker_pids = [w.pid for w in getattr(getattr(tv, "_iterator", None), "_workers", [])]
    forked_cpu = 0.0
    for pid in worker_pids:
        try:
            forked_cpu += cpu_seconds(pid)
        except OSError:  # already gone: its time is lost, the figure is a lower bound
            pass
    t_close = time.monotonic()
    batches.close()  # detaches from the server / joins the DataLoader's workers
    close_s = time.monotonic() - t_close
    cpu1 = os.times()
    out.put(("done", spec["job"], {
        "job": spec["job"], "dataset": spec["dataset_key"], "images": images, "steps": steps,
        "start": start, "end": end, "seconds": end - start,
        "startup_s": (first_t - go_t) if first_t is not None else None,
        "first_images": first_images,
        "wait_s": wait_s, "wait_fraction": wait_s / (end - start) if end > start else None,
        "images_per_s": images / (end - start) if end > start else 0.0,
        "job_cpu_s": cpu1.user + cpu1.system - cpu0.user - cpu0.system,
        "workers_cpu_s": (forked_cpu + cpu1.children_user + cpu1.children_system
                          - cpu0.children_user - cpu0.children_system),
        "workers": spec["workers"], "wait_ms": percentiles(waits), "close_s": close_s,
        "step_call_s": step_call_s, "final_sync_s": sync_s, "batch_device": batch_device,
        "gpu_backlog_steps": percentiles(backlogs), **timing}))


def percentiles(xs):
    """p50, p90, p99 and max of a list (None when empty)."""
    if not xs:
        return None
    xs = sorted(xs)
    return {f"p{q}": xs[min(len(xs) - 1, int(q / 100 * len(xs)))] for q in (50, 90, 99)} | {
        "max": xs[-1]}


def job_process(spec, go, stop, progress, out):
    try:
        run_job(spec, go, stop, progress, out)
    except BaseException:
        out.put(("error", spec["job"], traceback.format_exc()))
        sys.exit(1)


# ---------------------------------------------------------------- the orchestrator

def run_jobs(specs, max_seconds, late=(), late_at=0.3, on_start=None, ready_timeout=600.0,
             target_of=lambda spec: job_process, stall_grace=None, on_late=None):
    """Runs one process per spec; all but `late` start together once every one is warm, the late
    ones when the others reached `late_at` of their planned images. At max_seconds every job is
    told to stop after its current batch. With stall_grace, a job still running stall_grace s
    after that (blocked in its loader, so it never sees the stop) is ended and reported with
    "stalled" and the images it had (stalled()). on_late(job) is called as a late job is told to
    go. Returns (results, ready infos, t0)."""
    ctx = mp.get_context("spawn")  # no fork after CUDA; each job a fresh interpreter
    n = len(specs)
    progress, stop, out = ctx.Array("q", n), ctx.Event(), ctx.Queue()
    gos = [ctx.Event() for _ in specs]
    # Not daemonic: a baseline job's DataLoader starts worker processes of its own.
    procs = [ctx.Process(target=target_of(s), args=(s, gos[i], stop, progress, out))
             for i, s in enumerate(specs)]
    ready, results = {}, {}

    def receive(timeout):
        try:
            kind, job, payload = out.get(timeout=timeout)
        except queue_mod.Empty:
            for i, p in enumerate(procs):
                if not p.is_alive() and i not in results and p.exitcode not in (None, 0):
                    raise SystemExit(f"job {i} ({specs[i]['side']}) exited with {p.exitcode}; "
                                     "see its error above")
            return
        if kind == "error":
            print(payload, file=sys.stderr, flush=True)
            raise SystemExit(f"job {job} ({specs[job]['side']}) failed: "
                             f"{payload.strip().splitlines()[-1]}")
        (ready if kind == "ready" else results)[job] = payload

    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + ready_timeout
        while len(ready) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"jobs not ready after {ready_timeout:.0f} s")
            receive(0.5)
        if on_start:
            on_start()
        t0 = time.monotonic()
        waiting = [i for i in range(n) if i in late]
        went = {}
        for i in range(n):
            if i not in late:
                gos[i].set()
                went[i] = t0
        while len(results) < n:
            receive(0.1)
            if not stop.is_set() and time.monotonic() - t0 > max_seconds:
                stop.set()
            on_time = [i for i in range(n) if i not in late]
            if waiting and (stop.is_set() or all(i in results for i in on_time) or min(
                    progress[i] / specs[i]["planned"] for i in on_time) >= late_at):
                went[waiting[0]] = time.monotonic()
                if on_late:
                    on_late(waiting[0])
                gos[waiting.pop(0)].set()
            if stall_grace is not None and time.monotonic() - t0 > max_seconds + stall_grace:
                for i in set(range(n)) - set(results):
                    results[i] = stalled(specs[i], went.get(i, t0), progress[i])
                    procs[i].terminate()
        for p in procs:
            p.join(60)
        return [results[i] for i in range(n)], [ready[i] for i in range(n)], t0
    finally:
        stop.set()
        for g in gos:
            g.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join()


def stalled(spec, went, progress):
    """The result of a job that never ended: the images its progress counter had (those after
    its first batch), over the time from its go; no steady-state rate."""
    end = time.monotonic()
    images = max(0, progress)
    return {"job": spec["job"], "dataset": spec["dataset_key"], "images": images, "steps": None,
            "start": went, "end": end, "seconds": end - went, "startup_s": None,
            "images_per_s": images / (end - went), "workers": spec["workers"],
            "stalled": f"stalled after {images} images"}


def tree_cpu_seconds(pids):
    """CPU seconds (user + system) of processes and all their descendants (psutil); None without
    psutil."""
    try:
        import psutil
    except ImportError:
        return None
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class GpuUtilSampler:
    """nvidia-smi sampling utilization.gpu every 200 ms for the whole run; the mean over a window.
    Without nvidia-smi (a CPU machine) every mean is None."""

    def __init__(self, index):
        self.samples, self.proc = [], None
        if shutil.which("nvidia-smi") and index is not None:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(index), "--query-gpu=utilization.gpu",
                 "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line)))
            except ValueError:
                pass

    def mean(self, t0, t1):
        xs = [v for t, v in self.samples if t0 <= t <= t1]
        return sum(xs) / len(xs) if xs else None

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


def gpu_index(device):
    return int(device.split(":")[1]) if device.startswith("cuda:") else (
        0 if device == "cuda" else None)


def aggregate(results, sampler):
    start, end = min(r["start"] for r in results), max(r["end"] for r in results)
    images = sum(r["images"] for r in results)
    return {"images": images, "wall_s": end - start, "start": start, "end": end,
            "images_per_s": images / (end - start) if end > start else 0.0,
            "gpu_util_pct": sampler.mean(start, end), "jobs": results}


def ratio(a, b):
    return a / b if a is not None and b else None


def batches_key(batches):
    """'256+256' for two jobs of batch 256: the key of a GPU training rate."""
    return "+".join(map(str, batches))


def rate_from_go(agg, batch):
    """All the images of a side's jobs, their first batches included, over the time from the
    first go to the last end: the rate with every loader's start-up (and read-ahead before the
    first batch) counted, which short runs need beside the steady-state images_per_s."""
    jobs = (agg or {}).get("jobs")
    if not jobs:
        return None
    images = sum(j["images"] + (j.get("first_images", batch) if j.get("startup_s") is not None
                                else 0) for j in jobs)
    span = max(j["end"] for j in jobs) - min(j["start"] - (j.get("startup_s") or 0) for j in jobs)
    return images / span if span > 0 else None
