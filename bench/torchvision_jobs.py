#!/usr/bin/python3
"""What users run today: torchvision ImageFolder + a PyTorch DataLoader per training job.

  python3 -m bench.torchvision_jobs --root DIR --jobs N --workers W [--batch-size B] [--epochs E]
      [--step-ms MS]
  python3 bench/torchvision_jobs.py ...   # the same: it imports nothing of bench/, so
      `carpool bench e2e --torchvision --torchvision-script bench/torchvision_jobs.py` runs it

Runs N jobs as N processes in parallel, each with its own DataLoader (shuffle=True) over the same
ImageFolder, the W workers split across the jobs as `carpool bench e2e` splits its baseline's
(W // N each, the remainder to the first jobs, at least 1). Each job sleeps --step-ms per batch,
standing in for training. The transforms match carpool bench e2e's defaults: the dataset's prepare
spec resize=256,crop=256 (Resize(256) + CenterCrop(256)) and the job transform
random_crop(224)|flip|normalize(imagenet) (RandomCrop(224) + RandomHorizontalFlip + ToTensor +
Normalize), float32 NCHW.

Prints one JSON line per job ({"job", "samples", "start", "end", "seconds", "samples_per_s",
"workers"}; start/end on one monotonic clock) and a last line {"aggregate": samples/s over first
start to last end, "samples", "wall_s"}. CPU time of all processes is measured by the caller
(carpool bench e2e --torchvision reaps this process with wait4, which includes every descendant).
Use /usr/bin/python3 (apt's torch 1.13 + torchvision 0.14)."""

import argparse
import json
import multiprocessing as mp
import sys
import time


def job_workers(total, n, i):
    return max(1, total // n + (1 if i < total % n else 0))


def imagenet_train_transform(transforms, crop=224):
    """The prepare spec resize=256,crop=256 then the job transform random_crop(crop)|flip|
    normalize(imagenet), float32 NCHW: what carpool's benchmarks ask of their baselines."""
    return transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(256),
        transforms.RandomCrop(crop),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])


def run_job(index, args, barrier, out_queue):
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    tf = imagenet_train_transform(transforms)
    workers = job_workers(args.workers, args.jobs, index)
    torch.manual_seed(index + 1)
    data = datasets.ImageFolder(args.root, transform=tf)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                        drop_last=False, persistent_workers=False)
    barrier.wait()  # all jobs start together, as in carpool bench e2e's sync scenarios
    start = time.monotonic()
    samples = 0
    for _ in range(args.epochs):
        for images, labels in loader:
            samples += images.shape[0]
            if args.step_ms > 0:
                time.sleep(args.step_ms / 1000.0)
    end = time.monotonic()
    out_queue.put({"job": index, "samples": samples, "start": start, "end": end,
                   "seconds": end - start, "samples_per_s": samples / (end - start),
                   "workers": workers})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="ImageFolder root (class subfolders)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers, all jobs together")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--step-ms", type=float, default=0.0)
    args = p.parse_args()
    if args.jobs < 1 or args.workers < 1 or args.batch_size < 1 or args.epochs < 1:
        sys.exit("bench.torchvision_jobs: --jobs, --workers, --batch-size and --epochs must be "
                 ">= 1")

    # Import once here, so the forked jobs do not each pay (and overlap) the import.
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    barrier = ctx.Barrier(args.jobs)
    procs = [ctx.Process(target=run_job, args=(i, args, barrier, queue))
             for i in range(args.jobs)]
    for proc in procs:
        proc.start()
    results = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            sys.exit(f"bench.torchvision_jobs: a job process exited with {proc.exitcode}")
    results.sort(key=lambda r: r["job"])
    for r in results:
        print(json.dumps(r))
    first = min(r["start"] for r in results)
    last = max(r["end"] for r in results)
    total = sum(r["samples"] for r in results)
    print(json.dumps({"aggregate": total / (last - first), "samples": total,
                      "wall_s": last - first}))


if __name__ == "__main__":
    main()
