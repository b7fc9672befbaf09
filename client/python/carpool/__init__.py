"""carpool: batches from the local carpool server for PyTorch (or numpy), zero-copy.

    import carpool
    loader = carpool.Loader("fmnist", batch_size=64, epochs=2, transform="normalize(0.2860,0.3530)")
    for epoch in range(loader.epochs):
        for images, labels in loader:  # torch tensors if torch is importable, else numpy
            ...

Pure Python over libcarpool.so (ctypes), for any CPython >= 3.9. carpool.datasets registers and
derives datasets (through the `carpool` CLI). docs/python.md has the details.
"""

from typing import Any

from . import datasets
from ._ffi import CarpoolError, InvalidArgumentError, NotFoundError, library_path
from .server import Server, binary, cli

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
