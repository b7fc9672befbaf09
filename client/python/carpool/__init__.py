"""carpool: batches from the local carpool server for PyTorch (or numpy), zero-copy.

    import carpool
    loader = carpool.Loader("fmnist", batch_size=64, epochs=2, transform="normalize(0.2860,0.3530)")
    for epoch in range(loader.epochs):
        for images, labels in loader:  # torch tensors if torch is importable, else numpy
            ...

Pure Python over libcarpool.so (ctypes), for any CPython >= 3.9. carpool.datasets registers and
derives datasets (through the `carpool` CLI). docs/python.md has the details.
"""

import os
import sys
import warnings
from typing import Any

# A GPU job may decode its own JPEGs on its GPU beside its training (docs/gpu.md). nvJPEG's work
# per image then shares the device's few hardware queues (CUDA's default: 8) with the training's
# kernels and waits behind them: on an H200 one ResNet-18 job got 0.78-0.79x of the GPU's rate,
# 0.83-0.85x with 32 queues, and under MPS 0.55x against 0.88-0.89x. CUDA reads the setting when
# the process creates its context, so it is set here, before that, unless the user set it.
CUDA_CONNECTIONS = "32"
if "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ:
    _torch = sys.modules.get("torch")
    _cuda_up = False
    if _torch is not None:
        try:
            _cuda_up = bool(_torch.cuda.is_initialized())
        except Exception:  # a torch without CUDA, or one half imported: nothing to tell
            _cuda_up = False
    if _cuda_up:
        warnings.warn(
            "carpool: CUDA was initialized before 'import carpool', so its GPU decode beside "
            "training shares CUDA's 8 default hardware queues with the training (about 7% slower "
            "on an H200, half the speed under MPS); import carpool before touching CUDA, or set "
            f"CUDA_DEVICE_MAX_CONNECTIONS={CUDA_CONNECTIONS} in the job's environment",
            RuntimeWarning, stacklevel=2)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = CUDA_CONNECTIONS

from . import datasets  # noqa: E402 (after the CUDA setting, which must come first)
from ._ffi import CarpoolError, InvalidArgumentError, NotFoundError, library_path  # noqa: E402
from .server import Server, binary, cli  # noqa: E402

_LOADER_NAMES = ("Loader", "server_stats", "socket_path", "state_dir")


def __getattr__(name: str) -> Any:
    # The loader needs numpy; imported on first use, so that the `carpool` command (and the
    # datasets API) run where numpy is missing, e.g. a GPU node's bare torch environment.
    if name in _LOADER_NAMES:
        from . import loader
        return getattr(loader, name)
    raise AttributeError(f"module 'carpool' has no attribute {name!r}")


__version__ = "0.3.0"
__all__ = ["CarpoolError", "InvalidArgumentError", "Loader", "NotFoundError", "Server", "binary",
           "cli", "datasets", "library_path", "server_stats", "socket_path", "state_dir"]
