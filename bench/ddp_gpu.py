"""Issue 12 on two GPUs: a 2-rank DDP ResNet-18 job (cuda:0 and cuda:1) next to a 1-GPU trial on
the same dataset (cuda:0), fed by carpool, then by DataLoader + DistributedSampler (and a plain
DataLoader for the trial), in one run.

  PYTHONPATH=client/python python3 -m bench.ddp_gpu [--count 20000] [--max-seconds 20]
      [--json-out F] [--smoke]

The DDP ranks are spawned with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
TORCHELASTIC_RUN_ID, MASTER_ADDR/PORT), so carpool.Loader takes its rank, job key and device
(cuda:LOCAL_RANK) from it; NCCL all-reduces the gradients (gloo in --smoke, on the CPU). Checked:
each rank's batches are on its own GPU, both ranks take the same number of steps, and the server
uploads each sample once per GPU (its gpus[] counters). The data, the model and the step are
bench.gpu's. --smoke: 400 images, CPU, a tiny model, to test the orchestration here."""

import json
import os
import pathlib
import shutil
import socket as socketlib
import sys
import tempfile
import time
import traceback

from bench.common import import_carpool
from bench.gpu.cli import finish_args, parser
from bench.gpu.jobs import aggregate, job_process, run_job, run_jobs
from bench.gpu.run import Bench
from bench.torchvision_jobs import job_workers


def free_port():
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_rank(spec, go, stop, progress, out):
    """One rank of the DDP job: bench.gpu's job loop with torch.distributed around it."""
    try:
        os.environ.update(RANK=str(spec["rank"]), WORLD_SIZE="2", LOCAL_RANK=str(spec["rank"]),
                          LOCAL_WORLD_SIZE="2", TORCHELASTIC_RUN_ID=spec["run_id"],
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
        import torch
        import torch.distributed as dist
        cuda = spec["device"] != "cpu"
        dist.init_process_group("nccl" if cuda else "gloo")
        if spec["side"] == "baseline":  # DistributedSampler gives this rank its share
            spec = dict(spec, distributed=True)
        run_job(spec, go, stop, progress, out, wrap=lambda m: torch.nn.parallel.
                   DistributedDataParallel(m, device_ids=[spec["rank"]] if cuda else None))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", spec["job"], traceback.format_exc()))
        sys.exit(1)


def main():
    ap = parser("python -m bench.ddp_gpu")
    ap.set_defaults(scenarios=["n1"], rate_seconds=4)
    args = finish_args(ap.parse_args())
    bench = Bench(args)
    bench.carpool = import_carpool()
    tmp = tempfile.mkdtemp(prefix="carpool-ddp-bench-")
    bench.state_dir = bench.log_dir = pathlib.Path(tmp)
    report = {"config": vars(args), "sides": {}}
    try:
        bench.prepare_data()
        if bench.carpool:
            bench.register()
        cpu = args.device == "cpu"
        for side in ["carpool", "baseline"] if bench.carpool else ["baseline"]:
            port, run_id = free_port(), f"bench-{time.time_ns()}"
            specs = []
            for rank in range(2):  # the DDP job: global batch 2 x batch_size
                specs.append(bench.spec(side, rank, "all", rank=rank, port=port, run_id=run_id,
                                        device="cpu" if cpu else f"cuda:{rank}", ddp=True, seed=1,
                                        loader_device=None))
            specs.append(bench.spec(side, 2, "all", device="cpu" if cpu else "cuda:0"))  # trial
            for s in specs[:2]:
                s["planned"] //= 2  # each rank sees half the epoch
                rest = args.count % (2 * args.batch_size)
                s["tail"] = (rest + 1) // 2  # the last slice (carpool) or batch (sampler)
            t = time.monotonic()
            if side == "carpool":
                with bench.server("ddp", gpus="0,1") as srv:
                    for s in specs:
                        s["socket"] = srv.socket
                    results, _, _ = run_jobs(specs, args.max_seconds,
                                                target_of=lambda s: ddp_rank if s.get("ddp")
                                                else job_process)
                    stats = bench.carpool.server_stats(socket=srv.socket)
            else:
                for s in specs:
                    s["workers"] = job_workers(args.workers, 3, s["job"])
                results, _, _ = run_jobs(specs, args.max_seconds,
                                            target_of=lambda s: ddp_rank if s.get("ddp")
                                            else job_process)
                stats = None
            agg = aggregate(results, bench.sampler)
            ddp = [r for r in results[:2]]
            row = {"images_per_s": agg["images_per_s"], "wall_s": agg["wall_s"],
                   "ddp_images_per_s": sum(r["images"] for r in ddp) / max(
                       max(r["end"] for r in ddp) - min(r["start"] for r in ddp), 1e-9),
                   "trial_images_per_s": results[2]["images_per_s"],
                   "ddp_steps": [r["steps"] for r in ddp],
                   "devices": [r.get("batch_device") for r in results], "jobs": results}
            if stats is not None:
                row["gpus"] = stats.get("gpus", [])
                row["deliveries"], row["preparations"] = stats["deliveries"], stats["preparations"]
            report["sides"][side] = row
            print(f"{side:8}: all {row['images_per_s']:.0f} img/s, DDP job "
                  f"{row['ddp_images_per_s']:.0f} img/s (steps {row['ddp_steps']}), 1-GPU trial "
                  f"{row['trial_images_per_s']:.0f} img/s; batches on {row['devices']} "
                  f"({time.monotonic() - t:.0f} s)", flush=True)
            for g in row.get("gpus", []):
                print(f"          GPU {g['device']}: {g['uploads']} uploads, {g['images']} images "
                      f"built, {g['resident_hits']} resident hits", flush=True)
            if stats is not None:
                print(f"          server: {row['preparations']} preparations for "
                      f"{row['deliveries']} deliveries", flush=True)
    finally:
        bench.sampler.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if args.json_out:
            pathlib.Path(args.json_out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
