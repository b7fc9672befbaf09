#!/usr/bin/env python3
"""Issue 13 (CPU part): carpool against the loaders users would pick instead, on the same data.

  scripts/bench_peers_venv.sh      # once: the peers in ~/.cache/carpool/bench-venv
  ~/.cache/carpool/bench-venv/bin/python scripts/bench_peers.py [--quick] [--count 2500]
      [--scenarios ...] [--configs ...] [--workers 4] [--max-seconds 60]
      [--wds-shard-size 50] [--json-out F] [--md-out F] | --wds-model

Configurations, each with the same W workers in all (--workers) and the same pipeline: decode,
resize 256, centre crop 256, random crop 224, flip, normalize (ImageNet), float32 NCHW:
  carpool       `carpool server --workers W`, one carpool.Loader per job;
  dataloader    torchvision ImageFolder + DataLoader(shuffle=True) per job, W split over the jobs;
  dali          a DALI CPU pipeline per job (fn.readers.file, fn.decoders.image on the CPU, resize,
                crop, fn.crop_mirror_normalize), num_threads = W split over the jobs;
  tensorsocket  one TensorProducer over a DataLoader with W workers, one TensorConsumer per job;
                where one producer cannot serve the scenario, what a user must do instead;
  webdataset    webdataset's own loader per job over tar shards of the same JPEGs (written once
                with its ShardWriter, in a fixed shuffled order, --wds-shard-size per shard):
                WebDataset(shards, shardshuffle=100).shuffle(1000).decode("pil").map(pipeline)
                in a DataLoader with W split over the jobs.
Each job is a process that sleeps --step-ms per 64 samples (its simulated training step). The
report: aggregate and per-job samples/s, CPU seconds of every process of the configuration per
delivered sample, each job's epoch checked from the delivered sample ids (exactly once, order
against the listing, how well it mixes webdataset's shards, order shared with another job,
augmentation shared with another job), and carpool's preparations per delivery against the
scenario's lower bound. The carpool server's cache is a fraction of the prepared set
(--cache-fraction, default 1.0 and 0.1): carpool runs each scenario once per fraction, a row
each; the other configurations have no such cache, so they run once per scenario and their
figures repeat in its other rows. --wds-model prints webdataset's order model without images.
docs/peers.md has the method and the results."""

import argparse
import json
import math
import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "client" / "python"))

import bench_cache  # noqa: E402
from bench_gpu import SAMPLE_BYTES, catalog_ids, ensure_jpegs  # noqa: E402
from bench_torchvision import imagenet_train_transform, job_workers  # noqa: E402

PREPARE = "resize=256,crop=256"
TRANSFORM = "random_crop(224)|flip|normalize(imagenet)|float32|nchw"
CROP = 224
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
CONFIGS = ["carpool", "dataloader", "dali", "tensorsocket", "webdataset"]
LATE_AT = 0.3  # the late joiner starts when the others have delivered 30% of their epoch
CHECKSUMS = 16  # samples per job whose pixel sums are compared across jobs
STALL_GRACE_S = 15  # after the time cap, how long a job may take to notice the stop
TS_PORTS = 5555  # TensorSocket's default ports; a second producer takes the next four
# webdataset: its shard shuffle buffer (shards, per DataLoader worker) and sample shuffle buffer
# (samples, per worker; .shuffle(1000) as in its documentation).
WDS_SHARD_SHUFFLE = 100
WDS_SHUFFLE = 1000
MIX_WINDOW = 64  # deliveries per window of the shard-mix check


class Job:
    """One job of a scenario: its dataset, batch size, step time per 64 samples (x --step-ms)
    and whether it joins late."""

    def __init__(self, dataset="all", batch=64, speed=1.0, late=False):
        self.dataset, self.batch, self.speed, self.late = dataset, batch, speed, late


# name: (description, jobs). "speeds" scales by --speeds-step-ms instead of --step-ms.
SCENARIOS = {
    "n1": ("1 job", [Job()]),
    "n4": ("4 jobs, same dataset, in lockstep", [Job() for _ in range(4)]),
    "overlap": ("2 jobs, datasets overlapping 50%", [Job("ov0"), Job("ov1")]),
    "late": ("2 jobs, job 1 joins at 30% of job 0's epoch", [Job(), Job(late=True)]),
    "speeds": ("2 jobs, job 1 trains at half speed", [Job(), Job(speed=2.0)]),
    "batches": ("2 jobs, batch 64 and batch 256", [Job(), Job(batch=256)]),
}


# ---------------------------------------------------------------- the sources, in a job process

class CarpoolSource:
    def __init__(self, spec):
        import carpool
        self.carpool, self.spec = carpool, spec
        self.index = spec["catalog_to_index"]  # catalog id -> ImageFolder index

    def start(self):  # the job joins the server here, after the clock starts
        s = self.spec
        self.loader = self.carpool.Loader(s["dataset"], batch_size=s["batch"], epochs=s["epochs"],
                                          transform=TRANSFORM, socket=s["socket"],
                                          seed=s["job"] + 1)

    def epoch(self):
        for images, _ in self.loader:
            yield images, [self.index[i] for i in self.loader.ids.tolist()]

    def close(self):
        self.loader.close()


class IndexedFolder:
    """ImageFolder restricted to the job's indices; each item is (image, label, index), so the
    job can check its epoch from what it received. Module-level: DataLoader workers pickle it."""

    def __init__(self, spec, transform):
        from torchvision import datasets
        self.folder = datasets.ImageFolder(spec["root"], transform=transform)
        self.indices = spec["indices"] or range(len(self.folder))  # None: the whole folder

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        image, label = self.folder[self.indices[i]]
        return image, label, self.indices[i]


def make_dataloader(spec, workers, batch):
    import warnings
    import torch
    from torch.utils.data import DataLoader
    from torchvision import transforms
    torch.manual_seed(spec["job"] + 1)
    # W workers on fewer cores is the point of "the same W for every configuration".
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    data = IndexedFolder(spec, imagenet_train_transform(transforms, CROP))
    # fork, Linux's default: this process was spawned, and its children would be too.
    return DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers,
                      multiprocessing_context="fork")


class DataLoaderSource:
    def __init__(self, spec):
        self.loader = make_dataloader(spec, spec["workers"], spec["batch"])

    def start(self):
        pass  # the workers fork at the first iter(), after the clock starts

    def epoch(self):
        for images, _, index in self.loader:
            yield images, index.tolist()

    def close(self):
        pass


class DaliSource:
    def __init__(self, spec):
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def
        self.spec = spec
        files = [spec["paths"][i] for i in spec["indices"]]

        @pipeline_def(batch_size=spec["batch"], num_threads=spec["workers"], device_id=None,
                      seed=spec["job"] + 1)
        def pipe():
            # The labels carry the ImageFolder index: DALI exposes no sample id otherwise.
            jpegs, index = fn.readers.file(files=files, labels=spec["indices"], name="Reader",
                                           random_shuffle=True, pad_last_batch=True)
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            images = fn.crop(images, crop=(256, 256))
            images = fn.crop_mirror_normalize(
                images, crop=(CROP, CROP), crop_pos_x=fn.random.uniform(range=(0, 1)),
                crop_pos_y=fn.random.uniform(range=(0, 1)), mirror=fn.random.coin_flip(),
                dtype=types.FLOAT, output_layout="CHW", mean=[255 * m for m in MEAN],
                std=[255 * s for s in STD])
            return images, index
        self.pipe = pipe()
        self.pipe.build()

    def start(self):
        # DALI 2.4's PyTorch plugin (DALIGenericIterator) needs torch 2 (`with torch.device`);
        # apt's torch is 1.13, so the job runs the pipeline itself as the plugin would with
        # LastBatchPolicy.PARTIAL: ceil(size / batch) runs per epoch, the padding cut off.
        import torch
        self.torch = torch
        self.size = self.pipe.epoch_size("Reader")

    def epoch(self):
        batch = self.spec["batch"]
        for k in range(-(-self.size // batch)):
            images, index = self.pipe.run()
            n = min(batch, self.size - k * batch)
            yield (self.torch.from_numpy(images.as_array()[:n]),
                   index.as_array().reshape(-1)[:n].tolist())

    def close(self):
        pass


def tensorsocket_compat():
    """tensorsocket 0.0.5 asks for torch >= 2.0 and calls Tensor._typed_storage(); apt's torch
    1.13 names it storage() (both return the TypedStorage). Nothing else differs."""
    import torch
    if not hasattr(torch.Tensor, "_typed_storage"):
        torch.Tensor._typed_storage = torch.Tensor.storage
    import logging
    import tensorsocket
    logging.getLogger().setLevel(logging.WARNING)  # its consumer sets the root logger to DEBUG
    return tensorsocket


def ts_ports(base):
    return {"port": base, "ack_port": base + 1, "heart_ports": (base + 2, base + 3)}


def tensorsocket_producers(datasets, batches, workers, epochs, late=(), late_own=False):
    """What a TensorSocket user runs for jobs reading `datasets` with `batches` (one of each per
    job; the jobs in `late` join late): one producer per distinct dataset (a producer serves one
    loader's batches to all its consumers), each with its jobs' shares of the W workers (as
    job_workers splits them for per-job loaders). Returns
    (producers: dicts with job (-1, -2, ...), dataset, workers, batch, producer_batch, ts_port,
    epochs, jobs; each job's port; notes). Also used by scripts/bench_gpu.py's tensorsocket side.
    - The producer's loader batch is the smallest consumer batch, and a send collates
      producer_batch_size = max(2, largest / smallest consumer batch) loader batches (its
      documented flexible batch size). Not its default 8: on the CPU each message pickles the
      whole collated storage by value (8 was 8x slower here); on a GPU its pool holds 10 sends
      (8 x 256 float32 224x224 images = 1.2 GB each), and the group of producer_batch_size loader
      batches that holds an epoch's last one is never sent (1 to 8 batches lost per epoch).
      1 crashes in 0.0.5 (IndexError in collate once a consumer's next batch has left the
      buffer).
    - A late joiner is served from the producer's next epoch only (see docs/peers.md), so the
      producer then runs one epoch more; with late_own, each late job gets a producer of its own
      instead (what a user does once the shared one has stalled, as it does when the on-time
      jobs leave before the late one's epoch)."""
    groups = []  # (dataset, late job or None): one producer each
    for i, ds in enumerate(datasets):
        key = (ds, i if late_own and i in late else None)
        if key not in groups:
            groups.append(key)
    groups.sort(key=lambda g: (g[0], -1 if g[1] is None else g[1]))
    lo, hi = min(batches), max(batches)
    producers, notes = [], []
    for k, (ds, own) in enumerate(groups):
        jobs = [i for i, d in enumerate(datasets)
                if d == ds and (i == own if own is not None else not (late_own and i in late))]
        shared_late = not late_own and any(i in late for i in jobs)
        producers.append({"job": -(k + 1), "dataset": ds,
                          "workers": sum(job_workers(workers, len(datasets), i) for i in jobs),
                          "batch": lo,
                          "producer_batch": max(2, hi // lo), "ts_port": TS_PORTS + 4 * k,
                          "epochs": epochs + (1 if shared_late else 0), "jobs": jobs})
    ports = [next(p["ts_port"] for p in producers if i in p["jobs"]) for i in range(len(datasets))]
    if len(set(datasets)) > 1:
        notes.append(f"one producer per dataset ({len(set(datasets))}): a producer serves one "
                     "loader's "
                     "batches, so different datasets cannot share one")
    if late and late_own:
        notes.append(f"{len(producers)} producers: the late job has one of its own (a shared "
                     "producer serves a late joiner from its next epoch only)")
    elif late:
        notes.append("the producer runs a second epoch for the late joiner")
    return producers, ports, notes


class TensorSocketSource:
    def __init__(self, spec):
        self.ts, self.spec = tensorsocket_compat(), spec

    def start(self):  # blocks until the producer announces its loader
        self.consumer = self.ts.TensorConsumer(batch_size=self.spec["batch"],
                                               **ts_ports(self.spec["ts_port"]))

    def epoch(self):
        for images, _, index in self.consumer:
            yield images, index.tolist()

    def close(self):
        pass


class WebDatasetSource(DataLoaderSource):
    """webdataset's loader as its documentation runs it: shards shuffled (per DataLoader worker,
    which reads every W-th shard), samples through a shuffle buffer, decoded with PIL, the same
    torchvision pipeline; the sample key is the ImageFolder index. Iterated as DataLoaderSource."""

    def __init__(self, spec):  # noqa: super().__init__ would build the per-job ImageFolder loader
        import warnings
        import torch
        import webdataset as wds
        from torch.utils.data import DataLoader
        from torchvision import transforms
        torch.manual_seed(spec["job"] + 1)
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        tf = imagenet_train_transform(transforms, CROP)
        data = (wds.WebDataset(spec["wds_urls"], shardshuffle=WDS_SHARD_SHUFFLE)
                .shuffle(WDS_SHUFFLE).decode("pil")
                .map(lambda s: (tf(s["jpg"]), s["cls"], int(s["__key__"]))))
        self.loader = DataLoader(data, batch_size=spec["batch"], num_workers=spec["workers"],
                                 multiprocessing_context="fork")


SOURCES = {"carpool": CarpoolSource, "dataloader": DataLoaderSource, "dali": DaliSource,
           "tensorsocket": TensorSocketSource, "webdataset": WebDatasetSource}


# ---------------------------------------------------------------- a job and a producer process

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


# ---------------------------------------------------------------- checks from delivered ids

def spearman(a, b):
    """Rank correlation of two equally long sequences of distinct values."""
    import numpy as np
    ra = np.argsort(np.argsort(np.asarray(a)))
    rb = np.argsort(np.argsort(np.asarray(b)))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else 0.0


def shard_layout(indices, shard_size):
    """Where webdataset's shards put each sample: the dataset's ImageFolder indices in a fixed
    shuffled order (seed 0; writers shuffle before sharding, or each shard would hold one class
    here), cut into shards of shard_size. Returns {index: shard}."""
    order = list(indices)
    random.Random(0).shuffle(order)
    return {i: k // shard_size for k, i in enumerate(order)}


def write_shards(root, samples, indices, shard_size, key):
    """The dataset's shards, written once with webdataset's ShardWriter next to the image folder
    (ROOT-wdsSIZE/KEY/shard-NNNNNN.tar): in shard_layout's order, each sample's key its
    ImageFolder index, .jpg the file's bytes, .cls its label. Returns the shard paths."""
    import webdataset as wds
    out = root.parent / f"{root.name}-wds{shard_size}" / key
    done = out / "complete"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        shard = shard_layout(indices, shard_size)
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=shard_size, verbose=0) as sink:
            for i in sorted(shard, key=shard.get):  # shard order; within a shard, the layout's
                path, label = samples[i]
                sink.write({"__key__": f"{i:06d}", "jpg": pathlib.Path(path).read_bytes(),
                            "cls": label})
        done.write_text("")
    return [str(x) for x in sorted(out.glob("shard-*.tar"))]


def shard_mix(ids, shard_of, window=MIX_WINDOW):
    """How well an order mixes webdataset's shards: the mean number of distinct shards among each
    run of `window` consecutive deliveries, divided by its expectation for a uniform permutation,
    sum over shards of 1 - C(n - size, window) / C(n, window). 1 = as mixed as a uniform shuffle;
    webdataset draws each batch from one worker's shuffle buffer, filled from few shards."""
    n = len(shard_of)
    if len(ids) < window or n < window:
        return None
    sizes = {}
    for s in shard_of.values():
        sizes[s] = sizes.get(s, 0) + 1
    expected = sum(1 - math.comb(n - z, window) / math.comb(n, window) for z in sizes.values())
    runs = [ids[k:k + window] for k in range(0, len(ids) - window + 1, window)]
    seen = sum(len({shard_of[i] for i in run if i in shard_of}) for run in runs) / len(runs)
    return seen / expected


def wds_order_model(n, shard_size, workers, batch, buffer=WDS_SHUFFLE, seed=1):
    """webdataset's epoch order without images, through its own shuffle (filters._shuffle): the
    shards dealt to DataLoader workers (shard k to worker k mod W), each worker's shards shuffled,
    its samples through a `buffer`-sample shuffle buffer, the batches taken from the workers in
    turn as the DataLoader does. Returns (shard mix of batch-long runs, share of the shards that
    the first tenth of the epoch comes from, exactly once)."""
    import itertools
    from webdataset.filters import _shuffle
    shards = [list(range(k, min(n, k + shard_size))) for k in range(0, n, shard_size)]
    rng = random.Random(seed)
    streams = []
    for w in range(workers):
        mine = shards[w::workers]
        rng.shuffle(mine)
        streams.append(_shuffle(iter(itertools.chain.from_iterable(mine)), bufsize=buffer,
                                rng=random.Random(seed * 1000 + w)))
    order, active = [], list(range(workers))
    while active:
        for w in list(active):
            got = list(itertools.islice(streams[w], batch))
            if not got:
                active.remove(w)
            order += got
    shard_of = {i: i // shard_size for i in range(n)}
    first = {shard_of[i] for i in order[:n // 10]}
    return (shard_mix(order, shard_of, batch), len(first) / len(shards),
            sorted(order) == list(range(n)))


def wds_model_table():
    """--wds-model: what webdataset's shuffles give, here and at a larger scale."""
    lines = ["| samples | shard size | workers | batch | shard mix | shards in the first tenth "
             "| exactly once |", "|---|---|---|---|---|---|---|"]
    for n, size, workers, batch in ((2500, 50, 4, 64), (2500, 50, 1, 64), (128000, 1000, 8, 256),
                                    (128000, 1000, 1, 256)):
        mix, first, once = wds_order_model(n, size, workers, batch)
        lines.append(f"| {n} | {size} | {workers} | {batch} | {mix:.2f} | {first:.2f} | "
                     f"{'yes' if once else 'no'} |")
    return "\n".join(lines)


def epoch_check(epochs, expected):
    """'exact' when every epoch holds each expected id once; a partial last epoch (stopped at
    the time cap) is 'partial' if it repeats nothing; otherwise the repeats and misses."""
    want, notes = set(expected), []
    for k, ids in enumerate(epochs):
        repeats, got = len(ids) - len(set(ids)), set(ids)
        foreign = len(got - want)
        if repeats or foreign:
            notes.append(f"epoch {k}: {repeats} repeated, {foreign} not in the dataset")
        elif got != want:
            notes.append(f"partial {len(got)}/{len(want)}")
    return "; ".join(notes) or "exact"


def order_z(ids, expected):
    """z of the rank correlation between delivery position and listing position: about N(0, 1)
    for a uniform permutation; |z| > 4 means the order follows the listing (p < 1e-4)."""
    pos = {v: i for i, v in enumerate(expected)}
    listed = [pos[i] for i in ids if i in pos]
    return spearman(range(len(listed)), listed) * max(0, len(listed) - 1) ** 0.5


def pair_checks(results):
    """Across jobs: the highest rank correlation of the common ids' positions (1 = the same
    order), and whether two jobs got the same pixels for a sample (the same augmentation)."""
    rho, same_pixels = None, False
    for i in range(len(results)):
        for j in range(i + 1, len(results)):
            if not (results[i]["epochs"] and results[j]["epochs"]):
                continue
            a, b = results[i]["epochs"][0], results[j]["epochs"][0]
            pa, pb = {v: k for k, v in enumerate(a)}, {v: k for k, v in enumerate(b)}
            common = [v for v in a if v in pb]
            if len(common) > 2:
                r = spearman([pa[v] for v in common], [pb[v] for v in common])
                rho = r if rho is None else max(rho, r)
            ci, cj = results[i]["checksums"], results[j]["checksums"]
            same_pixels |= any(ci[k] == cj[k] for k in ci.keys() & cj.keys())
    return rho, same_pixels


# ---------------------------------------------------------------- the bench

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
            raise SystemExit("bench_peers.py: catalog ids are not contiguous in ImageFolder "
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


def versions():
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for pkg in ("torch", "torchvision", "numpy", "pyzmq", "tensorsocket", "nvidia-dali-cuda130",
                "webdataset", "psutil"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = __import__(pkg).__version__ if pkg in ("torch", "torchvision",
                                                              "numpy") else None
    return out


# ---------------------------------------------------------------- the report

def fmt(x, spec=".0f"):
    return "–" if x is None else format(x, spec)


def rows(r):
    """The scenario rows, each row at another cache with its scenario's other configurations
    (measured once, in its first row) filled in."""
    out = {}
    for key, s in r["scenarios"].items():
        base = r["scenarios"].get(s.get("peers_from"), {}).get("results", {})
        results = {k: v for k, v in base.items() if k != "carpool"}
        results.update(s["results"])
        out[key] = dict(s, results=results)
    return out


def markdown(r):
    c = r["config"]
    v = ", ".join(f"{k} {x}" for k, x in r["versions"].items() if x)
    lines = [f"{c['count']} JPEGs 500x375, {r['cores']} cores, {c['workers']} workers per "
             f"configuration, step {c['step_ms']} ms per 64 samples (speeds: "
             f"{c['speeds_step_ms']} and {2 * c['speeds_step_ms']} ms), {c['epochs']} epoch(s), "
             f"at most {c['max_seconds']} s each, run {r.get('run_s', 0):.0f} s", f"Versions: {v}",
             f"carpool server: {bench_cache.describe_set(c['prepared_set'])}; rows at " +
             "; ".join(x["description"] for x in c["caches"]) + " (the other configurations "
             "have no such cache: measured once per scenario, repeated in its rows at other "
             "caches)", ""]
    lines += summary_table(r) + [""] + detail_table(r)
    for config, why in r["skipped"].items():
        lines.append(f"- {config} skipped: {why}")
    return "\n".join(lines) + "\n"


def best_peer(results):
    peers = [(x["samples_per_s"], k) for k, x in results.items()
             if k != "carpool" and "samples_per_s" in x]
    return max(peers) if peers else (None, None)


def summary_table(r):
    configs = r["config"]["configs"]
    lines = ["| scenario | cache | " + " | ".join(f"{c} samples/s" for c in configs) +
             " | carpool ÷ best peer | steps' ceiling | carpool prep ÷ deliv | lower bound |",
             "|---" * (len(configs) + 6) + "|"]
    for name, s in rows(r).items():
        res = s["results"]
        cells = [fmt(res.get(c, {}).get("samples_per_s")) if "error" not in res.get(c, {})
                 else "failed" for c in configs]
        best, who = best_peer(res)
        cp = res.get("carpool", {})
        ratio = (f"{cp['samples_per_s'] / best:.2f} ({who})" if best and "samples_per_s" in cp
                 else "–")
        lines.append(f"| {name}: {s['what']} | {s['cache']['label']} | " + " | ".join(cells) +
                     f" | {ratio} | "
                     f"{fmt(s.get('ceiling'))} | {fmt(cp.get('prep_per_delivery'), '.3f')} | "
                     f"{fmt(cp.get('lower_bound'), '.3f')} |")
    return lines


def share(rate, asked):
    """A job's rate over what its steps ask for (1.00 = it never waited on its loader)."""
    return "–" if rate is None or not asked else f"{rate / asked:.2f}"


def detail_table(r):
    lines = ["| scenario | config | per-job samples/s | ÷ asked | CPU ms/sample | "
             "epochs (per job) | order z vs listing | shard mix | order ρ between jobs | "
             "same pixels across jobs | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in r["scenarios"].items():  # each measurement once: no repeated peers
        for config, x in s["results"].items():
            if "jobs" not in x:
                lines.append(f"| {name} | {config} | {x.get('error') or x.get('skipped')} "
                             "| | | | | | | | |")
                continue
            jobs, asked = x["jobs"], s.get("asked") or [None] * len(x["jobs"])
            label = f"{config} ({s['cache']['label']} cache)" if config == "carpool" else config
            lines.append(
                f"| {name} | {label} | {' / '.join(fmt(j['samples_per_s']) for j in jobs)} | "
                f"{' / '.join(share(j['samples_per_s'], a) for j, a in zip(jobs, asked))} | "
                f"{fmt(x['cpu_ms_per_sample'], '.1f')} | "
                f"{' / '.join(j['epochs'] for j in jobs)} | "
                f"{' / '.join(fmt(j['order_z'], '.1f') for j in jobs)} | "
                f"{' / '.join(fmt(j.get('shard_mix'), '.2f') for j in jobs)} | "
                f"{fmt(x['order_rho_max'], '.2f')} | {'yes' if x['same_pixels'] else 'no'} | "
                f"{'; '.join(x['notes'])} |")
    return lines


# ---------------------------------------------------------------- arguments

def parser():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, help="synthetic JPEGs (default 2500; quick 600)")
    ap.add_argument("--data-dir", help="image folder (default ~/.cache/carpool/bench-peers/...)")
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=CONFIGS)
    ap.add_argument("--workers", type=int, default=4, help="loader workers per configuration")
    ap.add_argument("--step-ms", type=float, default=20.0,
                    help="simulated training per 64 samples (default 20, as bench e2e)")
    ap.add_argument("--speeds-step-ms", type=float, default=100.0,
                    help="speeds scenario: the fast job's step per 64 samples (slow: twice). "
                         "Default 100: the fast job asks for more than a loader per job gives "
                         "here, the slow one for less; at 200 every loader nears the steps' "
                         "ceiling and the scenario measures the sleep, not the loader")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, help="per scenario and configuration (60)")
    bench_cache.add_arguments(ap, "carpool server cache in bytes, e.g. 2GiB, instead of "
                                  "--cache-fraction")
    ap.add_argument("--wds-shard-size", type=int, default=50,
                    help="webdataset: samples per tar shard (default 50: 50 shards of 2500)")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    ap.add_argument("--quick", action="store_true", help="600 images, 20 s cap: a smoke test")
    ap.add_argument("--wds-model", action="store_true",
                    help="print webdataset's order model (wds_order_model: shard mix, shards in "
                         "the first tenth, exactly once) for a few sizes, and exit")
    return ap


def main():
    args = parser().parse_args()
    if args.wds_model:
        print(wds_model_table())
        return
    # TensorSocket sends 8 loader batches at a time and drops an epoch's rest: 600 images give
    # it one send of 512 (300 would give it none).
    quick = {"count": 600, "max_seconds": 20.0}
    full = {"count": 2500, "max_seconds": 60.0}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.count, args.workers, args.epochs) < 1 or args.count < 3:
        sys.exit("bench_peers.py: --count must be >= 3, --workers and --epochs >= 1")
    args.prepared_set = bench_cache.prepared_set(args.count, SAMPLE_BYTES)
    args.caches = bench_cache.choose("bench_peers.py", args.prepared_set, args.cache_fraction,
                                     args.cache_size)
    Bench(args).run()


if __name__ == "__main__":
    main()
