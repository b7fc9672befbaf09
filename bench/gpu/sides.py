"""What a job of each side of the GPU benchmark iterates: its model and training step, and its
batches from carpool, the baseline's DataLoader, GPU decode or a TensorSocket consumer (with the
TensorSocket producer's process)."""

import pathlib
import sys
import time
import traceback

from bench.common import CHECKSUMS, CROP, IndexedFolder, tensorsocket_compat, ts_ports
from bench.torchvision_jobs import imagenet_train_transform


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
    if spec.get("probe"):  # bench.gpu_probe: time the loader (a proxy on its calls)
        probe_loader(loader, spec, timing)
    try:
        for _ in range(loader.epochs):
            for images, labels in loader:
                if to:  # host batches copied to the training device (bench.gpu_probe)
                    images, labels = images.to(to), labels.to(to)
                # NHWC permuted is channels_last NCHW: no copy. The loader hands the slot back
                # only once the GPU work queued on the batch has finished.
                yield (images.permute(0, 3, 1, 2) if nhwc else images), labels
        yield None
    finally:
        t = time.monotonic()
        loader._release_current()
        if loader._releaser is not None:  # the parts of close(), timed (bench.gpu_probe)
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
    """bench.gpu_probe's variants: time the loader's waits for the server (its _fetch), and
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
        data = IndexedFolder(spec, tf)
    else:
        data = datasets.ImageFolder(spec["root"], transform=tf)
        if spec["indices"] is not None:
            data = Subset(data, spec["indices"])
    torch.manual_seed(spec["seed"])
    sampler = None
    if spec.get("distributed"):  # a DDP rank: its share of each epoch (bench.ddp_gpu)
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


def _collate_packed(batch):
    """A batch's files in one uint8 tensor (one shared-memory block from the worker, not 256
    pickled byte strings) with their lengths."""
    import torch
    data = b"".join(x for x, _ in batch)
    return (torch.frombuffer(bytearray(data), dtype=torch.uint8),
            [len(x) for x, _ in batch], [y for _, y in batch])


def gpudecode_loader(spec, torch, go=None, packed=False):
    """Workers that read the files for torchvision's GPU decode (the peer of issue 13.3); packed:
    each batch's files in one tensor (the inproc side)."""
    from torch.utils.data import DataLoader
    torch.manual_seed(spec["seed"])
    return DataLoader(_EncodedFiles(spec["root"], spec["indices"]), batch_size=spec["batch_size"],
                      shuffle=True, num_workers=spec["workers"],
                      collate_fn=_collate_packed if packed else _collate_encoded,
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


def inproc_batches(spec, loader, dev, torch, first):
    """docs/gpu.md's plan ("Decoding in the jobs' processes") without the server, as a probe: the
    gpudecode side's workers read the files, and a thread of the job decodes each batch a batch
    ahead with carpool's GPU decode path (libcarpool_decode_probe.so: nvJPEG's JPEG engines, the
    exact resize 256 and crop 256) in the job's own CUDA context; then the gpudecode side's
    random crop 224, flip and normalize. Its own Python pipeline limits it (docs/benchmarks.md)."""
    import queue
    import threading

    from bench.gpu import decode_probe
    lib = decode_probe.load(spec["decode_probe"])
    b, threads = spec["batch_size"], 2  # one thread's header parse, call and wait held it to ~7k
    decoders = [decode_probe.Decoder(lib, b) for _ in range(threads)]
    bufs = [torch.empty((b, 256, 256, 3), dtype=torch.uint8, device=dev) for _ in range(4)]
    free, ready = queue.Queue(), queue.Queue(maxsize=len(bufs) - 1)
    for i in range(len(bufs)):
        free.put((i, None))
    source = (item for epoch in range(spec["epochs"]) for item in (first if epoch == 0 else loader))
    source_lock = threading.Lock()

    def decode_ahead(decoder):
        torch.cuda.set_device(dev)  # a new thread starts on device 0
        try:
            while True:
                i, used = free.get()
                with source_lock:
                    item = next(source, None)
                if item is None:
                    break
                packed, lengths, labels = item
                if used is not None:  # the training stream has read this buffer
                    used.synchronize()
                decoder.decode(*decode_probe.packed(packed.data_ptr(), lengths),
                               bufs[i].data_ptr())
                ready.put((i, len(lengths), labels))
            ready.put(None)
        except BaseException as e:  # noqa: BLE001 - handed to the training loop, which raises it
            ready.put(e)

    for d in decoders:
        threading.Thread(target=decode_ahead, args=(d,), daemon=True).start()
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1)
    gen = torch.Generator().manual_seed(spec["seed"])
    ar = torch.arange(CROP, device=dev)
    try:
        ended = 0
        while ended < threads:
            item = ready.get()
            if item is None:
                ended += 1
                continue
            if isinstance(item, BaseException):
                raise item
            i, n, labels = item
            # A random crop and flip per image as one gather (per-image Python slicing held the
            # loop to 5,800 img/s on an H200): rows y + r, columns x + c, mirrored when flipped.
            off = torch.randint(0, 256 - CROP + 1, (n, 2), generator=gen).to(dev)
            flip = (torch.rand(n, generator=gen) < 0.5).to(dev)
            cols = torch.where(flip[:, None], ar.flip(0)[None, :], ar[None, :]) + off[:, 1:]
            rows = ar[None, :] + off[:, :1]
            crops = bufs[i][torch.arange(n, device=dev)[:, None, None], rows[:, :, None],
                            cols[:, None, :]]  # n x 224 x 224 x 3
            x = crops.permute(0, 3, 1, 2).float().div_(255).sub_(mean).div_(std)
            used = torch.cuda.Event()
            used.record()
            free.put((i, used))
            yield x.contiguous(memory_format=torch.channels_last), torch.tensor(labels).to(dev)
    finally:
        if ended == threads:  # a thread still decoding keeps its decoder
            for d in decoders:
                d.close()


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
