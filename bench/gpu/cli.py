"""Issue 9: carpool's GPU path end to end, against torchvision's DataLoader in the same run.

  PYTHONPATH=client/python python3 -m bench.gpu [--count 20000]
      [--scenarios n1 n2 n4 overlap late slow batches] [--epochs 1]
      [--sides carpool baseline gpudecode tensorsocket]
      [--max-seconds 45] [--json-out F] [--md-out F] [--smoke]

Every job is a real ResNet-18 training process (spawned), on one GPU: bf16 autocast,
channels_last, batch 256 (job 0 of "batches": 64), SGD lr 0.1 momentum 0.9. Each scenario runs
once per side (--sides), back to back:
  carpool:  a fresh `carpool server --gpus N --workers W` and one carpool.Loader(device=cuda:N) per
            job, transform random_crop(224)|flip|normalize(imagenet)|float16|nhwc;
  baseline: torchvision ImageFolder + DataLoader(shuffle, pin_memory) per job, the same pipeline,
            the same W CPU workers split over the jobs, non_blocking copies to the GPU;
  gpudecode: per job, DataLoader workers read the files and the job decodes them on its GPU
            (torchvision.io.decode_jpeg, batched) with the same pipeline in transforms.v2 there;
  inproc:   not a peer but a probe of docs/gpu.md's plan: the gpudecode side's workers, and
            carpool's nvJPEG path (--decode-probe) run a batch ahead on a thread of each job, in
            its own CUDA context (no server; each job decodes its own samples)
  tensorsocket: TensorSocket's TensorProducer over the baseline's DataLoader, one per dataset
            (and, with --ts-late own, one for a late job), with its jobs' shares of the W
            workers; the jobs its TensorConsumers. Its pool puts the batches on the GPU and the
            jobs get them through CUDA IPC. Each job's epoch is checked from the delivered ids.
            Its packages: scripts/peer_wheels.sh.
Also measured in the run: the GPU's training rate on synthetic on-GPU input, and the server's
prepare rate (one job that drops its batches). They give each scenario's physical limit.
The server's cache and GPU area are a fraction of the prepared set (--cache-fraction, default
1.0 and 0.1): the carpool side runs each scenario once per fraction, a row each; the other sides
have no such cache, so they run once per scenario and their figures repeat in its other rows.
docs/benchmarks.md ("Issue 9: GPU end to end") gives the method and the columns; scripts/gpu_bench.sh
runs this on the GPU machine from the bundle. --smoke: 200 images, CPU, a tiny model, batch 8, to
test the orchestration without a GPU (the carpool side runs only where a carpool build exists)."""

import argparse
import os
import sys

from bench import cache as bench_cache
from bench.common import SAMPLE_BYTES
from bench.gpu.jobs import gpu_index
from bench.gpu.report import SIDE_NAMES
from bench.gpu.run import Bench
from bench.gpu.scenarios import OVERLAP_PARTS, SCENARIOS


def parser(prog=None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, help="synthetic JPEGs (default 20000; smoke 200)")
    ap.add_argument("--data-dir", help="image folder (default ~/.cache/carpool/bench-gpu/...)")
    ap.add_argument("--state-dir", help="catalog and socket (default: a temporary folder)")
    ap.add_argument("--log-dir", help="server logs (default: the temporary folder)")
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--sides", nargs="+", choices=list(SIDE_NAMES),
                    default=["carpool", "baseline"],
                    help="baseline: a DataLoader per job; gpudecode: torchvision.io.decode_jpeg on "
                         "the GPU + transforms.v2 there, per job; tensorsocket: one TensorProducer "
                         "over the baseline's DataLoader per dataset, the jobs its consumers "
                         "(issue 13's GPU peers; tensorsocket needs scripts/peer_wheels.sh)")
    ap.add_argument("--decode-probe", metavar="LIB",
                    help="the inproc side's libcarpool_decode_probe.so (a CUDA build's server/); "
                         "inproc: the gpudecode side with carpool's nvJPEG path run a batch ahead "
                         "on threads of each job, in its own CUDA context: a probe of "
                         "docs/gpu.md's plan (its Python pipeline limits it), not a carpool mode")
    ap.add_argument("--ts-late", choices=["own", "shared"], default="own",
                    help="tensorsocket, late scenario: the late job gets a producer of its own "
                         "(default), or joins the others' (served from its next epoch only; it "
                         "stalls once the on-time jobs have left)")
    ap.add_argument("--device", help="default cuda:0; smoke cpu")
    ap.add_argument("--model", choices=["resnet18", "tiny"], help="default resnet18; smoke tiny")
    ap.add_argument("--batch-size", type=int, help="default 256; smoke 8")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, help="per scenario and side (default 45)")
    ap.add_argument("--rate-seconds", type=float, help="GPU rate run (default 10; smoke 2)")
    ap.add_argument("--workers", type=int, help="CPU workers, all jobs together (default: cores)")
    bench_cache.add_arguments(ap, "server cache in bytes, e.g. 8GiB, instead of --cache-fraction")
    ap.add_argument("--gpu-cache-size",
                    help="GPU device-resident area in bytes, e.g. 4GiB (default: the same "
                         "fraction of the prepared set as the server cache)")
    # The runs of docs/benchmarks.md before this default passed --lookahead 4096.
    ap.add_argument("--lookahead", type=int,
                    help="server look-ahead in samples, passed only when given (default: the "
                         "server's own)")
    ap.add_argument("--gpu-decode", choices=["auto", "on", "off"],
                    help="the server's --gpu-decode, passed only when given (default: the "
                         "server's own, auto: nvJPEG where it loads)")
    ap.add_argument("--job-decode", choices=["on", "off"],
                    help="the server's --job-decode (GPU decode in the jobs' own processes), "
                         "passed only when given (default: the server's, on)")
    ap.add_argument("--prefetch", type=int, default=8, help="batches per job ahead (default 8)")
    ap.add_argument("--transform", default="random_crop(224)|flip|normalize(imagenet)|float16|nhwc")
    ap.add_argument("--warmup", type=int, help="untimed steps per job (default 5; smoke 1)")
    ap.add_argument("--slow-mode", choices=["twice", "sleep"], default="twice",
                    help="half speed: train twice on each batch, or sleep one step time")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    ap.add_argument("--status-series", metavar="DIR",
                    help="record each carpool server's status every 0.25 s while its jobs run, "
                         "into DIR/status-LABEL.jsonl (carpool report draws one)")
    ap.add_argument("--mps", action="store_true",
                    help="run every side under NVIDIA MPS: start nvidia-cuda-mps-control -d "
                         "before the first CUDA process and stop it at the end (a daemon "
                         "already running is used and left running)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the whole orchestration")
    return ap


def finish_args(args):
    """Fills the defaults of a full (GPU) or --smoke run; exits on a bad value."""
    smoke = {"count": 200, "device": "cpu", "model": "tiny", "batch_size": 8, "max_seconds": 60,
             "rate_seconds": 2, "workers": 2, "warmup": 1}
    full = {"count": 20000, "device": "cuda:0", "model": "resnet18", "batch_size": 256,
            "max_seconds": 45, "rate_seconds": 10, "workers": len(os.sched_getaffinity(0)),
            "warmup": 5}
    for k, v in (smoke if args.smoke else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.count, args.batch_size, args.epochs, args.workers) < 1:
        sys.exit("bench.gpu: --count, --batch-size, --epochs and --workers must be >= 1")
    if args.lookahead is not None and args.lookahead < 1:
        sys.exit(f"bench.gpu: --lookahead {args.lookahead}: give at least 1 sample, or leave "
                 "it out for the server's own")
    args.prepared_set = bench_cache.prepared_set(args.count, SAMPLE_BYTES)
    args.caches = bench_cache.choose("bench.gpu", args.prepared_set, args.cache_fraction,
                                     args.cache_size, args.gpu_cache_size,
                                     gpu=gpu_index(args.device) is not None)
    if args.mps and gpu_index(args.device) is None:
        sys.exit(f"bench.gpu: --mps needs a CUDA device, not --device {args.device}; leave out "
                 "--mps (or --smoke)")
    if "inproc" in args.sides and (args.decode_probe is None or
                                   not os.path.isfile(args.decode_probe) or
                                   gpu_index(args.device) is None):
        sys.exit(f"bench.gpu: the inproc side needs a CUDA device and --decode-probe naming "
                 f"libcarpool_decode_probe.so (got {args.decode_probe!r}); build it with "
                 "CARPOOL_BUILD_BENCHMARKS in a CUDA build")
    if "overlap" in args.scenarios and args.count < OVERLAP_PARTS:
        sys.exit(f"bench.gpu: the overlap scenario needs --count >= {OVERLAP_PARTS}")
    return args


def main():
    # carpool's client sets CUDA's hardware queues to 32 in a job's process (carpool/__init__.py);
    # every side and the training rate alone run with the same, so the comparison is of loaders.
    # A value in the environment wins, for every side alike.
    from carpool import CUDA_CONNECTIONS  # the client's value, not a copy of it
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", CUDA_CONNECTIONS)
    Bench(finish_args(parser("python -m bench.gpu").parse_args())).run()


if __name__ == "__main__":
    main()
