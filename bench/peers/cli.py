"""Issue 13 (CPU part): carpool against the loaders users would pick instead, on the same data.

  scripts/bench_peers_venv.sh      # once: the peers in ~/.cache/carpool/bench-venv
  PYTHONPATH=client/python ~/.cache/carpool/bench-venv/bin/python -m bench.peers [--quick]
      [--count 2500]
      [--scenarios ...] [--configs ...] [--workers 4] [--max-seconds 60]
      [--wds-shard-size 50] [--json-out F] [--md-out F] | --wds-model

Configurations, each with the same W workers in all (--workers) and the same pipeline: decode,
resize 256, centre crop 256, random crop 224, flip, normalize (ImageNet), float32 NCHW:
  carpool       `carpool server --workers W`, one carpool.Loader per job;
  dataloader    torchvision ImageFolder + DataLoader(shuffle=True) per job, W split over the jobs;
  dali          a DALI CPU pipeline per job (fn.readers.file, fn.decoders.image on the CPU, resize,
                crop, fn.crop_mirror_normalize), num_threads = W split over the jobs;
  tensorsocket  one TensorProducer over a DataLoader with W workers, one TensorConsumer per job;
                where one producer cannot serve the scenario, what a user must do instead;
  webdataset    webdataset's own loader per job over tar shards of the same JPEGs (written once
                with its ShardWriter, in a fixed shuffled order, --wds-shard-size per shard):
                WebDataset(shards, shardshuffle=100).shuffle(1000).decode("pil").map(pipeline)
                in a DataLoader with W split over the jobs.
Each job is a process that sleeps --step-ms per 64 samples (its simulated training step). The
report: aggregate and per-job samples/s, CPU seconds of every process of the configuration per
delivered sample, each job's epoch checked from the delivered sample ids (exactly once, order
against the listing, how well it mixes webdataset's shards, order shared with another job,
augmentation shared with another job), and carpool's preparations per delivery against the
scenario's lower bound. The carpool server's cache is a fraction of the prepared set
(--cache-fraction, default 1.0 and 0.1): carpool runs each scenario once per fraction, a row
each; the other configurations have no such cache, so they run once per scenario and their
figures repeat in its other rows. --wds-model prints webdataset's order model without images.
docs/peers.md has the method and the results."""

import argparse
import sys

from bench import cache as bench_cache
from bench.common import SAMPLE_BYTES
from bench.peers.run import Bench
from bench.peers.scenarios import CONFIGS, SCENARIOS
from bench.peers.shards import wds_model_table


def parser(prog=None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, help="synthetic JPEGs (default 2500; quick 600)")
    ap.add_argument("--data-dir", help="image folder (default ~/.cache/carpool/bench-peers/...)")
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=CONFIGS)
    ap.add_argument("--workers", type=int, default=4, help="loader workers per configuration")
    ap.add_argument("--step-ms", type=float, default=20.0,
                    help="simulated training per 64 samples (default 20, as bench e2e)")
    ap.add_argument("--speeds-step-ms", type=float, default=100.0,
                    help="speeds scenario: the fast job's step per 64 samples (slow: twice). "
                         "Default 100: the fast job asks for more than a loader per job gives "
                         "here, the slow one for less; at 200 every loader nears the steps' "
                         "ceiling and the scenario measures the sleep, not the loader")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, help="per scenario and configuration (60)")
    bench_cache.add_arguments(ap, "carpool server cache in bytes, e.g. 2GiB, instead of "
                                  "--cache-fraction")
    ap.add_argument("--wds-shard-size", type=int, default=50,
                    help="webdataset: samples per tar shard (default 50: 50 shards of 2500)")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    ap.add_argument("--quick", action="store_true", help="600 images, 20 s cap: a smoke test")
    ap.add_argument("--wds-model", action="store_true",
                    help="print webdataset's order model (wds_order_model: shard mix, shards in "
                         "the first tenth, exactly once) for a few sizes, and exit")
    return ap


def main():
    args = parser("python -m bench.peers").parse_args()
    if args.wds_model:
        print(wds_model_table())
        return
    # TensorSocket sends 8 loader batches at a time and drops an epoch's rest: 600 images give
    # it one send of 512 (300 would give it none).
    quick = {"count": 600, "max_seconds": 20.0}
    full = {"count": 2500, "max_seconds": 60.0}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.count, args.workers, args.epochs) < 1 or args.count < 3:
        sys.exit("bench.peers: --count must be >= 3, --workers and --epochs >= 1")
    args.prepared_set = bench_cache.prepared_set(args.count, SAMPLE_BYTES)
    args.caches = bench_cache.choose("bench.peers", args.prepared_set, args.cache_fraction,
                                     args.cache_size)
    Bench(args).run()


if __name__ == "__main__":
    main()
