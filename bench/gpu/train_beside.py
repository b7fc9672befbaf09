"""A ResNet-18 training loop on synthetic input (bench.gpu's step), printing its rate every
--window seconds for --seconds: run it beside a decode benchmark to see what each costs the other.

    python3 -m bench.gpu.train_beside --seconds 40 --window 5 &

--decode-in-process LIB runs carpool_jpeg_decode_bench's variant rows inside this process instead
(LIB is libcarpool_decode_probe.so), on a thread, in this process's CUDA context: a decode that
shares the trainer's context, against the same decode from another process, which the GPU
time-slices with it (docs/benchmarks.md, issue 23).

--profile-at T runs torch.profiler for --profile-seconds from T on and prints each kernel's and
copy's GPU time, every stream of the process included (nvJPEG's too); --profile-trace also writes
its Chrome trace. Ending the profiler stalls the loop for seconds, so windows after it are not
rates (docs/benchmarks.md, "Issue 23, session 35").
"""

import argparse
import ctypes
import itertools
import threading
import time

import torch

from bench.common import CROP
from bench.gpu import decode_probe
from bench.gpu.sides import make_model, make_step


def decode_rows(lib_path, variants, batches, start_after, seconds, gap, images):
    """Runs each variant at each batch size after `gap` seconds, from `start_after` seconds on,
    printing its row."""
    lib = decode_probe.load(lib_path)
    time.sleep(start_after)
    for v, batch in itertools.product(variants, batches):
        time.sleep(gap)
        out = ctypes.create_string_buffer(1024)
        # ctypes lets go of the GIL for the call: the training loop runs on meanwhile.
        rc = lib.carpool_decode_probe(v.encode(), seconds, max(images, batch), batch, out,
                                      len(out))
        print(f"in-process {out.value.decode()}" + ("" if rc == 0 else f" (rc {rc})"), flush=True)


def photo_jpegs(count, seed=0):
    """`count` 500x375 quality-90 JPEGs of a gradient with noise (the bench set's kind), packed
    in one bytes object, with their lengths."""
    import io

    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:375, 0:500]
    base = np.stack([255 * xx / 500, 255 * yy / 375, np.full_like(xx, 128.0)], axis=-1)
    out, lengths = io.BytesIO(), []
    for _ in range(count):
        rgb = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
        at = out.tell()
        Image.fromarray(rgb).save(out, format="JPEG", quality=90)
        lengths.append(out.tell() - at)
    return out.getvalue(), lengths


class DecodePerStep:
    """One batch of 256 JPEGs decoded inside this process (libcarpool_decode_probe.so's
    BatchDecoder: nvJPEG, the exact resize 256 and crop 256) for each training step, on a thread,
    at most `behind` batches behind the steps: the training loop blocks when the decode cannot
    keep up, as a job whose own process decodes its input would."""

    def __init__(self, lib_path, dev, behind=2, vary=0, pageable=False):
        import queue
        try:
            self.decoder = decode_probe.Decoder(decode_probe.load(lib_path), 256)
        except RuntimeError as e:
            raise SystemExit(f"train_beside: {e}") from None
        data, lengths = photo_jpegs(512)
        # Page-locked, as a job's decode segment is: nvJPEG's uploads are DMA (--decode-pageable:
        # plain memory, the uploads staged). Kept alive: the calls read it.
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if not pageable:
            self.data = self.data.pin_memory()
        base = self.data.data_ptr()
        self.batches = [decode_probe.packed(base, lengths[:256]),
                        decode_probe.packed(base + sum(lengths[:256]), lengths[256:])]
        self.out = torch.empty((256, 256, 256, 3), dtype=torch.uint8, device=dev)
        self.tokens = queue.Queue(maxsize=behind)
        self.decoded, self.error, self.vary = 0, None, vary
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        torch.cuda.set_device(self.out.device)  # a new thread starts on device 0
        k = 0
        while self.tokens.get() is not None:
            # --decode-vary: batches of 256 - (0..vary) JPEGs, as a job's builds with some hits.
            n = 256 - (k * 7) % (self.vary + 1) if self.vary else 256
            starts, lengths = self.batches[k % 2]
            if n < 256:
                starts = (ctypes.c_void_p * n)(*starts[:n])
                lengths = (ctypes.c_uint64 * n)(*lengths[:n])
            try:
                self.decoder.decode(starts, lengths, self.out.data_ptr())
            except RuntimeError as e:
                self.error = str(e)
                return
            self.decoded += n
            k += 1

    def step_done(self):
        if self.error:
            raise SystemExit(f"train_beside: decode: {self.error}")
        self.tokens.put(1)  # blocks while the decode is `behind` batches behind


def print_profile(profiler, seconds, images, decoded):
    """Each kernel's and copy's GPU time over the profiled window, largest first."""
    rows = []
    for e in profiler.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0)
        if dev_us > 0:
            rows.append((dev_us, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"profile: {seconds:.2f} s, {images} trained, decoded so far {decoded}; GPU busy "
          f"{total / 1e6:.3f} s summed over streams", flush=True)
    for dev_us, count, key in rows[:40]:
        print(f"profile: {dev_us / 1e3:9.2f} ms {count:6d}x  {key[:110]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--window", type=float, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--decode-in-process", metavar="LIB",
                    help="libcarpool_decode_probe.so: decode rows on a thread of this process")
    ap.add_argument("--decode-variants", default="hardware,gpu-hybrid",
                    help="as carpool_jpeg_decode_bench --variants")
    ap.add_argument("--decode-batches", default="256",
                    help="JPEGs per nvJPEG call, a comma-separated list: each variant at each")
    ap.add_argument("--decode-start", type=float, default=5,
                    help="seconds of training alone before the first row")
    ap.add_argument("--decode-seconds", type=float, default=6)
    ap.add_argument("--decode-gap", type=float, default=3)
    ap.add_argument("--decode-images", type=int, default=512)
    ap.add_argument("--decode-per-step", metavar="LIB",
                    help="libcarpool_decode_probe.so: from --decode-start seconds on, for "
                         "--decode-seconds, one batch decoded in this process per training step")
    ap.add_argument("--decode-vary", type=int, default=0, metavar="K",
                    help="with --decode-per-step: each batch 256 - (0..K) JPEGs, sizes changing")
    ap.add_argument("--decode-pageable", action="store_true",
                    help="with --decode-per-step: the JPEGs in pageable memory, not page-locked")
    ap.add_argument("--profile-at", type=float, default=None, metavar="T",
                    help="run torch.profiler from T seconds for --profile-seconds and print the "
                         "GPU time of each kernel (every stream of this process, the decode's too)")
    ap.add_argument("--profile-seconds", type=float, default=1.0)
    ap.add_argument("--profile-trace", metavar="PATH", help="also write the profile's Chrome trace")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    torch.backends.cudnn.benchmark = True
    model, opt = make_model(torch, {"seed": 0, "model": "resnet18", "classes": 1000}, dev)
    step = make_step(torch, model, opt, dev)
    b = args.batch_size
    x = torch.randn(b, 3, CROP, CROP, device=dev).to(memory_format=torch.channels_last).half()
    y = torch.randint(0, 1000, (b,), device=dev)
    for _ in range(5):
        step(x, y)
    torch.cuda.synchronize()
    if args.decode_in_process:
        threading.Thread(target=decode_rows, daemon=True,
                         args=(args.decode_in_process, args.decode_variants.split(","),
                               [int(b) for b in args.decode_batches.split(",")],
                               args.decode_start, args.decode_seconds, args.decode_gap,
                               args.decode_images)).start()
    per_step = (DecodePerStep(args.decode_per_step, dev, vary=args.decode_vary,
                              pageable=args.decode_pageable)
                if args.decode_per_step else None)
    profiler = None
    start = window_start = time.monotonic()
    images = 0
    stream = torch.cuda.current_stream()
    while time.monotonic() - start < args.seconds:
        step(x, y)
        stream.synchronize()  # the training stream only: not a decode thread's stream too
        images += b
        now = time.monotonic()
        if per_step and args.decode_start <= now - start < args.decode_start + args.decode_seconds:
            per_step.step_done()
        if args.profile_at is not None and profiler is None and now - start >= args.profile_at:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
            profiler.start()
            profile_start, profile_images = now, 0
        if profiler is not None and profile_start is not None:
            profile_images += b
            if now - profile_start >= args.profile_seconds:
                profiler.stop()
                print_profile(profiler, now - profile_start, profile_images,
                              per_step.decoded if per_step else 0)
                if args.profile_trace:
                    profiler.export_chrome_trace(args.profile_trace)
                profile_start = None
        if now - window_start >= args.window:
            # Unix time too, to line a window up with what ran beside it (other clocks).
            decoded = f" decoded {per_step.decoded}" if per_step else ""
            print(f"train_beside t={now - start:5.1f}s unix={time.time():.1f} "
                  f"{images / (now - window_start):7.0f} img/s{decoded}", flush=True)
            window_start, images = now, 0


if __name__ == "__main__":
    main()
