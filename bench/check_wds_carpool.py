"""Issue 13 item 4: tar shards written by the `webdataset` library register and serve exactly once
in carpool.

  PYTHONPATH=client/python ~/.cache/carpool/bench-venv/bin/python -m bench.check_wds_carpool
      [--count 2500]
      [--shard-size 50] [--epochs 2] [--jobs 2]

Writes (or reuses) the shards that `python -m bench.peers --configs webdataset` reads: the synthetic
JPEGs of `carpool bench e2e`, each sample's `__key__` its ImageFolder index, `.jpg` the file and
`.cls` its label, written by webdataset's own ShardWriter. Registers them with `carpool dataset
add --tar`, starts a server, and runs --jobs jobs together, each --epochs epochs with its own
seed. Checks every epoch of every job: each shard member delivered exactly once, with the label
of its `.cls`, in an order whose rank correlation with the listing is about N(0, 1). Prints one
line per job and epoch; exits 1 when a check fails, 2 when a package is missing."""

import argparse
import os
import pathlib
import shutil
import sqlite3
import sys
import tempfile
import threading

PREPARE = "resize=64,crop=64"  # small: the check is the ids and labels, not the pixels


def member_keys(state_dir):
    """catalog sample id -> the member's webdataset key (its ImageFolder index)."""
    db = sqlite3.connect(f"file:{state_dir}/catalog.db?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, name FROM samples").fetchall()
    finally:
        db.close()
    return {i: int(name.split(".", 1)[0]) for i, name in rows}


def run_job(carpool, socket, seed, epochs, out):
    """One job: its epochs (one pass of the loader each) as lists of (catalog id, label), and
    whatever a pass after the last epoch yielded (nothing, if the server is right)."""
    loader = carpool.Loader("wds", batch_size=64, epochs=epochs, socket=socket, seed=seed)
    passes = []
    try:
        for _ in range(epochs + 1):
            passes.append([])
            for _, labels in loader:
                passes[-1] += zip(loader.ids.tolist(), labels.tolist())
    finally:
        loader.close()
    out[seed] = passes if passes[-1] else passes[:-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2500, help="synthetic JPEGs (default 2500)")
    ap.add_argument("--shard-size", type=int, default=50, help="samples per shard (default 50)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2, help="jobs together, seeds 1..N")
    a = ap.parse_args()
    if min(a.count, a.shard_size, a.epochs, a.jobs) < 1:
        sys.exit("bench.check_wds_carpool: --count, --shard-size, --epochs and --jobs must be >= 1")
    try:
        import carpool
        import webdataset  # noqa: F401  the shards' writer
        from torchvision.datasets import ImageFolder
    except ImportError as e:
        print(f"bench.check_wds_carpool: {e}; run it with the python of "
              "scripts/bench_peers_venv.sh",
              file=sys.stderr)
        sys.exit(2)
    from bench.common import ensure_jpegs, epoch_check, order_z
    from bench.peers.shards import write_shards

    root = ensure_jpegs(None, "bench-peers", a.count, carpool)
    samples = ImageFolder(str(root)).samples
    shards = write_shards(root, samples, list(range(len(samples))), a.shard_size, "all")
    print(f"{len(samples)} samples in {len(shards)} shards written by webdataset "
          f"{webdataset.__version__}: {pathlib.Path(shards[0]).parent}", flush=True)
    state = tempfile.mkdtemp(prefix="carpool-wds-")
    server = None
    try:
        carpool.cli("dataset", "add", "wds", "--tar", *shards, "--prepare", PREPARE, "--quiet",
                    state_dir=state)
        keys = member_keys(state)
        if sorted(keys.values()) != list(range(len(samples))):
            print(f"FAIL: registered {len(keys)} members, keys {min(keys.values())}.."
                  f"{max(keys.values())}; expected each of 0..{len(samples) - 1} once")
            return 1
        server = carpool.Server(state, workers=4, cache_size="1GiB",
                                log=os.path.join(state, "server.log")).start()
        out = {}
        threads = [threading.Thread(target=run_job, args=(carpool, server.socket, seed,
                                                          a.epochs, out))
                   for seed in range(1, a.jobs + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = 0
        expected = list(range(len(samples)))
        for seed in range(1, a.jobs + 1):
            epochs = out.get(seed)
            if epochs is None:
                print(f"FAIL: job {seed} ended without its epochs (server log: "
                      f"{os.path.join(state, 'server.log')})")
                failed += 1
                continue
            for e, got in enumerate(epochs):
                indices = [keys[i] for i, _ in got]
                wrong = sum(label != samples[keys[i]][1] for i, label in got)
                once = epoch_check([indices], expected)
                z = order_z(indices, expected)
                ok = once == "exact" and wrong == 0 and e < a.epochs
                failed += not ok
                print(f"job {seed} epoch {e}: {len(got)} samples, {once}, "
                      f"{wrong} wrong labels, order z {z:.1f}: {'ok' if ok else 'FAIL'}")
        print("all epochs exactly once with their .cls labels" if not failed
              else f"{failed} epoch(s) failed")
        return 1 if failed else 0
    finally:
        if server:
            server.stop()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
