"""ctypes bindings for libcarpool.so (include/carpool/carpool.h). Internal to the package.

The library is looked up, first hit wins:
  1. $CARPOOL_LIB (a path to libcarpool.so);
  2. next to this package (what `pip install client/python` copies from the build), then the
     package's lib/ (the platform wheel, scripts/wheel.sh), then the portable bundle's lib/
     (scripts/bundle.sh: python/carpool beside lib/);
  3. the build folders of the source tree this package sits in: $CARPOOL_BUILD_DIR, then build/;
  4. the system's library path (ctypes.util.find_library("carpool")).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import threading
from typing import Any, Dict, Iterator, Optional, Type

_HERE = pathlib.Path(__file__).resolve().parent
# client/python/carpool -> the repository root, when the package runs from the source tree.
_SOURCE_ROOT = _HERE.parents[2]

# carpool::StatusCode names, by value (include/carpool/status.h).
STATUS_NAMES: Dict[int, str] = {
    0: "OK", 1: "InvalidArgument", 2: "NotFound", 3: "AlreadyExists", 4: "IOError",
    5: "Corruption", 6: "FailedPrecondition", 7: "ResourceExhausted", 8: "Unavailable",
    9: "Internal",
}
DTYPES: Dict[int, str] = {1: "uint8", 2: "float16", 3: "float32"}
LAYOUTS: Dict[int, str] = {1: "nhwc", 2: "nchw", 3: "raw"}
INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION = 1, 2, 6


class CarpoolError(RuntimeError):
    """A carpool call failed. `code` is the carpool::StatusCode value (8 = Unavailable: the server
    is gone or silent), `code_name` its name; the message is the server's or the client's.
    Arguments this package can check itself raise ValueError or TypeError instead; what the
    server, the library or the CLI refuses raises the subclasses below by its code."""

    def __init__(self, message: str, code: int = 9) -> None:
        super().__init__(message)
        self.code: int = code
        self.code_name: str = STATUS_NAMES.get(code, str(code))


class InvalidArgumentError(CarpoolError, ValueError):
    """An argument refused where only the server, the library or the CLI can judge it (code 1,
    InvalidArgument: a transform or prepare spec that does not parse, a batch size over the
    server's limit, a GPU the server does not serve), or one this process cannot serve (code 6,
    FailedPrecondition: device="cuda:N" without torch's CUDA, as_numpy=False without torch).
    Both a CarpoolError (`except CarpoolError` still catches it) and a ValueError."""

    def __init__(self, message: str, code: int = INVALID_ARGUMENT) -> None:
        super().__init__(message, code)


class NotFoundError(CarpoolError, LookupError):
    """A name the server or the catalog does not know (code 2, NotFound): an unknown dataset, a
    Ray node without a carpool server. Both a CarpoolError and a LookupError."""

    def __init__(self, message: str, code: int = NOT_FOUND) -> None:
        super().__init__(message, code)


_ERROR_CLASSES: Dict[int, Type[CarpoolError]] = {INVALID_ARGUMENT: InvalidArgumentError,
                                                 NOT_FOUND: NotFoundError}


def error(message: str, code: int) -> CarpoolError:
    """The CarpoolError (or subclass) for a status code from the library, the server or the CLI."""
    return _ERROR_CLASSES.get(code, CarpoolError)(message, code)


class JobOptions(ctypes.Structure):
    _fields_ = [
        ("dataset", ctypes.c_char_p),
        ("batch_size", ctypes.c_uint32),
        ("epochs", ctypes.c_uint32),
        ("transform", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("prefetch", ctypes.c_uint32),
        ("drop_last", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("silence_timeout_ms", ctypes.c_uint32),
        ("job_key", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("node", ctypes.c_uint32),
        ("nodes", ctypes.c_uint32),
        ("resume", ctypes.c_void_p),
        ("resume_bytes", ctypes.c_size_t),
    ]


class JobInfo(ctypes.Structure):
    _fields_ = [
        ("job_id", ctypes.c_uint64),
        ("dataset_size", ctypes.c_uint64),
        ("batches_per_epoch", ctypes.c_uint64),
        ("epochs", ctypes.c_uint32),
        ("sample_rank", ctypes.c_uint32),
        ("sample_shape", ctypes.c_int64 * 4),
        ("dtype", ctypes.c_int32),
        ("layout", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("start_epoch", ctypes.c_uint32),
        ("start_batch", ctypes.c_uint64),
    ]


def _candidates() -> Iterator[pathlib.Path]:
    env = os.environ.get("CARPOOL_LIB")
    if env:
        yield pathlib.Path(env)
        return  # an explicit choice is not second-guessed
    for name in ("libcarpool.so", "libcarpool.so.0"):
        yield _HERE / name
    yield _HERE / "lib" / "libcarpool.so"
    yield _HERE.parents[1] / "lib" / "libcarpool.so"
    build_dirs = []
    if os.environ.get("CARPOOL_BUILD_DIR"):
        build_dirs.append(pathlib.Path(os.environ["CARPOOL_BUILD_DIR"]))
    build_dirs.append(_SOURCE_ROOT / "build")
    for d in build_dirs:
        yield d / "client" / "libcarpool.so"
    found = ctypes.util.find_library("carpool")
    if found:
        yield pathlib.Path(found)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c = ctypes
    vp, u32, u64, i64p = c.c_void_p, c.c_uint32, c.c_uint64, c.POINTER(c.c_int64)
    sigs = {
        "carpool_last_error": (c.c_char_p, []),
        "carpool_connect": (c.c_int32, [c.c_char_p, c.POINTER(vp)]),
        "carpool_client_free": (None, [vp]),
        "carpool_client_stats": (c.c_int32, [vp, c.POINTER(vp)]),
        "carpool_job_create": (c.c_int32, [vp, c.POINTER(JobOptions), c.POINTER(vp)]),
        "carpool_job_free": (None, [vp]),
        "carpool_job_info_get": (c.c_int32, [vp, c.POINTER(JobInfo)]),
        "carpool_job_next": (c.c_int32, [vp, c.POINTER(vp)]),
        "carpool_job_stats": (c.c_int32, [vp, c.POINTER(vp)]),
        "carpool_batch_free": (None, [vp]),
        "carpool_batch_release": (None, [vp]),
        "carpool_batch_images": (vp, [vp]),
        "carpool_batch_image_bytes": (c.c_size_t, [vp]),
        "carpool_batch_image_shape": (u32, [vp, i64p, u32]),
        "carpool_batch_size": (u32, [vp]),
        "carpool_batch_labels": (c.POINTER(c.c_int32), [vp]),
        "carpool_batch_sample_ids": (c.POINTER(c.c_uint32), [vp]),
        "carpool_batch_epoch": (u32, [vp]),
        "carpool_batch_index": (u64, [vp]),
        "carpool_batch_skipped": (u32, [vp]),
        "carpool_batch_device": (c.c_int32, [vp]),
        "carpool_batch_device_labels": (vp, [vp]),
        "carpool_string_free": (None, [vp]),
        "carpool_job_position": (c.c_int32, [vp, c.c_int32, c.POINTER(vp), c.POINTER(c.c_size_t)]),
        "carpool_position_describe": (c.c_int32, [c.c_char_p, c.c_size_t, c.POINTER(vp)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)  # AttributeError names a symbol an old libcarpool.so lacks
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def lib() -> Any:  # a ctypes.CDLL with carpool's functions declared
    """Loads libcarpool.so once; raises CarpoolError naming every place it looked."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            tried.append(str(path))
            if not path.exists() and os.sep in str(path):
                continue
            try:
                _lib = _declare(ctypes.CDLL(str(path)))
                return _lib
            except (OSError, AttributeError) as e:
                tried[-1] += f" ({e})"
        raise CarpoolError(
            "libcarpool.so not found (looked in: " + ", ".join(tried) + "); build it with "
            "'cmake --build build --target carpool_c' or set CARPOOL_LIB to its path",
            FAILED_PRECONDITION)


def library_path() -> str:
    """The path of the loaded libcarpool.so."""
    return str(lib()._name)


def check(status: int) -> None:
    """Raises the CarpoolError of a non-zero status (error()) with carpool_last_error()."""
    if status != 0:
        msg = lib().carpool_last_error()
        raise error(msg.decode("utf-8", "replace") if msg else f"carpool error {status}", status)


def take_bytes(ptr: ctypes.c_void_p, n: int) -> bytes:
    """Copies and frees a binary buffer returned through char** and size_t* out parameters."""
    if not ptr.value:
        return b""
    try:
        return ctypes.string_at(ptr.value, n)
    finally:
        lib().carpool_string_free(ptr)


def take_string(ptr: ctypes.c_void_p) -> str:
    """Copies and frees a string returned through a char** out parameter."""
    if not ptr.value:
        return ""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8", "replace")
    finally:
        lib().carpool_string_free(ptr)
