"""The small Fashion-MNIST training job shared by bench.sweep_demo and
bench.accuracy_fidelity: a model, one epoch of SGD over any iterable of batches, and the test
accuracy on t10k read with numpy (carpool.idx), so evaluation does not depend on the loader.

Run as a script it is one training job on a carpool server: it prints {"job_id": N} once attached,
then one JSON line with samples, seconds, final loss and test accuracy.
  python3 -m bench.fmnist_train --socket S --dataset fmnist --lr 0.05
      [--batch-size 64 --epochs 1 --seed 0]
                  [--device cuda:0]
With --device cuda:N the loader delivers batches in that GPU's memory and the model trains there."""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np
import torch
from torch import nn

import carpool
from carpool.idx import read_idx

FMNIST = pathlib.Path(os.environ.get("CARPOOL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST train-set pixel mean and std
TRANSFORM = f"normalize({MEAN},{STD})"  # carpool: float32 NCHW, (v/255 - mean)/std


def idx_split(split):
    """(images uint8 [N,28,28], labels int64 [N]) of 'train' or 't10k'."""
    images = read_idx(FMNIST / f"{split}-images-idx3-ubyte.gz")
    labels = read_idx(FMNIST / f"{split}-labels-idx1-ubyte.gz").astype(np.int64)
    return images, labels


def normalize(images_u8):
    """The same float32 values as carpool's normalize(MEAN,STD): [N,1,28,28]."""
    x = images_u8.astype(np.float32)[:, None, :, :] / np.float32(255.0)
    return (x - np.float32(MEAN)) / np.float32(STD)


def make_model(seed):
    """A small CNN (about 30k parameters); the same weights for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16x14x14
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32x7x7
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def train_epoch(model, optimizer, batches):
    """One pass of SGD over (images, labels) batches; returns (mean loss, samples)."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    total, n = 0.0, 0
    for images, labels in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)  # reads the zero-copy batch; nothing kept after
        loss.backward()
        optimizer.step()
        total += float(loss.detach()) * len(labels)
        n += len(labels)
    return total / max(n, 1), n


@torch.no_grad()
def test_accuracy(model, test=None):
    """Top-1 accuracy on the 10,000 t10k images."""
    images, labels = test if test is not None else idx_split("t10k")
    model.eval()
    x = torch.from_numpy(normalize(images))
    device = next(model.parameters()).device
    correct = 0
    for i in range(0, len(x), 1000):
        correct += int((model(x[i:i + 1000].to(device)).argmax(1).cpu() ==
                        torch.from_numpy(labels[i:i + 1000])).sum())
    return correct / len(x)


def run_carpool_job(args):
    torch.set_num_threads(1)  # several jobs share the cores with the server
    model = make_model(args.seed).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    t0 = time.monotonic()
    with carpool.Loader(args.dataset, batch_size=args.batch_size, epochs=args.epochs,
                        transform=TRANSFORM, device=args.device, socket=args.socket,
                        seed=args.seed) as loader:
        print(json.dumps({"job_id": loader.job_id}), flush=True)
        samples, loss = 0, 0.0
        for _ in range(loader.epochs):
            loss, n = train_epoch(model, opt, loader)
            samples += n
    seconds = time.monotonic() - t0
    print(json.dumps({"samples": samples, "seconds": seconds, "loss": loss,
                      "accuracy": test_accuracy(model)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="model init and the job's transform seed")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda:N for batches on that GPU")
    try:
        run_carpool_job(ap.parse_args())
    except carpool.CarpoolError as e:
        print(f"bench.fmnist_train: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
