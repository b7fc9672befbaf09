"""What the benchmarks share: the data (synthetic JPEGs, their catalog ids, an ImageFolder that
reports each sample's index), TensorSocket's compatibility shim and producer plan, the epoch and
order checks of delivered ids, the versions of the packages in a run, and a number's format.
Used by bench.gpu, bench.peers and the smaller benchmarks; it imports none of them."""

import os
import pathlib
import shutil
import sqlite3
import sys
import time

from bench.torchvision_jobs import job_workers

PREPARE = "resize=256,crop=256"
SAMPLE_BYTES = 256 * 256 * 3  # one prepared sample in the cache (uint8 HWC)
CROP = 224
CHECKSUMS = 16  # samples per job whose pixel sums are compared across jobs
TS_PORTS = 5555  # TensorSocket's default ports; a second producer takes the next four


# ---------------------------------------------------------------- the data

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
        raise SystemExit(f"bench: {len(missing)} images are not in the catalog, e.g. "
                         f"{missing[0]}")
    return [by_path[p] for p in paths]


def ensure_jpegs(data_dir, bench, count, carpool):
    """The folder of `count` synthetic 500x375 JPEGs (ImageFolder layout; default
    ~/.cache/carpool/BENCH/jpeg-COUNT-500x375), made by `carpool dataset gen` (PIL without
    carpool) unless it holds them already. Used by bench.gpu, bench.peers and
    bench.check_wds_carpool."""
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
        print(f"bench: {e}", flush=True)
        return None


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


# ---------------------------------------------------------------- TensorSocket

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
    epochs, jobs; each job's port; notes). Used by bench.peers and bench.gpu's tensorsocket side.
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


# ---------------------------------------------------------------- epoch and order checks

def spearman(a, b):
    """Rank correlation of two equally long sequences of distinct values."""
    import numpy as np
    ra = np.argsort(np.argsort(np.asarray(a)))
    rb = np.argsort(np.argsort(np.asarray(b)))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else 0.0


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


# ---------------------------------------------------------------- versions and numbers

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
