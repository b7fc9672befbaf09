"""Issue 23: how far GPU decode's pixels are from the CPU decode's, on the bench set (the 500x375
JPEGs bench.gpu uses, `carpool dataset gen --seed 1`), after the whole preparation
(`resize=256,crop=256` by default).

Runs on any machine, without a GPU: a CPU job on the files registered with the CPU spec, and one
on the same files registered with `decode=gpu`, whose samples the CPU then decodes to exactly the
pixels nvJPEG's hardware backend gives (docs/gpu.md; tested bit-identical on an H200). Prints the
mean, 99.9th percentile and maximum absolute difference per channel value, and the share above 8.
  PYTHONPATH=client/python python3 -m bench.decode_fidelity [--count 500] [--prepare resize=256,crop=256]"""

import argparse
import tempfile

import numpy as np

import carpool
from bench.common import ensure_jpegs


def pixels(name, socket, count):
    """sample id -> uint8 HWC image, one epoch of a CPU job."""
    out = {}
    with carpool.Loader(name, batch_size=50, epochs=1, seed=0, transform="uint8|nhwc",
                        socket=socket, timeout=60.0) as loader:
        for images, _ in loader:
            for i, sid in enumerate(loader.ids.tolist()):
                out[sid] = np.array(images[i], copy=True)
    assert len(out) == count, (len(out), count)
    return out


def main():
    ap = argparse.ArgumentParser(prog="python -m bench.decode_fidelity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--prepare", default="resize=256,crop=256")
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    root = ensure_jpegs(args.data_dir, "bench-gpu", args.count, carpool)
    with tempfile.TemporaryDirectory(prefix="carpool-fidelity-") as state:
        carpool.cli("dataset", "add", "cpu", "--dir", str(root), "--prepare", args.prepare,
                    "--quiet", state_dir=state)
        carpool.cli("dataset", "add", "gpu", "--dir", str(root), "--prepare",
                    args.prepare + ",decode=gpu", "--quiet", state_dir=state)
        with carpool.Server(state, gpus="none", cache_size="512MiB") as srv:
            cpu = pixels("cpu", srv.socket, args.count)
            gpu = pixels("gpu", srv.socket, args.count)
    diff = np.stack([np.abs(cpu[k].astype(np.int16) - gpu[k].astype(np.int16)) for k in cpu])
    flat = diff.ravel()
    print(f"{args.count} JPEGs of {root}, prepare {args.prepare}: GPU decode against CPU decode, "
          f"per channel value: mean {flat.mean():.3f}, 99.9th percentile "
          f"{np.percentile(flat, 99.9):.0f}, max {flat.max()}, above 8: "
          f"{100 * (flat > 8).mean():.2f}%, identical: {100 * (flat == 0).mean():.1f}%")


if __name__ == "__main__":
    main()
