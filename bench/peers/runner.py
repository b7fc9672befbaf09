"""The peers benchmark's processes (a job, a TensorSocket producer) and the orchestrator of one
configuration's run, with its CPU accounting."""

import multiprocessing as mp
import queue as queue_mod
import sys
import threading
import time
import traceback

from bench.common import CHECKSUMS, tensorsocket_compat, ts_ports
from bench.peers.scenarios import LATE_AT, STALL_GRACE_S
from bench.peers.sources import SOURCES, make_dataloader


def run_job(spec, go, stop, progress, out):
    import torch
    torch.set_num_threads(1)  # the cores belong to the loaders
    source = SOURCES[spec["config"]](spec)
    out.put(("ready", spec["job"], None))
    go.wait()
    start = time.monotonic()
    source.start()
    epochs, checksums, images, first = [], {}, 0, None
    step_s = spec["step_s"] * spec["batch"] / 64
    for _ in range(spec["epochs"]):
        ids = []
        for batch, batch_ids in source.epoch():
            first = first or time.monotonic() - start
            ids += batch_ids
            for k in range(min(len(batch_ids), CHECKSUMS - len(checksums))):
                checksums[batch_ids[k]] = float(batch[k].double().sum())
            images += len(batch_ids)
            progress[spec["job"]] = images
            time.sleep(step_s)
            if stop.is_set():
                break
        epochs.append(ids)
        if stop.is_set():
            break
    end = time.monotonic()
    source.close()
    out.put(("done", spec["job"], {"start": start, "end": end, "images": images,
                                   "first_batch_s": first, "epochs": epochs,
                                   "checksums": checksums}))


def run_producer(spec, go, stop, out):
    """TensorSocket's producer as its README runs it: a DataLoader wrapped in a TensorProducer,
    iterated epoch by epoch. It never ends by itself without consumers (it idles), so the
    orchestrator ends it once every job is done."""
    ts = tensorsocket_compat()
    loader = make_dataloader(spec, spec["workers"], spec["batch"])
    out.put(("ready", spec["job"], None))
    go.wait()
    producer = ts.TensorProducer(loader, producer_batch_size=spec["producer_batch"],
                                 **ts_ports(spec["ts_port"]))
    for _ in range(spec["epochs"]):
        for _ in producer:
            if stop.is_set():
                return


def process_main(target, spec, *args):
    out = args[-1]
    try:
        target(spec, *args)
    except BaseException:
        out.put(("error", spec["job"], traceback.format_exc()))
        sys.exit(1)


# ---------------------------------------------------------------- CPU time of the process tree

class TreeCpu:
    """CPU seconds (user + system) of every descendant of this process, sampled every 0.1 s from
    start() to stop(): a process that exits loses at most its last 0.1 s, so the figure is a
    lower bound (within about 1% for runs of tens of seconds)."""

    def __init__(self):
        import psutil
        self.psutil, self.first, self.last = psutil, {}, {}
        self.running = False

    def sample(self, baseline=False):
        for p in self.psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()
            except self.psutil.Error:  # exited between the listing and the read
                continue
            key = (p.pid, p.create_time())
            self.first.setdefault(key, t.user + t.system if baseline else 0.0)
            self.last[key] = t.user + t.system

    def start(self):
        self.sample(baseline=True)
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while self.running:
            time.sleep(0.1)
            self.sample()

    def stop(self):
        self.sample()
        self.running = False
        self.thread.join()
        return sum(self.last[k] - self.first[k] for k in self.last)


# ---------------------------------------------------------------- the orchestrator

class Run:
    """The processes of one scenario under one configuration: helpers (producers), then jobs;
    the clock starts when all are warm, late jobs when the others reached LATE_AT."""

    def __init__(self, specs, helpers, max_seconds):
        self.ctx = mp.get_context("spawn")  # fresh interpreters: no inherited threads or locks
        self.specs, self.helpers, self.max_seconds = specs, helpers, max_seconds
        self.out, self.stop = self.ctx.Queue(), self.ctx.Event()
        self.progress = self.ctx.Array("q", len(specs))
        self.gos = [self.ctx.Event() for _ in specs]
        self.helper_go = self.ctx.Event()
        self.procs = [self.ctx.Process(target=process_main,
                                       args=(run_job, s, self.gos[i], self.stop, self.progress,
                                             self.out)) for i, s in enumerate(specs)]
        # Helpers report as jobs -1, -2... so their errors name them.
        self.helper_procs = [self.ctx.Process(target=process_main,
                                              args=(run_producer, h, self.helper_go, self.stop,
                                                    self.out)) for h in helpers]

    def receive(self, got, timeout):
        try:
            kind, job, payload = self.out.get(timeout=timeout)
        except queue_mod.Empty:
            dead = [p for p in self.procs + self.helper_procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a process exited with {dead[0].exitcode}; see above")
            return
        if kind == "error":
            print(payload, file=sys.stderr, flush=True)
            raise RuntimeError(f"job {job} failed: {payload.strip().splitlines()[-1]}")
        got[kind][job] = payload

    def go(self, cpu):
        got = {"ready": {}, "done": {}}
        for p in self.helper_procs + self.procs:
            p.start()
        deadline = time.monotonic() + 300
        while len(got["ready"]) < len(self.specs) + len(self.helpers):
            if time.monotonic() > deadline:
                raise RuntimeError("processes not ready after 300 s")
            self.receive(got, 0.5)
        cpu.start()
        t0 = time.monotonic()
        self.helper_go.set()
        late = [i for i, s in enumerate(self.specs) if s["late"]]
        on_time = [i for i in range(len(self.specs)) if i not in late]
        went = {}
        for i in on_time:
            self.gos[i].set()
            went[i] = time.monotonic()
        while len(got["done"]) < len(self.specs):
            self.receive(got, 0.1)
            if time.monotonic() - t0 > self.max_seconds:
                self.stop.set()
            if time.monotonic() - t0 > self.max_seconds + STALL_GRACE_S:
                break  # a job blocked in its loader never sees the stop: give up on it
            if late and (self.stop.is_set() or all(i in got["done"] for i in on_time) or min(
                    self.progress[i] / self.specs[i]["planned"] for i in on_time) >= LATE_AT):
                went[late[0]] = time.monotonic()
                self.gos[late.pop(0)].set()
        return [got["done"].get(i) or self.stalled(i, went.get(i, t0))
                for i in range(len(self.specs))]

    def stalled(self, i, went):
        """What is known of a job that never finished: its sample count, not its ids."""
        return {"start": went, "end": time.monotonic(), "images": self.progress[i],
                "first_batch_s": None, "epochs": [], "checksums": {},
                "stalled": f"stalled after {self.progress[i]} samples"}

    def close(self):
        self.stop.set()
        self.helper_go.set()
        for g in self.gos:
            g.set()
        for p in self.procs:
            p.join(20)
        for p in self.procs + self.helper_procs:
            if p.is_alive():
                p.terminate()
                p.join()
