"""A ResNet-18 training loop on synthetic input (bench.gpu's step), printing its rate every
--window seconds for --seconds: run it beside a decode benchmark to see what each costs the other.

    python3 -m bench.gpu.train_beside --seconds 40 --window 5 &
"""

import argparse
import time

import torch

from bench.common import CROP
from bench.gpu.sides import make_model, make_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--window", type=float, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
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
    start = window_start = time.monotonic()
    images = 0
    while time.monotonic() - start < args.seconds:
        step(x, y)
        torch.cuda.synchronize()
        images += b
        now = time.monotonic()
        if now - window_start >= args.window:
            # Unix time too, to line a window up with what ran beside it (other clocks).
            print(f"train_beside t={now - start:5.1f}s unix={time.time():.1f} "
                  f"{images / (now - window_start):7.0f} img/s", flush=True)
            window_start, images = now, 0


if __name__ == "__main__":
    main()
