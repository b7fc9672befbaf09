"""carpool.Loader: a training job's batches from the local carpool server, zero-copy."""

from __future__ import annotations

import atexit
import ctypes
import json
import math
import os
import pathlib
import queue
import sys
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from . import _args, _ffi
from ._ffi import CarpoolError, InvalidArgumentError

try:  # torch is optional: without it the loader yields numpy arrays
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None
try:  # numpy is optional where torch is there (a GPU node's torch environment may have none):
    import numpy as np  # the loader then yields torch tensors over the slots (torch.frombuffer)
except ImportError:  # pragma: no cover - depends on the interpreter
    np = None  # type: ignore[assignment]

# The server's dtype codes: (name in numpy and torch, bytes per element, array-interface typestr).
_DTYPES = {1: ("uint8", 1, "|u1"), 2: ("float16", 2, "<f2"), 3: ("float32", 4, "<f4")}


PathLike = Union[str, "os.PathLike[str]"]
_BOOLS = (bool,) if np is None else (bool, np.bool_)


def _json_object(text: str) -> Dict[str, Any]:
    """A JSON object the library returned (statistics, a position's fields)."""
    out: Dict[str, Any] = json.loads(text)
    return out


def state_dir(state_dir: Optional[PathLike] = None) -> pathlib.Path:
    """The server's state dir, resolved as `carpool` does (docs/catalog.md): the argument, else
    $CARPOOL_STATE_DIR, else $XDG_STATE_HOME/carpool, else ~/.local/state/carpool."""
    state_dir = _args.optional_path("state_dir", state_dir)
    if state_dir:
        return pathlib.Path(state_dir)
    if os.environ.get("CARPOOL_STATE_DIR"):
        return pathlib.Path(os.environ["CARPOOL_STATE_DIR"])
    if os.environ.get("XDG_STATE_HOME"):
        return pathlib.Path(os.environ["XDG_STATE_HOME"]) / "carpool"
    return pathlib.Path.home() / ".local" / "state" / "carpool"


def socket_path(socket: Optional[PathLike] = None, state_dir_: Optional[PathLike] = None) -> str:
    """`socket` if given, else <state dir>/carpool.sock."""
    socket = _args.optional_path("socket", socket)
    return socket if socket else str(state_dir(state_dir_) / "carpool.sock")


class _Client:
    """Owns one carpool_client handle (a connection check and the server's address)."""

    def __init__(self, socket: Optional[PathLike] = None,
                 state_dir: Optional[PathLike] = None) -> None:
        self.handle: Optional[ctypes.c_void_p] = None
        self.path = socket_path(socket, state_dir)
        handle = ctypes.c_void_p()
        _ffi.check(_ffi.lib().carpool_connect(self.path.encode(), ctypes.byref(handle)))
        self.handle = handle

    def stats(self) -> Dict[str, Any]:
        out = ctypes.c_void_p()
        _ffi.check(_ffi.lib().carpool_client_stats(self.handle, ctypes.byref(out)))
        return _json_object(_ffi.take_string(out))

    def close(self) -> None:
        if self.handle:
            _ffi.lib().carpool_client_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self.close()


def server_stats(socket: Optional[PathLike] = None,
                 state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """The server's statistics as a dict: jobs, cache, preparations, deliveries, sharing_ratio."""
    client = _Client(socket, state_dir)
    try:
        return client.stats()
    finally:
        client.close()


class _BatchMemory:
    """Keeps one carpool_batch handle, and with it the slot mapping, alive while any array over its
    images exists. The slot itself is released (credit back) by the loader at the next step."""

    handle: Optional[ctypes.c_void_p] = None

    def __init__(self, handle: ctypes.c_void_p) -> None:
        self.handle = handle
        lib = _ffi.lib()
        dims = (ctypes.c_int64 * 5)()
        rank = lib.carpool_batch_image_shape(handle, dims, 5)
        if rank > 5:
            raise CarpoolError(f"batch images have rank {rank}; this package handles up to 5", 9)
        self.shape: Tuple[int, ...] = tuple(int(d) for d in dims[:rank])
        self.address: int = lib.carpool_batch_images(handle) or 0
        self.nbytes: int = lib.carpool_batch_image_bytes(handle)

    def _check_bytes(self, code: int) -> int:
        name, itemsize, _ = _DTYPES[code]
        expected = math.prod(self.shape) * itemsize
        if expected != self.nbytes:
            raise CarpoolError(f"batch images are {self.nbytes} bytes, but shape {self.shape} of "
                               f"{name} needs {expected}", 5)
        return expected

    def array(self, code: int) -> Any:
        """The images as a numpy array over the slot."""
        expected = self._check_bytes(code)
        # Writable: the slot is this job's alone (in-place ops are common in training code).
        self.__array_interface__ = {
            "shape": self.shape, "typestr": _DTYPES[code][2],
            "data": (self.address if expected else 0, False), "version": 3,
        }
        if expected == 0:
            return np.empty(self.shape, dtype=_DTYPES[code][0])
        return np.asarray(self)

    def tensor(self, code: int) -> Any:
        """The images as a torch tensor over the slot, without numpy (torch.frombuffer)."""
        expected = self._check_bytes(code)
        dtype = getattr(torch, _DTYPES[code][0])
        if expected == 0:
            return torch.empty(self.shape, dtype=dtype)
        buffer = (ctypes.c_uint8 * expected).from_address(self.address)  # writable, like array()
        buffer._batch = self  # type: ignore[attr-defined]  # the tensor keeps the buffer, it this
        return torch.frombuffer(buffer, dtype=dtype).view(self.shape)


def _ints(pointer: Any, n: int, ids: bool) -> Any:
    """A copy of a batch's n sample ids (uint32) or labels (int32, as int64): numpy arrays where
    numpy is importable, else torch int64 tensors (torch has no uint32 before 2.3)."""
    if np is not None:
        if n == 0:
            return np.empty(0, np.uint32 if ids else np.int64)
        values = np.ctypeslib.as_array(pointer, (n,))
        return values.copy() if ids else values.astype(np.int64)
    if n == 0:
        return torch.empty(0, dtype=torch.int64)
    address = ctypes.cast(pointer, ctypes.c_void_p).value
    values = torch.frombuffer((ctypes.c_int32 * n).from_address(address), dtype=torch.int32)
    values = values.to(torch.int64)  # a copy
    return values & 0xFFFFFFFF if ids else values

    def __del__(self) -> None:
        if self.handle:
            _ffi.lib().carpool_batch_free(self.handle)
            self.handle = None


class _CudaArray:
    """Device memory of one batch (images or labels) as __cuda_array_interface__ (v3), so that
    torch.as_tensor wraps it with no copy. Holds the batch's handle, and with it the IPC mapping,
    alive while any tensor over it exists. No stream: the server finished writing the batch before
    it said the batch was ready."""

    def __init__(self, memory: _BatchMemory, address: int, shape: Tuple[int, ...],
                 typestr: str) -> None:
        self._memory = memory
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (int(address), False),
            "version": 3, "strides": None, "stream": None,
        }


_LIVE_GPU_LOADERS: "weakref.WeakSet[Loader]" = weakref.WeakSet()


@atexit.register
def _close_gpu_loaders() -> None:
    """Closes GPU loaders left open while the interpreter is still whole, so that their release
    threads end and their jobs say bye: left to finalization, the process aborted ("terminate
    called without an active exception", seen on the H100 with a loader never closed)."""
    for loader in list(_LIVE_GPU_LOADERS):
        try:
            loader.close()
        except Exception:  # exiting anyway: the server's lease cleans up after us
            pass


class _GpuReleaser:
    """Hands GPU batch slots back to the server as soon as the GPU work queued on them (up to an
    event recorded when the job moved past them) has finished, from a thread of its own, so the
    server gets its slots back while the training loop is busy or waiting for the next batch."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._queue: "queue.Queue[Optional[Tuple[_BatchMemory, Any]]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="carpool-gpu-release", daemon=True)
        self._thread.start()

    def put(self, batch: _BatchMemory, event: Any) -> None:
        self._queue.put((batch, event))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, event = item
            event.synchronize()  # drops the GIL while it waits
            self._lib.carpool_batch_release(batch.handle)

    def close(self) -> None:  # idempotent
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


# Data-parallel loaders made by this process: part of their default job keys.
_DDP_LOADERS: List[int] = [0]


def _ddp_identity(dataset: str, rank: Optional[int], world_size: Optional[int],
                  job_key: Optional[str], node: Optional[int] = None,
                  nodes: Optional[int] = None) -> Tuple[int, int, Optional[str], int, int]:
    """(rank, world_size, job_key, node, nodes) of a loader: the arguments, else torchrun's
    environment, else a job of its own. Across nodes, world_size and rank are this node's
    (LOCAL_WORLD_SIZE, LOCAL_RANK), node is GROUP_RANK and nodes WORLD_SIZE / LOCAL_WORLD_SIZE:
    each node's server serves its part of the dataset to its ranks (docs/ddp.md)."""
    env = os.environ
    total = int(env.get("WORLD_SIZE", "1") or 1)
    local = int(env.get("LOCAL_WORLD_SIZE", total) or total)
    spans = world_size is None and total > 1 and 0 < local < total
    if nodes is None:
        nodes = total // local if spans else 1
    if node is None:
        if spans and "GROUP_RANK" not in env:
            raise ValueError(f"WORLD_SIZE {total} spans {nodes} nodes but GROUP_RANK (the node's "
                             "rank) is not set; pass node= and nodes=")
        node = int(env.get("GROUP_RANK", "0") or 0) if nodes > 1 else 0
    if world_size is None:
        world_size = local if spans else total
    if rank is None:
        if world_size <= 1:
            rank = 0
        else:
            rank = int(env.get("LOCAL_RANK" if spans else "RANK", "0") or 0)
    world_size, rank, node, nodes = int(world_size), int(rank), int(node), int(nodes)
    if world_size < 1 or not 0 <= rank < world_size or nodes < 1 or not 0 <= node < nodes:
        raise ValueError(f"rank {rank} of world_size {world_size}, node {node} of {nodes}: need "
                         "0 <= rank < world_size and 0 <= node < nodes; pass rank=, world_size=, "
                         "node= and nodes= in range")
    if world_size == 1 and nodes == 1:
        return 0, 1, None, 0, 1
    if job_key is None:
        run = env.get("TORCHELASTIC_RUN_ID")
        master = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
        if run is None and master == ":":
            raise ValueError(f"world_size {world_size} needs a job_key shared by the job's ranks "
                             "(none given, and no torchrun environment to derive one); pass "
                             "job_key=\"<the same text on every rank>\"")
        # Every rank makes its loaders in the same order, so the n-th one names the same job.
        job_key = f"{run or 'none'}@{master}/{dataset}/{_DDP_LOADERS[0]}"
        _DDP_LOADERS[0] += 1
    return rank, world_size, str(job_key), node, nodes


def _default_device(world_size: int, socket: Optional[str], state_dir: Optional[str]) -> str:
    """"cuda:LOCAL_RANK" for a torchrun rank where this process sees GPUs and the server serves
    that one; "cpu" otherwise."""
    local_rank = os.environ.get("LOCAL_RANK")
    if world_size == 1 or local_rank is None or torch is None or not torch.cuda.is_available():
        return "cpu"
    device = f"cuda:{int(local_rank)}"
    try:
        served = {g.get("device") for g in server_stats(socket, state_dir).get("gpus", [])}
    except CarpoolError:
        return "cpu"  # the loader's own connection reports the server's state
    return device if int(local_rank) in served else "cpu"


def _parse_device(device: Any) -> int:
    """"cpu" -> -1, "cuda" -> 0, "cuda:N" / torch.device -> N; ValueError otherwise."""
    if not isinstance(device, str) and not (torch is not None and isinstance(device, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {device!r} "
                        f"({type(device).__name__}); pass device=\"cpu\" or \"cuda:N\"")
    text = str(device)
    if text == "cpu":
        return -1
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f'device "{device}" is not "cpu" or "cuda:N"; pass device="cpu" or '
                     '"cuda:0" (or another GPU index)')


def _position_bytes(state: Any) -> bytes:
    """The position bytes of a state_dict() (or the bytes themselves)."""
    if isinstance(state, (bytes, bytearray)):
        return bytes(state)
    if not isinstance(state, dict):
        raise TypeError(f"a loader state is the dict from Loader.state_dict() (with its "
                        f"\"carpool_position\" bytes), not {type(state).__name__}; pass that dict")
    if not isinstance(state.get("carpool_position"), (bytes, bytearray)):
        raise ValueError(f"a loader state needs its \"carpool_position\" bytes, this dict has keys "
                         f"{sorted(map(str, state))}; pass the dict Loader.state_dict() returned")
    return bytes(state["carpool_position"])


def describe_position(data: Union[Dict[str, Any], bytes]) -> Dict[str, Any]:
    """The fields of position bytes (Loader.state_dict()["carpool_position"]) as a dict."""
    data = _position_bytes(data)
    out = ctypes.c_void_p()
    _ffi.check(_ffi.lib().carpool_position_describe(data, len(data), ctypes.byref(out)))
    return _json_object(_ffi.take_string(out))


class Loader:
    """A training job on the local carpool server.

        loader = carpool.Loader("fmnist", batch_size=64, epochs=2,
                                transform="normalize(0.2860,0.3530)")
        for epoch in range(loader.epochs):
            for images, labels in loader:      # one pass = one epoch, len(loader) batches
                ...

    Each pass over the loader is one epoch of the job (the server knows the number of epochs up
    front, because its sampler plans every job's epochs together). A pass that is left early with
    `break` is resumed by the next pass; one left right after the epoch's last batch (islice, zip,
    a break there) has finished the epoch, and the next pass starts the next one. After the last
    epoch a pass yields nothing. A batch of 0 samples (all unreadable) is skipped, not yielded.

    images: a torch tensor when torch is importable (over the slot by numpy, or by torch.frombuffer
    where numpy is missing), else a numpy array, of shape
    [B, C, H, W] (nchw) or [B, H, W, C] (nhwc) and the transform's dtype (docs/transforms.md).
    It is a ZERO-COPY, WRITABLE view of the batch's shared-memory slot, valid only until the next
    step of the loader: the slot is handed back to the server then and filled with a later batch.
    Keep data beyond that with `images.clone()` (torch) or `images.copy()` (numpy); `images.to(...)`
    to another device or dtype copies too. labels: int64, one per image (a small copy).

    loader.ids: the current batch's sample ids (numpy uint32, a copy; torch int64 without numpy);
    loader.epoch and loader.batch_index say where the current batch sits. loader.stats(): this
    job's statistics from the server (dict). Failures raise carpool.CarpoolError with the
    server's message, e.g. for an unknown dataset at construction; a server that dies fails the
    next step within `timeout` seconds (code 8, Unavailable), and a job the server fails (e.g. a
    sample its transform cannot shape) fails the step with the server's reason. Bad arguments
    raise ValueError or TypeError before the server is asked. close() (or `with`) ends the job
    at once.

    device: "cpu" (default) or "cuda:N" (needs torch with CUDA, and a server started with
    --gpus N). On a GPU the server builds the batch in its own device memory, mapped into this
    process through CUDA IPC: images and labels (int64) are torch CUDA tensors on cuda:N, ZERO-COPY
    and WRITABLE (the slot is this job's alone), valid until the next step like the CPU views.
    The slot goes back to the server only once the GPU work queued on the current stream up to
    the next step has finished (an event is recorded there and a thread of the loader waits for
    it), so kernels still reading a batch never see the next one.
    rank, world_size, job_key (node, nodes): a data-parallel job's ranks, which form one job on
    the server: its global batch is world_size x batch_size and this rank gets slice `rank` of
    each; every rank gets the same number of batches per epoch. Defaults come from torchrun's
    environment (RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID; across nodes LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK), and device then defaults to "cuda:LOCAL_RANK" where the server
    serves that GPU. docs/ddp.md.
    Thread contract: one thread at a time per Loader; loaders in different threads are
    independent (ctypes drops the GIL while a step waits).
    """

    def __init__(self, dataset: str, batch_size: int = 32, epochs: int = 1,
                 transform: Optional[str] = "", device: Any = None, drop_last: bool = False,
                 socket: Optional[PathLike] = None, state_dir: Optional[PathLike] = None,
                 seed: int = 0, prefetch: int = 4, timeout: float = 10.0,
                 as_numpy: Optional[bool] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, job_key: Optional[str] = None,
                 node: Optional[int] = None, nodes: Optional[int] = None,
                 state: Optional[Union[Dict[str, Any], bytes]] = None) -> None:
        # Set first: close() from __del__ must work whatever the checks below raise.
        self._job: Optional[ctypes.c_void_p] = None
        self._client: Optional[_Client] = None
        self._current: Optional[_BatchMemory] = None  # the batch handed out last
        self._pending: Optional[_BatchMemory] = None  # the next epoch's, fetched to end this one
        # GPU: a thread that hands slots back once their work is done.
        self._releaser: Optional[_GpuReleaser] = None
        self._finished = False
        self._epoch_over = False  # the batch handed out last was its epoch's last
        # Every argument is checked before the server is asked anything (ValueError, TypeError).
        dataset = _args.text("dataset", dataset, allow_empty=False)
        batch_size = _args.integer("batch_size", batch_size, 1, 2**32 - 1)
        epochs = _args.integer("epochs", epochs, 1, 2**32 - 1)
        prefetch = _args.integer("prefetch", prefetch, 1, 2**32 - 1)
        transform = _args.text("transform", transform if transform is not None else "")
        seed = _args.integer("seed", seed, 0, 2**64 - 1)
        timeout = _args.number("timeout", timeout)
        if timeout * 1000 > 2**32 - 1:
            raise ValueError(f"timeout must be at most {(2**32 - 1) // 1000} s, got {timeout}")
        socket, state_dir = _args.optional_path("socket", socket), \
            _args.optional_path("state_dir", state_dir)
        job_key = _args.optional_text("job_key", job_key)
        for name, value in (("drop_last", drop_last), ("as_numpy", as_numpy)):
            if value is not None and not isinstance(value, _BOOLS):
                raise TypeError(f"{name} must be True or False, got {value!r} "
                                f"({type(value).__name__})")
        rank, world_size, node, nodes = (
            _args.integer(n, v) if v is not None else None
            for n, v in (("rank", rank), ("world_size", world_size), ("node", node),
                         ("nodes", nodes)))
        resume = _position_bytes(state) if state is not None else None
        if device is not None:
            _parse_device(device)
        rank, world_size, job_key, node, nodes = _ddp_identity(dataset, rank, world_size, job_key,
                                                               node, nodes)
        if device is None:
            device = _default_device(world_size, socket, state_dir)
        device_index = _parse_device(device)
        if device_index >= 0 and as_numpy:
            raise ValueError(f'as_numpy=True cannot hold device "{device}" batches; pass '
                             'as_numpy=False (torch CUDA tensors) or device="cpu"')
        if device_index >= 0 and (torch is None or not torch.cuda.is_available()):
            raise InvalidArgumentError(
                f'device "{device}" needs torch with CUDA in this process (torch '
                f'{"missing" if torch is None else torch.__version__ + " sees no GPU"}); use '
                'device="cpu"', _ffi.FAILED_PRECONDITION)
        self._lib = _ffi.lib()
        self._as_numpy = (torch is None) if as_numpy is None else bool(as_numpy)
        if not self._as_numpy and torch is None:
            raise InvalidArgumentError("as_numpy=False needs torch, which is not importable; "
                                       "pass as_numpy=True (numpy arrays) or install torch",
                                       _ffi.FAILED_PRECONDITION)
        if self._as_numpy and np is None:
            raise InvalidArgumentError(
                "as_numpy=True needs numpy, which is not importable; pass as_numpy=False (torch "
                "tensors) or install numpy" if as_numpy else
                f"carpool.Loader needs torch or numpy for its batches, and {sys.executable} "
                "imports neither; install torch (or numpy)", _ffi.FAILED_PRECONDITION)
        self._client = _Client(socket, state_dir)
        opts = _ffi.JobOptions(
            dataset=dataset.encode(), batch_size=batch_size, epochs=epochs,
            transform=transform.encode(),
            device=("cpu" if device_index < 0 else f"cuda:{device_index}").encode(),
            prefetch=prefetch, drop_last=1 if drop_last else 0, seed=seed,
            silence_timeout_ms=max(1, int(timeout * 1000)),
            job_key=(job_key or "").encode(), rank=rank, world_size=world_size, node=node,
            nodes=nodes)
        self._opts = opts
        self._create_job(resume)
        info = self._info
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank, self.world_size, self.job_key = rank, world_size, job_key
        self.node, self.nodes = node, nodes
        self.job_id = info.job_id
        self.dataset_size = info.dataset_size
        self.epochs = info.epochs
        self.sample_shape = tuple(info.sample_shape[: info.sample_rank])
        self.dtype = _ffi.DTYPES[info.dtype]
        self.layout = _ffi.LAYOUTS.get(info.layout, str(info.layout))
        self.device = "cpu" if info.device < 0 else f"cuda:{info.device}"
        self._torch_device = torch.device(self.device) if info.device >= 0 else None
        if self._torch_device is not None:
            _LIVE_GPU_LOADERS.add(self)
        self._dtype_code = info.dtype
        self._batches_per_epoch = info.batches_per_epoch
        # The epoch the next pass delivers (then: of the current batch); a resumed job's may be
        # past 0.
        self.epoch = info.start_epoch
        self.batch_index = -1
        self.ids = _ints(None, 0, ids=True)
        self.skipped = 0

    def __len__(self) -> int:
        return int(self._batches_per_epoch)

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        if self._job is None:
            raise CarpoolError(f"loader for job {self.job_id} is closed", 6)
        return self._epoch()

    def _epoch(self) -> Iterator[Tuple[Any, Any]]:
        if self._epoch_over:  # the last pass handed out its epoch's last batch, then was left
            self._epoch_over = False
            self.epoch += 1
        epoch = self.epoch
        while True:
            batch = self._pending if self._pending is not None else self._fetch()
            self._pending = None
            if batch is None:
                return
            b_epoch = self._lib.carpool_batch_epoch(batch.handle)
            if b_epoch != epoch:  # the previous epoch ended short (batches skipped entirely)
                self._pending = batch
                self.epoch = b_epoch
                return
            # Decided before the yield: a consumer may never resume the generator after the
            # epoch's last batch (itertools.islice(loader, len(loader)), zip, a break there), and
            # the next pass must then start the next epoch rather than end on its first batch.
            last = self._lib.carpool_batch_index(batch.handle) + 1 >= self._batches_per_epoch
            if self._lib.carpool_batch_size(batch.handle) == 0:
                # Every sample of the batch was unreadable: nothing to train on (an empty batch
                # would make a mean loss NaN), so it is not yielded, as if the server had sent
                # none. Its slot goes back now.
                self._lib.carpool_batch_release(batch.handle)
                del batch
                if last:
                    self.epoch = epoch + 1
                    return
                continue
            out = self._hand_out(batch, b_epoch)
            self._epoch_over = last
            yield out
            if last:
                self._epoch_over = False
                self.epoch = epoch + 1
                return

    def _fetch(self) -> Optional[_BatchMemory]:
        """Releases the current batch's slot, then waits for the next batch (None at the end)."""
        self._release_current()
        if self._finished:
            return None
        handle = ctypes.c_void_p()
        _ffi.check(self._lib.carpool_job_next(self._job, ctypes.byref(handle)))
        if not handle.value:
            self._finished = True
            self.epoch = self.epochs
            return None
        return _BatchMemory(handle)

    def _release_current(self) -> None:
        if self._current is None:
            return
        if self._torch_device is None:
            self._lib.carpool_batch_release(self._current.handle)
        else:
            # The GPU may still be running kernels queued on the batch: hand the slot back once
            # the work queued so far on the current stream is done.
            # A blocking-sync event: the release thread sleeps until the GPU is done rather
            # than spinning a core the server's workers need (H100, one job: 4,645 img/s with
            # blocking events against 3,945 with spinning ones, same run).
            event = torch.cuda.Event(blocking=True)
            event.record(torch.cuda.current_stream(self._torch_device))
            if self._releaser is None:
                self._releaser = _GpuReleaser(self._lib)
            self._releaser.put(self._current, event)
        self._current = None

    def _hand_out(self, batch: _BatchMemory, epoch: int) -> Tuple[Any, Any]:
        lib = self._lib
        n = lib.carpool_batch_size(batch.handle)
        self._current = batch
        self.epoch = epoch
        self.batch_index = lib.carpool_batch_index(batch.handle)
        self.skipped = lib.carpool_batch_skipped(batch.handle)
        self.ids = _ints(lib.carpool_batch_sample_ids(batch.handle), n, ids=True)
        if self._torch_device is not None:  # its int64 labels are on the device already
            return self._device_tensors(batch, n)
        labels = _ints(lib.carpool_batch_labels(batch.handle), n, ids=False)
        images = batch.array(self._dtype_code) if np is not None else \
            batch.tensor(self._dtype_code)
        if tuple(images.shape[:1]) != (n,):
            raise CarpoolError(f"batch of {n} samples has images of shape {images.shape}", 5)
        self._images_address = batch.address  # for tests: the view's memory is the slot's
        if self._as_numpy or np is None:  # numpy arrays asked for, or torch tensors already
            return images, labels
        return torch.from_numpy(images), torch.from_numpy(labels)

    def _device_tensors(self, batch: _BatchMemory, n: int) -> Tuple[Any, Any]:
        assert self._torch_device is not None  # a GPU job's
        lib = self._lib
        if lib.carpool_batch_device(batch.handle) != self._torch_device.index:
            raise CarpoolError(f"batch is on device {lib.carpool_batch_device(batch.handle)}, "
                               f"the job on {self.device}", 5)
        _, itemsize, typestr = _DTYPES[self._dtype_code]
        expected = math.prod(batch.shape) * itemsize
        if batch.shape[:1] != (n,) or expected != batch.nbytes:
            raise CarpoolError(f"batch of {n} samples has {batch.nbytes} image bytes for shape "
                               f"{batch.shape}", 5)
        self._images_address = batch.address
        images = torch.as_tensor(_CudaArray(batch, batch.address, batch.shape, typestr),
                                 device=self._torch_device)
        labels_address = lib.carpool_batch_device_labels(batch.handle) or 0
        labels = torch.as_tensor(_CudaArray(batch, labels_address, (n,), "<i8"),
                                 device=self._torch_device)
        return images, labels

    def _create_job(self, resume: Optional[bytes]) -> None:
        """Creates the server job from self._opts, resuming from position bytes when given."""
        opts, client = self._opts, self._client
        assert client is not None  # made in __init__ before the job
        buf = ctypes.create_string_buffer(resume, len(resume)) if resume else None
        opts.resume = ctypes.cast(buf, ctypes.c_void_p) if buf is not None else None
        opts.resume_bytes = len(resume) if resume else 0
        job = ctypes.c_void_p()
        try:
            _ffi.check(self._lib.carpool_job_create(client.handle, ctypes.byref(opts),
                                                    ctypes.byref(job)))
        except CarpoolError:
            client.close()
            raise
        finally:
            opts.resume, opts.resume_bytes = None, 0
        self._job = job
        info = _ffi.JobInfo()
        _ffi.check(self._lib.carpool_job_info_get(job, ctypes.byref(info)))
        if info.dtype not in _DTYPES:
            self.close()
            raise CarpoolError(f"server sent dtype {info.dtype}; this package knows 1..3", 9)
        self._info = info

    def state_dict(self) -> Dict[str, Any]:
        """The job's position, for a training checkpoint: the epoch in progress and the samples
        of it in every batch handed out so far (the current one included). A new Loader given it
        (Loader(..., state=sd), or load_state_dict(sd) before its first batch) receives exactly
        the rest of that epoch, in a new uniform order, then its remaining epochs; on the same
        server or a restarted one. A dict of plain values (torch.save/pickle/json-friendly but
        for the bytes): "carpool_position" (bytes), and dataset, epochs, epoch, batches, samples,
        taken for reading. docs/python.md, "Checkpoints"."""
        if self._job is None:
            raise CarpoolError(f"loader for job {self.job_id} is closed", 6)
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        # A batch of the next epoch fetched to end a pass is not handed out yet: leave it out.
        _ffi.check(self._lib.carpool_job_position(self._job, 1 if self._pending is not None else 0,
                                                  ctypes.byref(out), ctypes.byref(n)))
        data = _ffi.take_bytes(out, n.value)
        return {"carpool_position": data, **describe_position(data)}

    def load_state_dict(self, state: Union[Dict[str, Any], bytes]) -> None:
        """Moves this loader to a checkpoint's position (from state_dict()). Call it before the
        first batch: the server job is created again from the position."""
        resume = _position_bytes(state)
        if self._job is None:
            raise CarpoolError(f"loader for job {self.job_id} is closed", 6)
        if self._current is not None or self._pending is not None or self._finished or \
                self.batch_index != -1:
            raise CarpoolError("load_state_dict() must come before the loader's first batch; "
                               "create a new Loader(..., state=...) instead", 9)
        self._lib.carpool_job_free(self._job)
        self._job = None
        self._create_job(resume)
        self.job_id = self._info.job_id
        self.epoch = self._info.start_epoch

    def stats(self) -> Dict[str, Any]:
        """This job's statistics from the server, as a dict (deliveries, rate, queue_depth...)."""
        if self._job is None:
            raise CarpoolError(f"loader for job {self.job_id} is closed", 6)
        out = ctypes.c_void_p()
        _ffi.check(self._lib.carpool_job_stats(self._job, ctypes.byref(out)))
        return _json_object(_ffi.take_string(out))

    def server_stats(self) -> Dict[str, Any]:
        """The server's statistics (all jobs, cache, preparations, deliveries, sharing_ratio)."""
        if self._client is None or self._client.handle is None:
            raise CarpoolError(f"loader for job {self.job_id} is closed", 6)
        return self._client.stats()

    def close(self) -> None:
        """Ends the job now (the server removes it and frees its slots). Idempotent. Views handed
        out earlier stay mapped, so reading them does not fault, but their contents are void."""
        self._release_current()
        releaser = getattr(self, "_releaser", None)
        if releaser is not None:
            releaser.close()  # waits for the GPU work on the batches still held
            self._releaser = None
        self._pending = None
        if getattr(self, "_job", None) is not None:
            self._lib.carpool_job_free(self._job)
            self._job = None
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass

    def __repr__(self) -> str:
        return (f"carpool.Loader(dataset={self.dataset!r}, job={self.job_id}, "
                f"batch_size={self.batch_size}, epochs={self.epochs}, "
                f"batches_per_epoch={len(self)}, sample_shape={self.sample_shape}, "
                f"dtype={self.dtype}, layout={self.layout})")
