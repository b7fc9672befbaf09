#!/usr/bin/python3
"""Issue 9: carpool's GPU path end to end, against torchvision's DataLoader in the same run.

  bench_gpu.py [--count 20000] [--scenarios n1 n2 n4 overlap late slow batches] [--epochs 1]
               [--sides carpool baseline gpudecode tensorsocket]
               [--max-seconds 45] [--json-out F] [--md-out F] [--smoke]

Every job is a real ResNet-18 training process (spawned), on one GPU: bf16 autocast,
channels_last, batch 256 (job 0 of "batches": 64), SGD lr 0.1 momentum 0.9. Each scenario runs
once per side (--sides), back to back:
  carpool:  a fresh `carpool server --gpus N --workers W` and one carpool.Loader(device=cuda:N) per
            job, transform random_crop(224)|flip|normalize(imagenet)|float16|nhwc;
  baseline: torchvision ImageFolder + DataLoader(shuffle, pin_memory) per job, the same pipeline,
            the same W CPU workers split over the jobs, non_blocking copies to the GPU;
  gpudecode: per job, DataLoader workers read the files and the job decodes them on its GPU
            (torchvision.io.decode_jpeg, batched) with the same pipeline in transforms.v2 there;
  tensorsocket: TensorSocket's TensorProducer over the baseline's DataLoader, one per dataset
            (and, with --ts-late own, one for a late job), with its jobs' shares of the W
            workers; the jobs its TensorConsumers. Its pool puts the batches on the GPU and the
            jobs get them through CUDA IPC. Each job's epoch is checked from the delivered ids.
            Its packages: scripts/peer_wheels.sh.
Also measured in the run: the GPU's training rate on synthetic on-GPU input, and the server's
prepare rate (one job that drops its batches). They give each scenario's physical limit.
The server's cache and GPU area are a fraction of the prepared set (--cache-fraction, default
1.0 and 0.1): the carpool side runs each scenario once per fraction, a row each; the other sides
have no such cache, so they run once per scenario and their figures repeat in its other rows.
docs/benchmarks.md ("Issue 9: GPU end to end") gives the method and the columns; scripts/gpu_bench.sh
runs this on the GPU machine from the bundle. --smoke: 200 images, CPU, a tiny model, batch 8, to
test the orchestration without a GPU (the carpool side runs only where a carpool build exists)."""

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# After PYTHONPATH: the bundle's package (scripts/gpu_bench.sh) wins over the source tree's.
sys.path.append(str(HERE.parent / "client" / "python"))

import bench_cache  # noqa: E402
from bench_torchvision import imagenet_train_transform, job_workers  # noqa: E402

PREPARE = "resize=256,crop=256"
SAMPLE_BYTES = 256 * 256 * 3  # one prepared sample in the cache (uint8 HWC)
CROP = 224
OVERLAP_PARTS = 5  # overlap scenario: a shared core of S/5 ids plus a private S/5 per job
STALL_GRACE_S = 15  # TensorSocket: how long after the time cap a job blocked in its loader may take

# name: (description, dataset of each job, late jobs, slow jobs, each job's batch as a fraction
# of --batch-size (empty: all of it))
SCENARIOS = {
    "n1": ("1 job", ["all"], (), (), ()),
    "n2": ("2 jobs, same dataset", ["all"] * 2, (), (), ()),
    "n4": ("4 jobs, same dataset", ["all"] * 4, (), (), ()),
    "overlap": ("4 jobs, pairwise 50% overlap", [f"ov{i}" for i in range(4)], (), (), ()),
    "late": ("4 jobs, job 3 starts at 30%", ["all"] * 4, (3,), (), ()),
    "slow": ("2 jobs, job 1 at half speed", ["all"] * 2, (), (1,), ()),
    "batches": ("2 jobs, batch 64 and 256 (a quarter and all of --batch-size)", ["all"] * 2,
                (), (), (0.25, 1.0)),
}


def job_batches(name, batch_size):
    """Each job's batch size in scenario `name` (64 and 256 in "batches" at --batch-size 256)."""
    keys, parts = SCENARIOS[name][1], SCENARIOS[name][4]
    return tuple(max(1, int(batch_size * f)) for f in parts) if parts else (batch_size,) * len(keys)


# ---------------------------------------------------------------- a job (one spawned process)

def make_model(torch, spec, dev):
    from torch import nn
    torch.manual_seed(spec["seed"])
    if spec["model"] == "tiny":
        model = nn.Sequential(nn.Conv2d(3, 8, 7, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(8, spec["classes"]))
    else:
        import torchvision
        model = torchvision.models.resnet18(num_classes=spec["classes"])
    model = model.to(dev, memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def make_step(torch, model, opt, dev):
    loss_fn = torch.nn.CrossEntropyLoss()
    cuda = dev.type == "cuda"

    def step(x, y):
        if not cuda:
            x = x.float()  # CPU convolutions take no float16 (smoke mode)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return step


def carpool_batches(spec, timing):
    """The job's batches, then None at the end of its data; the loader closes when the generator
    does (batches.close()), so a job's clock never includes its close, timed into `timing`."""
    import carpool
    nhwc = "nhwc" in spec["transform"]
    to = spec["device"] if spec.get("loader_device") else None
    loader = carpool.Loader(spec["dataset"], batch_size=spec["batch_size"], epochs=spec["epochs"],
                            transform=spec["transform"],
                            device=spec.get("loader_device") or spec["device"],
                            socket=spec["socket"], seed=spec["seed"], prefetch=spec["prefetch"])
    if spec.get("probe"):  # scripts/gpu_probe.py: time the loader (a proxy on its calls)
        probe_loader(loader, spec, timing)
    try:
        for _ in range(loader.epochs):
            for images, labels in loader:
                if to:  # host batches copied to the training device (scripts/gpu_probe.py)
                    images, labels = images.to(to), labels.to(to)
                # NHWC permuted is channels_last NCHW: no copy. The loader hands the slot back
                # only once the GPU work queued on the batch has finished.
                yield (images.permute(0, 3, 1, 2) if nhwc else images), labels
        yield None
    finally:
        t = time.monotonic()
        loader._release_current()
        if loader._releaser is not None:  # the parts of close(), timed (scripts/gpu_probe.py)
            loader._releaser.close()
            loader._releaser = None
        timing["close_releaser_s"] = time.monotonic() - t
        t = time.monotonic()
        if loader._job is not None:
            loader._lib.carpool_job_free(loader._job)
            loader._job = None
        timing["close_job_s"] = time.monotonic() - t
        t = time.monotonic()
        loader.close()
        timing["close_rest_s"] = time.monotonic() - t


def probe_loader(loader, spec, timing):
    """scripts/gpu_probe.py's variants: time the loader's waits for the server (its _fetch), and
    try other ways of handing GPU slots back (spec["release_mode"]: "query" polls the event,
    "blocking" makes its wait sleep rather than spin)."""
    fetch = loader._fetch
    timing.update(fetch_s=0.0, arrivals=[], releases=[])

    def timed_fetch():
        t = time.monotonic()
        try:
            return fetch()
        finally:
            timing["fetch_s"] += time.monotonic() - t
            timing["arrivals"].append(time.monotonic())
    loader._fetch = timed_fetch

    class TimedLib:  # the loader's library, its slot releases timed
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            return getattr(self._lib, name)

        def carpool_batch_release(self, handle):
            timing["releases"].append(time.monotonic())
            return self._lib.carpool_batch_release(handle)
    loader._lib = TimedLib(loader._lib)
    mode = spec.get("release_mode")
    if mode is None:
        return
    import torch
    import carpool.loader as cl

    def run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, event = item
            while not event.query():
                time.sleep(0.0005)
            self._lib.carpool_batch_release(batch.handle)
    if mode == "query":
        cl._GpuReleaser._run = run
    elif mode == "blocking":
        def release_current():
            if loader._current is None:
                return
            event = torch.cuda.Event(blocking=True)
            event.record(torch.cuda.current_stream(loader._torch_device))
            if loader._releaser is None:
                loader._releaser = cl._GpuReleaser(loader._lib)
            loader._releaser.put(loader._current, event)
            loader._current = None
        loader._release_current = release_current


def torchvision_loader(spec, torch, go=None, indexed=False):
    """The baseline's DataLoader; `indexed`: items (image, label, ImageFolder index), so that the
    jobs can check their epochs from what they got (TensorSocket's producer)."""
    from torch.utils.data import DataLoader, Subset
    from torchvision import datasets, transforms
    tf = imagenet_train_transform(transforms, CROP)
    if indexed:
        from bench_peers import IndexedFolder
        data = IndexedFolder(spec, tf)
    else:
        data = datasets.ImageFolder(spec["root"], transform=tf)
        if spec["indices"] is not None:
            data = Subset(data, spec["indices"])
    torch.manual_seed(spec["seed"])
    sampler = None
    if spec.get("distributed"):  # a DDP rank: its share of each epoch (scripts/bench_ddp_gpu.py)
        from torch.utils.data.distributed import DistributedSampler
        sampler = DistributedSampler(data, shuffle=True, seed=spec["seed"])
    # The caller starts the workers (iter) before this job touches CUDA: workers forked from a
    # process with CUDA and cuDNN threads deadlocked on inherited locks (H100: 256 images in
    # 117 s), and forkserver workers took 60-100 s to start. They wait for `go` before their
    # first decode, so nothing is decoded before the clock.
    return DataLoader(data, batch_size=spec["batch_size"], shuffle=sampler is None, sampler=sampler,
                      num_workers=spec["workers"], pin_memory=spec["device"] != "cpu",
                      persistent_workers=spec["workers"] > 0,
                      multiprocessing_context="fork" if spec["workers"] > 0 else None,
                      worker_init_fn=(lambda _: go.wait()) if go is not None else None)


def baseline_batches(spec, loader, dev, torch, first):
    for epoch in range(spec["epochs"]):
        for images, labels in (first if epoch == 0 else loader):
            x = images.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
            yield x, labels.to(dev, non_blocking=True)


class _EncodedFiles:
    """ImageFolder's files as raw bytes (uint8 tensors) and labels: the DataLoader workers only
    read; the job decodes on its GPU (gpudecode_batches)."""

    def __init__(self, root, indices):
        from torchvision.datasets import ImageFolder
        self.samples = ImageFolder(root).samples
        self.indices = indices if indices is not None else range(len(self.samples))

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        # Bytes, not tensors: 256 small tensors a batch passed by file descriptor ran the
        # workers out of them (EBADF in os.dup).
        path, label = self.samples[self.indices[i]]
        return pathlib.Path(path).read_bytes(), label


def _collate_encoded(batch):
    return [x for x, _ in batch], [y for _, y in batch]


def gpudecode_loader(spec, torch, go=None):
    """Workers that read the files for torchvision's GPU decode (the peer of issue 13.3)."""
    from torch.utils.data import DataLoader
    torch.manual_seed(spec["seed"])
    return DataLoader(_EncodedFiles(spec["root"], spec["indices"]), batch_size=spec["batch_size"],
                      shuffle=True, num_workers=spec["workers"],
                      collate_fn=_collate_encoded,
                      persistent_workers=spec["workers"] > 0,
                      multiprocessing_context="fork" if spec["workers"] > 0 else None,
                      worker_init_fn=(lambda _: go.wait()) if go is not None else None)


def gpudecode_batches(spec, loader, dev, torch, first):
    """torchvision.io.decode_jpeg on the job's GPU (batched), then the same pipeline as the others
    with transforms.v2 on the GPU: resize 256, center crop 256, a random crop 224 and a flip per
    image, normalize; channels_last."""
    from torchvision.io import decode_jpeg
    try:
        from torchvision.transforms.v2 import functional as F
        flip_image = F.horizontal_flip
    except ImportError:  # torchvision < 0.15 (this machine's, for --smoke)
        from torchvision.transforms import functional as F
        flip_image = F.hflip
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1)
    gen = torch.Generator().manual_seed(spec["seed"])
    for epoch in range(spec["epochs"]):
        for raw, labels in (first if epoch == 0 else loader):
            encoded = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in raw]
            labels = torch.tensor(labels)
            try:  # batched on the GPU (torchvision >= 0.19)
                images = decode_jpeg(encoded, device=dev)
            except (TypeError, RuntimeError):  # one at a time: an older torchvision, or the CPU
                images = [decode_jpeg(e).to(dev) for e in encoded]
            images = [F.center_crop(F.resize(im, 256, antialias=True), 256) for im in images]
            n = len(images)
            off = torch.randint(0, 256 - CROP + 1, (n, 2), generator=gen).tolist()
            flip = torch.rand(n, generator=gen).tolist()
            crops = [im[:, y:y + CROP, x:x + CROP] for im, (y, x) in zip(images, off)]
            crops = [flip_image(c) if f < 0.5 else c for c, f in zip(crops, flip)]
            x = torch.stack(crops).float().div_(255).sub_(mean).div_(std)
            yield x.contiguous(memory_format=torch.channels_last), labels.to(dev, non_blocking=True)


def tensorsocket_producer(spec, go, done, out):
    """TensorSocket's producer as its README runs it: the baseline's DataLoader (its W workers,
    items carrying their ImageFolder index) wrapped in a TensorProducer, iterated epoch by epoch.
    Where CUDA is available its TensorPool copies each send into one of 10 buffers on the GPU
    (the first 10 sends allocate them) and the consumers get CUDA IPC handles of slices of it:
    the batches cross PCIe once, in the producer. It stays up until `done`: the jobs' batches are
    its memory. A spawned process; errors go to `out`."""
    try:
        import faulthandler
        import signal
        import torch
        from bench_peers import tensorsocket_compat, ts_ports
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a stuck one is
        torch.set_num_threads(1)  # the cores belong to its workers
        ts = tensorsocket_compat()
        loader = torchvision_loader(spec, torch, go, indexed=True)
        # iter(loader) in the constructor forks the (persistent) workers, before CUDA; they
        # wait for `go` before their first decode.
        producer = ts.TensorProducer(loader, producer_batch_size=spec["producer_batch"],
                                     **ts_ports(spec["ts_port"]))
        out.put(("ready", spec["job"], None))
        go.wait()
        for _ in range(spec["epochs"]):
            for _ in producer:
                if done.is_set():
                    return
        done.wait()
    except BaseException:
        out.put(("error", spec["job"], traceback.format_exc()))
        sys.exit(1)


def tensorsocket_batches(spec, dev, torch, timing):
    """A TensorConsumer's batches (created here, after the clock: it blocks until its producer
    announces the loader), made channels_last on the GPU as the baseline's. The delivered
    ImageFolder indices and the pixel sums of the first batch's first 16 samples go to
    `timing` (the epoch checks), at the generator's close."""
    from bench_peers import CHECKSUMS, tensorsocket_compat, ts_ports
    consumer = tensorsocket_compat().TensorConsumer(batch_size=spec["batch_size"],
                                                    **ts_ports(spec["ts_port"]))
    epochs, checksums = [], {}
    try:
        for _ in range(spec["epochs"]):
            ids = []
            epochs.append(ids)
            for images, labels, index in consumer:
                ids.append(index.clone())  # its pool slot is overwritten 10 sends later
                if not checksums:  # once, before the job's clock (its first batch)
                    checksums = {i: float(x.double().sum()) for i, x in
                                 zip(index[:CHECKSUMS].tolist(), images[:CHECKSUMS])}
                x = images.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
                yield x, labels.to(dev, non_blocking=True)
        yield None
    finally:
        timing["epochs"] = [torch.cat(e).tolist() if e else [] for e in epochs]
        timing["checksums"] = checksums


def synthetic_batches(x, y):
    while True:
        yield x, y


def run_job(spec, go, stop, progress, out, wrap=None):
    """One job's process body; `wrap` wraps its model (DistributedDataParallel for a DDP rank)."""
    import torch
    torch.set_num_threads(1)  # the cores belong to the loaders
    tv = tv_first = None
    if spec["side"] in ("baseline", "gpudecode"):  # workers forked now, before CUDA
        tv = (torchvision_loader if spec["side"] == "baseline" else gpudecode_loader)(spec, torch,
                                                                                    go)
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


class Bench:
    """One run: the data, the machine's limits, then each scenario's sides; the report as JSON."""

    def __init__(self, args):
        self.args = args
        self.cores = len(os.sched_getaffinity(0))
        self.gpu = gpu_index(args.device)
        self.sampler = GpuUtilSampler(self.gpu)
        self.report = {"config": {k: v for k, v in vars(args).items()}, "cores": self.cores,
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
                raise SystemExit(f"bench_gpu.py: catalog ids of {self.root} [{lo}, {hi}) are not "
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
            flags.update(gpus=gpus or str(self.gpu), gpu_cache_size=cache["gpu_cache_size"])
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
            results, ready, _ = run_jobs(specs, self.args.max_seconds, on_start=before, **kw)
            after = self.carpool.server_stats(socket=srv.socket)
            cpu = cpu_seconds(srv.proc.pid) - snap["cpu"]
        agg = aggregate(results, self.sampler)
        agg.update(server_deltas(snap["stats"], after, self.gpu or 0))
        prep, deliv = agg["preparations"], agg["deliveries"]
        agg.update(server_cpu_s=cpu, server_cpu_ms_per_image=ratio(cpu * 1e3, deliv),
                   server_cores_pct=100 * cpu / agg["wall_s"] / self.cores,
                   prep_per_delivery=ratio(prep, deliv))
        if deliv != agg["images"]:
            print(f"  note: server deliveries {deliv} != images the jobs trained on "
                  f"{agg['images']} (batches prefetched before a stop)", flush=True)
        return agg, ready

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
        """TensorSocket (issue 13.3): its producers as scripts/bench_peers.py plans them
        (tensorsocket_producers: one per dataset with its jobs' shares of the W workers; a late
        job's own one with --ts-late own, started as it joins, else one epoch more in the shared
        one), each a spawned process over the baseline's DataLoader, and the jobs as its
        consumers; the producers stay up until every job has ended. Adds each job's epoch checks
        from the delivered ids, and the producers' CPU (their workers' included)."""
        from bench_peers import epoch_check, order_z, pair_checks, tensorsocket_producers
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
        self.save()

    def save(self):
        if self.args.json_out:
            pathlib.Path(self.args.json_out).write_text(json.dumps(self.report, indent=1))

    def run(self):
        a = self.args
        self.carpool = import_carpool() if "carpool" in a.sides else None
        if self.carpool is None and "carpool" in a.sides:
            print("carpool binary or library not found: the carpool side is skipped", flush=True)
        from bench_peers import tensorsocket_compat, versions
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
        try:
            self.prepare_data()
            if self.carpool:
                self.register()
            self.measure_limits()
            for name in a.scenarios:
                self.scenario(name)
        finally:
            self.sampler.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        self.report["run_s"] = time.monotonic() - t
        self.save()
        text = markdown(self.report)
        print("\n" + text)
        if a.md_out:
            pathlib.Path(a.md_out).write_text(text)
        if self.errors:
            sys.exit("bench_gpu.py: failed: " + "; ".join(self.errors))


def server_deltas(s0, s1, gpu):
    """Counters of the scenario: stats after minus before, the GPU's from "gpus"."""
    prep = s1["preparations"] - s0["preparations"]
    deliv = s1["deliveries"] - s0["deliveries"]
    g0, g1 = gpu_entry(s0, gpu), gpu_entry(s1, gpu)
    out = {"preparations": prep, "deliveries": deliv}
    if g0 is None or g1 is None:
        return out
    d = {k: g1[k] - g0[k] for k in ("batches", "images", "uploads", "upload_bytes",
                                     "resident_hits", "resident_evictions", "assemble_seconds")}
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


def catalog_ids(state_dir, paths):
    """The sample id of each path (canonical, as the catalog stores it; docs/catalog.md)."""
    db = sqlite3.connect(f"file:{state_dir}/catalog.db?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT s.id, d.path, s.name FROM samples s JOIN dirs d "
                          "ON s.dir = d.id").fetchall()
    finally:
        db.close()
    by_path = {os.path.join(d, n): i for i, d, n in rows}
    missing = [p for p in paths if p not in by_path]
    if missing:
        raise SystemExit(f"bench_gpu.py: {len(missing)} images are not in the catalog, e.g. "
                         f"{missing[0]}")
    return [by_path[p] for p in paths]


def ensure_jpegs(data_dir, bench, count, carpool):
    """The folder of `count` synthetic 500x375 JPEGs (ImageFolder layout; default
    ~/.cache/carpool/BENCH/jpeg-COUNT-500x375), made by `carpool dataset gen` (PIL without
    carpool) unless it holds them already. Also used by scripts/bench_peers.py."""
    root = pathlib.Path(data_dir or pathlib.Path.home() / ".cache" / "carpool" / bench /
                        f"jpeg-{count}-500x375")
    have = sum(1 for _ in root.glob("class_*/*.jpg")) if root.exists() else 0
    if have != count:
        shutil.rmtree(root, ignore_errors=True)
        t = time.monotonic()
        if carpool:
            carpool.cli("dataset", "gen", root, "--count", count, "--seed", 1, "--quiet")
        else:
            write_jpegs_with_pil(root, count)
        print(f"generated {count} JPEGs 500x375 in {root} ({time.monotonic() - t:.1f} s)",
              flush=True)
    return root


def write_jpegs_with_pil(root, count, classes=10):
    """Synthetic 500x375 JPEGs in ImageFolder layout, for --smoke where no carpool binary exists."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(1)
    for c in range(classes):
        (root / f"class_{c:03}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img = rng.integers(0, 256, (375 // 25, 500 // 25, 3), dtype=np.uint8)
        Image.fromarray(img).resize((500, 375)).save(
            root / f"class_{i % classes:03}" / f"img_{i:06}.jpg", quality=90)


def import_carpool():
    """The carpool package, or None where the binary or libcarpool.so is missing."""
    try:
        import carpool
        carpool.binary()
        carpool.library_path()
        return carpool
    except (ImportError, RuntimeError) as e:
        print(f"bench_gpu.py: {e}", flush=True)
        return None


def fmt(x, spec=".0f"):
    return "–" if x is None else format(x, spec)


SIDE_NAMES = {"carpool": "carpool", "baseline": "DataLoader", "gpudecode": "GPU decode",
              "tensorsocket": "TensorSocket"}


def versus_best(rates, peers):
    """'carpool ÷ the best peer (its name)' of {side: img/s}."""
    best = max(((rates[x], x) for x in peers if rates.get(x) is not None), default=None)
    if not best or rates.get("carpool") is None:
        return "–"
    return f"{fmt(ratio(rates['carpool'], best[0]), '.2f')} ({SIDE_NAMES[best[1]]})"


# The scenario table: (header, value from (scenario row, carpool side, baseline side), format).
COLUMNS = [
    ("cache", lambda s, cp, bl: s["cache"]["label"], "s"),
    ("jobs", lambda s, cp, bl: s["jobs"], "d"),
    ("carpool img/s", lambda s, cp, bl: cp.get("images_per_s"), ".0f"),
    ("baseline img/s", lambda s, cp, bl: bl.get("images_per_s"), ".0f"),
    ("carpool ÷ baseline", lambda s, cp, bl: s.get("carpool_vs_baseline"), ".2f"),
    ("limit img/s", lambda s, cp, bl: s["limit_images_per_s"], ".0f"),
    ("carpool ÷ limit", lambda s, cp, bl: s.get("carpool_vs_limit"), ".2f"),
    ("GPU util % carpool", lambda s, cp, bl: cp.get("gpu_util_pct"), ".0f"),
    ("GPU util % baseline", lambda s, cp, bl: bl.get("gpu_util_pct"), ".0f"),
    ("server CPU ms/img", lambda s, cp, bl: cp.get("server_cpu_ms_per_image"), ".2f"),
    ("baseline workers CPU ms/img", lambda s, cp, bl: bl.get("workers_cpu_ms_per_image"), ".2f"),
    ("CPU/img baseline ÷ carpool", lambda s, cp, bl: s.get("cpu_per_image_baseline_vs_carpool"),
     ".1f"),
    ("server CPU % of cores", lambda s, cp, bl: cp.get("server_cores_pct"), ".0f"),
    ("prep ÷ deliv", lambda s, cp, bl: cp.get("prep_per_delivery"), ".3f"),
    ("H2D B/img", lambda s, cp, bl: cp.get("h2d_bytes_per_image"), ".0f"),
    ("unique B/img", lambda s, cp, bl: cp.get("unique_bytes_per_image"), ".0f"),
]


def rows(r):
    """The scenario rows, each row at another cache with its scenario's other sides (measured
    once, in its first row) filled in."""
    out = {}
    for key, s in r["scenarios"].items():
        base = r["scenarios"].get(s.get("peers_from"), {})
        out[key] = dict({k: v for k, v in base.items() if k in SIDE_NAMES and k != "carpool"},
                        **s)
    return out


def markdown(r):
    c = r["config"]
    scenarios = rows(r)
    lines = [f"{c['count']} JPEGs 500x375, prepare {PREPARE}, {r.get('device')} (torch "
             f"{r.get('torch')}), {r['cores']} cores, {c['workers']} loader workers, batch "
             f"{c['batch_size']}, {c['epochs']} epoch(s) (at most {c['max_seconds']} s), model "
             f"{c['model']}, slow job: {c['slow_mode']}, run {r.get('run_s', 0):.0f} s",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items() if v),
             f"GPU training rate alone: {fmt(r.get('gpu_rate'))} img/s; server prepare rate: "
             f"{fmt(r.get('prepare_rate_images_per_s'))} img/s",
             "carpool server: " + (f"look-ahead {c['lookahead']}" if c["lookahead"] else
                                   "its own look-ahead") + "; "
             f"{bench_cache.describe_set(c['prepared_set'])}; rows at " + "; ".join(
                 x["description"] for x in c["caches"]) +
             " (the other sides have no such cache: measured once per scenario, repeated in its "
             "rows at other caches)", "",
             "| scenario | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for name, s in scenarios.items():
        cp, bl = s.get("carpool", {}), s.get("baseline", {})
        lines.append(f"| {name}: {s['what']} | " + " | ".join(
            fmt(get(s, cp, bl), f) for _, get, f in COLUMNS) + " |")
    sides = [x for x in SIDE_NAMES if any(x in s for s in scenarios.values())]
    names = [SIDE_NAMES[x] for x in sides]
    lines += ["", f"| scenario | job | dataset | start s {' / '.join(names)} | " +
              " | ".join(f"{n} img/s" for n in names) + " |", "|---" * (4 + len(sides)) + "|"]
    for name, s in scenarios.items():
        for j, key in enumerate(s["datasets"]):
            js = [(s.get(x, {}).get("jobs") or [{}] * s["jobs"])[j] for x in sides]
            lines.append(f"| {name} | {j} | {key} | "
                         f"{' / '.join(fmt(x.get('start_offset_s'), '.1f') for x in js)} | " +
                         " | ".join(fmt(x.get("images_per_s")) for x in js) + " |")
    peers = [x for x in sides if x != "carpool"]
    if set(peers) - {"baseline"}:  # issue 13: carpool against every peer of the run
        lines += ["", "| scenario | " + " | ".join(f"{n} img/s" for n in names) +
                  " | carpool ÷ best peer | GPU util % " + " / ".join(names) + " |",
                  "|---" * (len(sides) + 3) + "|"]
        for name, s in scenarios.items():
            rates = {x: s.get(x, {}).get("images_per_s") for x in sides}
            lines.append(f"| {name} | " + " | ".join(
                fmt(rates[x]) if "error" not in s.get(x, {}) else "failed" for x in sides) +
                f" | {versus_best(rates, peers)} | " +
                " / ".join(fmt(s.get(x, {}).get("gpu_util_pct")) for x in sides) + " |")
        lines += ["", "From the first go to the last end, first batches and start-up included:",
                  "", "| scenario | " + " | ".join(f"{n} img/s" for n in names) +
                  " | carpool ÷ best peer |", "|---" * (len(sides) + 2) + "|"]
        for name, s in scenarios.items():
            rates = {x: rate_from_go(s.get(x), c["batch_size"]) for x in sides}
            lines.append(f"| {name} | " + " | ".join(fmt(rates[x]) for x in sides) +
                         f" | {versus_best(rates, peers)} |")
    if "tensorsocket" in sides:
        lines += ["", "| scenario | producers | TensorSocket img/s per job | epochs (per job) | "
                  "order z vs listing | order ρ between jobs | same pixels across jobs | first "
                  "batch after s | producer CPU ms/img | notes |", "|---" * 10 + "|"]
        for name, s in scenarios.items():
            t = s.get("tensorsocket")
            if not t or s.get("peers_from"):
                continue
            if "jobs" not in t:
                lines.append(f"| {name} | {t.get('error')} |" + " |" * 8)
                continue
            js = t["jobs"]
            notes = t["notes"] + [f"producer {e}" for e in t["producer_errors"]]
            lines.append(
                f"| {name} | {t['producers']} | "
                f"{' / '.join(fmt(j['images_per_s']) for j in js)} | "
                f"{' / '.join(j['epoch_check'] for j in js)} | "
                f"{' / '.join(fmt(j['order_z'], '.1f') for j in js)} | "
                f"{fmt(t['order_rho_max'], '.2f')} | {'yes' if t['same_pixels'] else 'no'} | "
                f"{' / '.join(fmt(j.get('startup_s'), '.1f') for j in js)} | "
                f"{fmt(t['producer_cpu_ms_per_image'], '.2f')} | {'; '.join(notes)} |")
    lines += [f"- FAILED: {e}" for e in r["errors"]]
    return "\n".join(lines) + "\n"


def parser():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, help="synthetic JPEGs (default 20000; smoke 200)")
    ap.add_argument("--data-dir", help="image folder (default ~/.cache/carpool/bench-gpu/...)")
    ap.add_argument("--state-dir", help="catalog and socket (default: a temporary folder)")
    ap.add_argument("--log-dir", help="server logs (default: the temporary folder)")
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--sides", nargs="+", choices=list(SIDE_NAMES),
                    default=["carpool", "baseline"],
                    help="baseline: a DataLoader per job; gpudecode: torchvision.io.decode_jpeg on "
                         "the GPU + transforms.v2 there, per job; tensorsocket: one TensorProducer "
                         "over the baseline's DataLoader per dataset, the jobs its consumers "
                         "(issue 13's GPU peers; tensorsocket needs scripts/peer_wheels.sh)")
    ap.add_argument("--ts-late", choices=["own", "shared"], default="own",
                    help="tensorsocket, late scenario: the late job gets a producer of its own "
                         "(default), or joins the others' (served from its next epoch only; it "
                         "stalls once the on-time jobs have left)")
    ap.add_argument("--device", help="default cuda:0; smoke cpu")
    ap.add_argument("--model", choices=["resnet18", "tiny"], help="default resnet18; smoke tiny")
    ap.add_argument("--batch-size", type=int, help="default 256; smoke 8")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, help="per scenario and side (default 45)")
    ap.add_argument("--rate-seconds", type=float, help="GPU rate run (default 10; smoke 2)")
    ap.add_argument("--workers", type=int, help="CPU workers, all jobs together (default: cores)")
    bench_cache.add_arguments(ap, "server cache in bytes, e.g. 8GiB, instead of --cache-fraction")
    ap.add_argument("--gpu-cache-size",
                    help="GPU device-resident area in bytes, e.g. 4GiB (default: the same "
                         "fraction of the prepared set as the server cache)")
    # The runs of docs/benchmarks.md before this default passed --lookahead 4096.
    ap.add_argument("--lookahead", type=int,
                    help="server look-ahead in samples, passed only when given (default: the "
                         "server's own)")
    ap.add_argument("--prefetch", type=int, default=8, help="batches per job ahead (default 8)")
    ap.add_argument("--transform", default="random_crop(224)|flip|normalize(imagenet)|float16|nhwc")
    ap.add_argument("--warmup", type=int, help="untimed steps per job (default 5; smoke 1)")
    ap.add_argument("--slow-mode", choices=["twice", "sleep"], default="twice",
                    help="half speed: train twice on each batch, or sleep one step time")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the whole orchestration")
    return ap


def finish_args(args):
    """Fills the defaults of a full (GPU) or --smoke run; exits on a bad value."""
    smoke = {"count": 200, "device": "cpu", "model": "tiny", "batch_size": 8, "max_seconds": 60,
             "rate_seconds": 2, "workers": 2, "warmup": 1}
    full = {"count": 20000, "device": "cuda:0", "model": "resnet18", "batch_size": 256,
            "max_seconds": 45, "rate_seconds": 10, "workers": len(os.sched_getaffinity(0)),
            "warmup": 5}
    for k, v in (smoke if args.smoke else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.count, args.batch_size, args.epochs, args.workers) < 1:
        sys.exit("bench_gpu.py: --count, --batch-size, --epochs and --workers must be >= 1")
    if args.lookahead is not None and args.lookahead < 1:
        sys.exit(f"bench_gpu.py: --lookahead {args.lookahead}: give at least 1 sample, or leave "
                 "it out for the server's own")
    args.prepared_set = bench_cache.prepared_set(args.count, SAMPLE_BYTES)
    args.caches = bench_cache.choose("bench_gpu.py", args.prepared_set, args.cache_fraction,
                                     args.cache_size, args.gpu_cache_size,
                                     gpu=gpu_index(args.device) is not None)
    if "overlap" in args.scenarios and args.count < OVERLAP_PARTS:
        sys.exit(f"bench_gpu.py: the overlap scenario needs --count >= {OVERLAP_PARTS}")
    return args


def main():
    Bench(finish_args(parser().parse_args())).run()


if __name__ == "__main__":
    main()
