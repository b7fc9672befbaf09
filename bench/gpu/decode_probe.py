"""libcarpool_decode_probe.so (server/gpu/decode_probe.cc) from Python: carpool's GPU decode path
(BatchDecoder: nvJPEG, the exact resize 256 and crop 256) run in the calling process's CUDA
context. Used by bench.gpu's inproc side and bench.gpu.train_beside."""

import ctypes

SPEC = b"resize=256,crop=256,decode=gpu"


def load(path):
    """The library with its entry points' signatures set."""
    lib = ctypes.CDLL(path)
    lib.carpool_decode_probe.restype = ctypes.c_int
    lib.carpool_decode_probe.argtypes = [ctypes.c_char_p, ctypes.c_double, ctypes.c_int,
                                         ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.carpool_decode_probe_open.restype = ctypes.c_void_p
    lib.carpool_decode_probe_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                              ctypes.c_int]
    lib.carpool_decode_probe_decode.restype = ctypes.c_int
    lib.carpool_decode_probe_decode.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
        ctypes.c_char_p, ctypes.c_int]
    lib.carpool_decode_probe_close.argtypes = [ctypes.c_void_p]
    return lib


def packed(base, lengths):
    """ctypes arrays of the start addresses and lengths of files packed one after another from
    address `base`, as carpool_decode_probe_decode takes them."""
    starts = []
    for length in lengths:
        starts.append(base)
        base += length
    n = len(lengths)
    return (ctypes.c_void_p * n)(*starts), (ctypes.c_uint64 * n)(*lengths)


class Decoder:
    """One decoder (its own nvJPEG state and stream) for batches of up to `batch` JPEGs; one
    thread at a time. ctypes lets go of the GIL during a call."""

    def __init__(self, lib, batch):
        self.lib, self.err = lib, ctypes.create_string_buffer(1024)
        self.handle = lib.carpool_decode_probe_open(SPEC, batch, self.err, len(self.err))
        if not self.handle:
            raise RuntimeError(f"decode probe: {self.err.value.decode()}")

    def decode(self, starts, lengths, dst):
        """Decodes len(starts) JPEGs into device address `dst` (256 x 256 x 3 each) and waits."""
        rc = self.lib.carpool_decode_probe_decode(self.handle, len(starts), starts, lengths, dst,
                                                  256, 256, self.err, len(self.err))
        if rc != 0:
            raise RuntimeError("decode probe: " + (self.err.value.decode() if rc < 0
                                                   else f"{rc} images not decoded"))

    def close(self):
        if self.handle:
            self.lib.carpool_decode_probe_close(self.handle)
            self.handle = None
