"""IDX ubyte files (MNIST, Fashion-MNIST) read and written with numpy alone: the reference the
tests compare the server's batches with, the test split the example scripts evaluate on, and
synthetic stand-ins where the real files are not on disk."""

from __future__ import annotations

import gzip
import os
import pathlib
import struct

import numpy as np


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """An unsigned-byte IDX file, gzipped or plain, as a numpy uint8 array of its dims."""
    raw = pathlib.Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4:
        raise ValueError(f"{path}: too short for an IDX header")
    zero, dtype, rank = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08 or rank == 0:
        raise ValueError(f"{path}: magic 0x{raw[:4].hex()}, expected 0x000008NN (unsigned bytes)")
    dims = struct.unpack(">" + "I" * rank, raw[4:4 + 4 * rank])
    expected = 4 + 4 * rank + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        raise ValueError(f"{path}: {len(raw)} bytes, the header {dims} needs {expected}")
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * rank).reshape(dims)


def write_idx(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Writes a uint8 numpy array as an IDX ubyte file, gzipped when `path` ends in .gz."""
    array = np.ascontiguousarray(array)
    if array.dtype != np.uint8 or array.ndim == 0 or array.ndim > 255:
        raise ValueError(f"{path}: IDX ubyte holds uint8 arrays of 1..255 dims, got "
                         f"{array.dtype} of {array.ndim} dims; pass array.astype(np.uint8)")
    raw = struct.pack(">HBB", 0, 0x08, array.ndim) + \
        struct.pack(">" + "I" * array.ndim, *array.shape) + array.tobytes()
    path = pathlib.Path(path)
    path.write_bytes(gzip.compress(raw, 1) if path.suffix == ".gz" else raw)
