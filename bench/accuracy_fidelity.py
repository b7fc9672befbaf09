"""Does carpool's sampling order change what a model learns? The same small CNN, the same epochs,
the same seeds, trained two ways on the same Fashion-MNIST training samples:

  carpool:    a job on a carpool server (DSA order, per-job seeded), with two other training jobs
              (other learning rates) on the same dataset sharing the server at the same time;
  DataLoader: PyTorch's own DataLoader(shuffle=True, generator seeded), same normalization.

Prints each run's test accuracy on t10k and mean +- std per way. Starts its own server on a
temporary state dir.
  PYTHONPATH=client/python python3 -m bench.accuracy_fidelity [--seeds 0 1 2] [--epochs 2]
      [--train-size 30000] [--json F] [--device cuda]
--train-size N uses the first N training records (a derived dataset, `--from fmnist --ids`), to keep the runtime to a
few minutes on 2 cores; 60000 is the full set. --device cuda trains every model on cuda:0: the
carpool jobs' loaders deliver their batches there (a server with --gpus 0), and the DataLoader's
batches are copied there."""

import argparse
import json
import pathlib
import sqlite3
import statistics
import tempfile
import time

import carpool
import torch

from bench import fmnist_train as ft
from bench.sweep_demo import finish_job, launch_job

LR, BATCH = 0.05, 64
COMPANION_LRS = (0.02, 0.1)


def train_dataloader(images, labels, seed, epochs, device="cpu"):
    """The baseline: torch's shuffling DataLoader over the same samples and values."""
    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.from_numpy(ft.normalize(images)),
                                          torch.from_numpy(labels))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    model = ft.make_model(seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for _ in range(epochs):
        ft.train_epoch(model, opt, loader if device == "cpu" else
                       ((x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                        for x, y in loader))
    return ft.test_accuracy(model)


def train_carpool(socket, dataset, seed, epochs, device="cpu"):
    """The measured job plus two companions, all at once; returns the measured job's row."""
    rows = [{} for _ in range(1 + len(COMPANION_LRS))]
    procs = [launch_job(socket, dataset, LR, BATCH, epochs, seed, device)]
    procs += [launch_job(socket, dataset, lr, BATCH, epochs, 1000 + seed, device)
              for lr in COMPANION_LRS]
    ok = [finish_job(p, r) for p, r in zip(procs, rows)]
    if not all(ok):
        raise SystemExit(f"a carpool training job failed (seed {seed}); see its error above")
    return rows


def first_records(state_dir, n):
    """The first n sample ids of the catalog (those of "fmnist") and their IDX record indices, from
    the catalog's samples table (docs/catalog.md)."""
    db = sqlite3.connect(f"file:{state_dir}/catalog.db?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, record FROM samples ORDER BY id LIMIT ?", (n,)).fetchall()
    finally:
        db.close()
    lo = rows[0][0]
    if [r[0] for r in rows] != list(range(lo, lo + len(rows))):
        raise SystemExit("catalog ids are not contiguous; cannot derive the training subset")
    return lo, [r[1] for r in rows]


def mean_std(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=30000)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the models train and the batches go (cuda: cuda:0)")
    args = ap.parse_args()
    device = "cuda:0" if args.device == "cuda" else "cpu"
    server_flags = {"gpus": "0"} if args.device == "cuda" else {}
    images, labels = ft.idx_split("train")
    results = {"carpool": [], "dataloader": [], "sharing": []}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="carpool-fidelity-") as tmp:
        carpool.cli("dataset", "add", "fmnist", "--idx", ft.FMNIST / "train-images-idx3-ubyte.gz",
                    ft.FMNIST / "train-labels-idx1-ubyte.gz", "--quiet", state_dir=tmp)
        lo, ids = first_records(tmp, args.train_size)
        carpool.cli("dataset", "add", "train", "--from", "fmnist", "--ids", f"{lo}:{lo + len(ids)}",
                    "--quiet", state_dir=tmp)
        images, labels = images[ids], labels[ids]  # the baseline trains on exactly these
        with carpool.Server(tmp, log=f"{tmp}/server.log", cache_size="256MiB",
                            **server_flags) as server:
            for seed in args.seeds:
                before = carpool.server_stats(socket=server.socket)
                rows = train_carpool(server.socket, "train", seed, args.epochs, device)
                after = carpool.server_stats(socket=server.socket)
                if rows[0]["samples"] != args.epochs * args.train_size:
                    raise SystemExit(f"carpool job saw {rows[0]['samples']} samples, expected "
                                     f"{args.epochs * args.train_size}")
                prep = after["preparations"] - before["preparations"]
                deliv = after["deliveries"] - before["deliveries"]
                acc_dl = train_dataloader(images, labels, seed, args.epochs, device)
                results["carpool"].append(rows[0]["accuracy"])
                results["dataloader"].append(acc_dl)
                results["sharing"].append({"preparations": prep, "deliveries": deliv})
                print(f"seed {seed}: carpool {rows[0]['accuracy']:.4f} (companions "
                      f"{', '.join(format(r['accuracy'], '.4f') for r in rows[1:])}; server: {prep} "
                      f"preparations for {deliv} deliveries)   DataLoader {acc_dl:.4f}",
                      flush=True)
    print(f"\nFashion-MNIST, {args.train_size} training samples, {args.epochs} epochs, batch "
          f"{BATCH}, SGD lr {LR} momentum 0.9, seeds {' '.join(map(str, args.seeds))}, {device} "
          f"({time.monotonic() - t0:.0f} s)")
    print(f"| loader | test accuracy, mean ± std | runs |\n|---|---|---|")
    for way, name in (("carpool", "carpool (DSA, 2 other jobs sharing)"),
                      ("dataloader", "PyTorch DataLoader(shuffle=True)")):
        m, s = mean_std(results[way])
        print(f"| {name} | {m:.4f} ± {s:.4f} | "
              f"{', '.join(format(a, '.4f') for a in results[way])} |")
    (m1, s1), (m2, s2) = mean_std(results["carpool"]), mean_std(results["dataloader"])
    se = ((s1 ** 2 + s2 ** 2) / len(args.seeds)) ** 0.5
    print(f"difference of means (carpool - DataLoader): {m1 - m2:+.4f}"
          + (f", {abs(m1 - m2) / se:.1f} standard errors" if se > 0 else ""))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
