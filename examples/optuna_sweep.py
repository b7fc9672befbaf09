#!/usr/bin/python3
"""A hyperparameter sweep with Optuna whose trials share one carpool server.

Each trial trains the small Fashion-MNIST CNN of bench.fmnist_train on a subset of the
classes (a hyperparameter, served as a dataset derived with carpool.datasets.derive) at a
learning rate (the other one), and reports its accuracy on the test images of those classes
after every epoch. `--parallel` worker processes run the `--trials` trials of one study at once,
through an Optuna journal file, so concurrent trials read overlapping datasets from one server
and its cache (10% of the prepared set) prepares each sample once for several of them.

    PYTHONPATH=.:client/python examples/optuna_sweep.py [--trials 8] [--parallel 4] [--epochs 2]
        [--train-samples N]

from the repository root: the bench package (repository root) and carpool (client/python, a
bundle's python/ or an installed wheel) come from PYTHONPATH.

A subset's dataset is named by a hash of (base dataset, classes), prefixed with --prefix: two
trials asking for the same subset get the same dataset, and a second derive of it is a no-op.
`--remove PREFIX` removes every dataset with that prefix; a sweep removes its own at the end
unless --keep-datasets. Without the real Fashion-MNIST files (package dataset-fashion-mnist, or
$CARPOOL_FMNIST_DIR) it writes synthetic IDX files of the same shapes and says so.
docs/python.md, "Hyperparameter sweeps with Optuna"."""

import argparse
import hashlib
import json
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from typing import NamedTuple

import numpy as np
import optuna
import torch

try:
    import carpool
    import carpool.datasets as cds
    from bench import cache as bench_cache  # the cache as a fraction of the prepared set
    from bench import fmnist_train as ft  # the model, one epoch of SGD, test accuracy
    from carpool.idx import read_idx, write_idx
except ModuleNotFoundError as e:
    if e.name not in ("bench", "carpool"):
        raise
    sys.exit(f"{pathlib.Path(__file__).name}: {e}; run it from the repository root with "
             "PYTHONPATH=.:client/python (the bench package, and carpool unless installed)")

# The class subsets a trial may pick (--subsets); they overlap, so concurrent trials share
# samples. "drop": the whole set or it without one group of classes, as a sweep over which
# classes to train on usually is; four of them at once could share at most about 3. "halves":
# about half the classes each, the harder case; four at once could share at most about 1.7-2.4.
SUBSET_SPACES = {
    "drop": {"all": list(range(10)), "no-shirts": [0, 1, 2, 3, 4, 5, 7, 8, 9],
             "no-footwear": [0, 1, 2, 3, 4, 6, 8], "no-bags": [0, 1, 2, 3, 4, 5, 6, 7, 9]},
    "halves": {"all": list(range(10)), "tops": [0, 2, 3, 4, 6], "footwear-bags": [5, 7, 8, 9],
               "first-half": [0, 1, 2, 3, 4]},
}
SAMPLE_BYTES = 28 * 28  # a prepared Fashion-MNIST sample: raw,channels=1
CACHE_FRACTION = 0.1


def subset_name(prefix, base, classes):
    """The dataset of `classes` of `base`: the same name for the same subset, in any process."""
    digest = hashlib.sha256(f"{base}:{','.join(map(str, sorted(classes)))}".encode()).hexdigest()
    return f"{prefix}{digest[:12]}"


def derive_subset(prefix, base, classes, state_dir):
    """Derives the subset's dataset unless it exists; a trial racing another for it is fine."""
    name = subset_name(prefix, base, classes)
    try:
        cds.derive(name, base, classes=sorted(classes), state_dir=state_dir)
    except carpool.CarpoolError as e:
        if e.code_name != "AlreadyExists":  # exists: same name, so same base and classes
            raise
    return name


def remove_prefixed(prefix, state_dir):
    """Removes every dataset whose name starts with `prefix`; returns their names."""
    names = [d["name"] for d in cds.list(state_dir=state_dir) if d["name"].startswith(prefix)]
    for name in names:
        cds.remove(name, missing_ok=True, state_dir=state_dir)
    return names


def fmnist_files(work):
    """The four IDX files: the real ones, else synthetic ones of the same shapes in `work`."""
    real = ft.FMNIST
    names = [f"{s}-{k}-idx{d}-ubyte.gz" for s in ("train", "t10k")
             for k, d in (("images", 3), ("labels", 1))]
    if all((real / n).exists() for n in names):
        return real, False
    rng = np.random.default_rng(0)
    # One pattern per class, the same in both splits, plus noise: learnable, so that the
    # accuracies mean something.
    pattern = rng.integers(0, 256, (10, 28, 28)).astype(np.int16)
    for split, n in (("train", 60000), ("t10k", 10000)):
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = np.empty((n, 28, 28), np.uint8)
        for i in range(0, n, 10000):  # in chunks: the noise of all 60,000 at once is 94 MB
            noise = rng.integers(-96, 97, (min(10000, n - i), 28, 28), dtype=np.int16)
            images[i:i + 10000] = np.clip(pattern[labels[i:i + 10000]] + noise, 0, 255)
        write_idx(work / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(work / f"{split}-labels-idx1-ubyte.gz", labels)
    return work, True


def recorded(loader, ids, labels):
    """The loader's batches, keeping each batch's sample ids in `ids` and labels in `labels`."""
    for images, batch_labels in loader:
        ids.append(loader.ids)
        labels.append(np.asarray(batch_labels))
        yield images, batch_labels


class Expected(NamedTuple):
    """What every epoch of a class subset must deliver."""
    ids: np.ndarray     # the subset's catalog ids, sorted
    lo: int             # the base's first id: its record i has id lo + i
    labels: np.ndarray  # the base's labels by record


def expected_epoch(train_labels, base, classes):
    """The ids and labels an epoch of `classes` of the base (`base`: its datasets.info) must hold,
    from the IDX labels file rather than the catalog, so that the check is a differential one."""
    lo, hi = base["ids"]
    if hi - lo + 1 != base["samples"]:
        raise ValueError(f"base dataset {base['name']} holds {base['samples']} samples over ids "
                         f"{lo}..{hi}: not one record per id, so its records' ids are unknown")
    labels = np.asarray(train_labels[:base["samples"]], np.int64)
    return Expected(lo + np.flatnonzero(np.isin(labels, classes)), lo, labels)


def exactly_once(ids, labels, expected):
    """Whether an epoch's batches (lists of their ids and labels) hold each of the subset's ids
    exactly once, none other, each with its record's label."""
    ids = np.concatenate(ids).astype(np.int64) if ids else np.empty(0, np.int64)
    labels = np.concatenate(labels).astype(np.int64) if labels else np.empty(0, np.int64)
    if len(ids) != len(expected.ids) or not np.array_equal(np.sort(ids), expected.ids):
        return False
    return np.array_equal(labels, expected.labels[ids - expected.lo])


def objective(trial, args, test, train_labels):
    space = SUBSET_SPACES[args.subsets]
    classes = space[trial.suggest_categorical("classes", sorted(space))]
    lr = trial.suggest_float("lr", 0.005, 0.2, log=True)
    name = derive_subset(args.prefix, args.base, classes, args.state_dir)
    expected = expected_epoch(train_labels, cds.info(args.base, state_dir=args.state_dir), classes)
    keep = np.isin(test[1], classes)
    test_split = (test[0][keep], test[1][keep])
    model = ft.make_model(trial.number)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    # Leaving the with-block, pruned or not, closes the Loader: the server drops the job at once.
    with carpool.Loader(name, batch_size=args.batch_size, epochs=args.epochs,
                        transform=ft.TRANSFORM, socket=args.socket, seed=trial.number) as loader:
        job = loader.job_id
        once = []  # per completed epoch: each sample of the dataset exactly once
        for epoch in range(loader.epochs):
            ids, labels = [], []
            ft.train_epoch(model, opt, recorded(loader, ids, labels))
            once.append(exactly_once(ids, labels, expected))
            trial.set_user_attr("exactly_once", once)
            accuracy = ft.test_accuracy(model, test_split)
            trial.report(accuracy, epoch)
            # After the last epoch there is nothing left to save: the trial completes.
            if epoch + 1 < loader.epochs and trial.should_prune():
                pruned_at = epoch
                break
        else:
            return accuracy
    print(json.dumps({"trial": trial.number, "pruned_after_epoch": pruned_at,
                      "accuracy": accuracy, "job": job,
                      "server_jobs_after_close": jobs_after_close(args.socket, job)}),
          flush=True)
    raise optuna.TrialPruned()


def jobs_after_close(socket, job, wait=5.0):
    """The server's job ids once `job` is gone (it notices the closed connection within a moment),
    or after `wait` seconds with `job` still listed."""
    deadline = time.monotonic() + wait
    while True:
        jobs = [j["id"] for j in carpool.server_stats(socket=socket)["jobs"]]
        if job not in jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(0.05)


def storage(journal):
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # journal: 3.1 beta
    return optuna.storages.JournalStorage(optuna.storages.JournalFileStorage(str(journal)))


def pruner(args):
    if args.prune_below is not None:  # every trial below this accuracy after an epoch stops
        return optuna.pruners.ThresholdPruner(lower=args.prune_below)
    return optuna.pruners.MedianPruner(n_startup_trials=2)


def run_worker(args):
    """One process of the sweep: --worker-trials trials of the shared study."""
    torch.set_num_threads(1)  # the trials share the cores with each other and the server
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=storage(args.journal),
                              sampler=optuna.samplers.TPESampler(seed=args.worker_seed),
                              pruner=pruner(args))
    test = read_idx(args.data / "t10k-images-idx3-ubyte.gz")[:args.test_samples], \
        read_idx(args.data / "t10k-labels-idx1-ubyte.gz")[:args.test_samples].astype(np.int64)
    train_labels = read_idx(args.data / "train-labels-idx1-ubyte.gz")
    study.optimize(lambda t: objective(t, args, test, train_labels), n_trials=args.worker_trials)


def register_base(args, data):
    """The sweep's base dataset: Fashion-MNIST train, or its first --train-samples records."""
    fm = cds.add("fmnist", idx=(data / "train-images-idx3-ubyte.gz",
                                data / "train-labels-idx1-ubyte.gz"), state_dir=args.state_dir) \
        if "fmnist" not in {d["name"] for d in cds.list(state_dir=args.state_dir)} \
        else cds.info("fmnist", state_dir=args.state_dir)
    if not args.train_samples:
        return "fmnist", fm["samples"]
    lo = fm["ids"][0]
    name = f"{args.prefix}train-{args.train_samples}"
    cds.derive(name, "fmnist", ids=(lo, lo + args.train_samples), replace=True,
               state_dir=args.state_dir)
    return name, args.train_samples


def worker_argv(args, trials, seed):
    argv = [sys.executable, __file__, "--worker", "--journal", str(args.journal), "--study",
            args.study, "--socket", args.socket, "--state-dir", str(args.state_dir), "--base",
            args.base, "--data", str(args.data), "--worker-trials", str(trials),
            "--worker-seed", str(seed), "--prefix", args.prefix]
    for flag in ("epochs", "batch_size", "test_samples", "prune_below", "subsets"):
        if getattr(args, flag) is not None:
            argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    return argv


def run_sweep(args, work):
    data, synthetic = fmnist_files(work)
    if synthetic:
        print(f"Fashion-MNIST not found in {ft.FMNIST}: using synthetic IDX data of the same "
              f"shapes in {data} (install dataset-fashion-mnist for the real one)")
    args.data = data
    args.base, samples = register_base(args, data)
    cache = bench_cache.choose("optuna_sweep.py", bench_cache.prepared_set(samples, SAMPLE_BYTES),
                               [CACHE_FRACTION], None)[0]
    print(f"base dataset {args.base}: {samples} samples; {cache['description']}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # this script prints the summary
    with carpool.Server(args.state_dir, log=str(work / "server.log"),
                        cache_size=cache["cache_size"], follow=args.follow) as server:
        args.socket = server.socket
        optuna.create_study(study_name=args.study, storage=storage(args.journal),
                            direction="maximize")
        shares = [args.trials // args.parallel + (i < args.trials % args.parallel)
                  for i in range(args.parallel)]
        t0 = time.monotonic()
        # --record: the server's status every --record-every seconds, for `carpool report FILE`.
        recorder = subprocess.Popen([carpool.binary(), "status", "--watch",
                                     str(args.record_every), "--json-lines",
                                     args.record, "--socket", server.socket]) \
            if args.record else None
        procs = [subprocess.Popen(worker_argv(args, n, args.seed + i))
                 for i, n in enumerate(shares) if n > 0]
        failed = [p.args for p in procs if p.wait() != 0]
        if recorder:
            time.sleep(2)  # a record or two after the last job left
            recorder.send_signal(signal.SIGINT)
            recorder.wait()
            print(f"status series in {args.record}; draw it with 'carpool report {args.record}'")
            sharing_bound(args.record, {subset_name(args.prefix, args.base, c): (k, c)
                                        for k, c in SUBSET_SPACES[args.subsets].items()},
                          replay={"state_dir": args.state_dir, "batch_size": args.batch_size,
                                  "follow": args.follow})
        if failed:
            raise SystemExit(f"optuna_sweep.py: {len(failed)} worker(s) failed (output above)")
        stats = drained(server.socket)
    if not report(optuna.load_study(study_name=args.study, storage=storage(args.journal)), stats,
                  time.monotonic() - t0):
        raise SystemExit("optuna_sweep.py: an epoch was not exactly once, no epoch completed, or "
                         "jobs were left on the server (above)")


def drained(socket, wait=10.0):
    """The server's statistics once its job list is empty (a closed trial's job leaves within a
    moment), or after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        stats = carpool.server_stats(socket=socket)
        if not stats["jobs"] or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def sharing_bound(record, subsets, windows=(1, 5), replay=None):
    """Prints each job of a --record series (its subset, when it ran, its epochs) and the highest
    sharing ratio any server could reach with these jobs at these times and paces: within each
    window of W seconds, a class's samples prepared once for all the jobs reading that class, at
    the pace of the fastest (a job reads a class at its rate times the class's share of its
    dataset). A cache that keeps samples longer than W seconds could do better; 10% of the
    prepared set holds about 1-2 s of this sweep's deliveries."""
    with open(record) as f:  # a last line cut short by the recorder's stop is left out
        records = [json.loads(line) for line in f if line.rstrip().endswith("}")]
    jobs = {}  # id -> {"subset", "classes", "series": [(seconds, deliveries)]}
    for r in records:
        for j in r["status"]["jobs"]:
            if j["dataset"] in subsets:
                job = jobs.setdefault(j["id"], {"subset": subsets[j["dataset"]][0],
                                                "classes": subsets[j["dataset"]][1],
                                                "dataset": j["dataset"], "series": []})
                job["series"].append((r["elapsed_s"], j["deliveries"]))
    for jid, job in sorted(jobs.items()):
        (t0, _), (t1, n) = job["series"][0], job["series"][-1]
        print(f"  job {jid}: {job['subset']} ({len(job['classes'])} classes) from {t0:.0f} s to "
              f"{t1:.0f} s, {n} deliveries")
    delivered = sum(job["series"][-1][1] for job in jobs.values())
    for w in windows:
        window = {}  # (window index, job) -> deliveries in it
        for job_id, job in jobs.items():
            last = 0
            for t, n in job["series"]:
                key = (int(t // w), job_id)
                window[key] = window.get(key, 0) + n - last
                last = n
        need = 0.0
        for b in {b for b, _ in window}:
            for c in range(10):
                need += max([n / len(jobs[j]["classes"]) for (bb, j), n in window.items()
                             if bb == b and c in jobs[j]["classes"]] or [0])
        print(f"sharing bound, {w} s windows: " + (
            f"these jobs at these times could share at most {delivered / need:.2f} (deliveries "
            "per preparation)" if need else "none (the series saw no deliveries)"))
    if replay is not None and jobs:
        replay_sweep(records, jobs, **replay)


def replay_sweep(records, jobs, state_dir, batch_size, tick_ms=10, follow="on"):
    """Replays the series' jobs in `carpool sim`: the server's own scheduler and cache index, the
    same datasets, joins, epochs and cache capacity, each job at its mean pace with no jitter
    and preparations free, following as the server did (`follow`). What the server would share
    if every job kept a steady pace; the gap to the server's own figure is what the jobs' uneven
    paces cost. Needs the sweep's datasets
    (before they are removed) in `state_dir`. Returns sim's summary, or None (said why)."""
    capacity = max(r["status"]["pacing"]["capacity_samples"] for r in records)
    policy = records[-1]["status"]["policy"]
    times = [r["elapsed_s"] for r in records]
    step = float(np.median(np.diff(times))) if len(times) > 1 else 1.0  # the recording interval
    argv = [carpool.binary(), "sim", "--state-dir", str(state_dir), "--cache", str(capacity),
            "--policy", policy, "--batch", str(batch_size), "--follow", follow, "--json"]
    for jid, job in sorted(jobs.items()):
        series = job["series"]
        n1 = series[-1][1]
        if n1 == 0:
            continue  # recorded before its first delivery only: nothing to replay
        t0, n0 = series[0]
        # Its last delivery: the time the count last grew (a trial evaluating after its last
        # epoch keeps its job open with nothing delivered).
        t1 = next(t for t, n in series if n == n1)
        if t1 <= t0:  # seen delivering in one record only: it ran about one interval
            t0, n0 = t1 - step, 0
        pace = (n1 - n0) / (t1 - t0)  # samples per second
        start = max(0.0, t0 - n0 / pace)  # back to its first delivery
        try:
            size = cds.info(job["dataset"], state_dir=state_dir)["samples"]
        except carpool.CarpoolError as e:  # not in this catalog (another node's, or removed)
            print(f"replay in carpool sim skipped: {e}")
            return None
        epochs = max(1, round(n1 / size))  # a stopped trial: one epoch and a prefetch
        argv += ["--job", f"j{jid}=dataset:{job['dataset']}@{int(start * 1000 / tick_ms)}"
                          f"x{max(pace * tick_ms / 1000, 1e-4):.4f}/{epochs}"]
    if "--job" not in argv:
        print("replay in carpool sim skipped: no job delivered in the series")
        return None
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(f"replay in carpool sim failed: {r.stderr.strip()}")
        return None
    out = json.loads(r.stdout)
    print(f"replay, carpool's scheduler with these jobs at steady paces (carpool sim, cache "
          f"{capacity} samples, {policy}): sharing {out['sharing_ratio']:.2f} over "
          f"{out['deliveries']} deliveries; the best eviction on the same deliveries (Belady) "
          f"{out['deliveries'] / max(out['belady_preparations'], 1):.2f}")
    return out


def report(study, stats, seconds):
    states = [t.state.name for t in study.trials]
    print(f"{len(states)} trials in {seconds:.1f} s: {states.count('COMPLETE')} complete, "
          f"{states.count('PRUNED')} pruned")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if done:
        best = study.best_trial
        print(f"best trial: #{best.number} accuracy {best.value:.4f} classes "
              f"{best.params['classes']} lr {best.params['lr']:.4g}")
    else:
        print("best trial: none completed")
    once = [o for t in study.trials for o in t.user_attrs.get("exactly_once", [])]
    print(f"{len(once)} epochs completed; {sum(once)} of them held every sample of their "
          f"dataset exactly once, each with its label")
    print(f"server: {stats['deliveries']} deliveries, {stats['preparations']} preparations, "
          f"sharing ratio {stats['sharing_ratio']:.2f} (deliveries per preparation); after the "
          f"sweep {len(stats['jobs'])} jobs, refcount {stats['refcount_total']}")
    return len(once) > 0 and all(once) and not stats["jobs"] and stats["refcount_total"] == 0


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=4, help="worker processes, one study")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-samples", type=int, default=0,
                    help="train on the first N records of the train set (default: all 60,000)")
    ap.add_argument("--test-samples", type=int, default=10000)
    ap.add_argument("--prune-below", type=float, help="prune a trial whose accuracy after an "
                    "epoch is below this (default: Optuna's median pruner)")
    ap.add_argument("--subsets", choices=sorted(SUBSET_SPACES), default="drop",
                    help="the class subsets trials pick from: drop (the set without one group of "
                         "classes; default) or halves (about half the classes each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--follow", choices=("on", "off"), default="on",
                    help="the server's --follow: a trial joining mid-epoch copies a running "
                    "trial's order in its first epoch (off: for comparison)")
    ap.add_argument("--state-dir", type=pathlib.Path,
                    help="the catalog and the server's socket (default: a temporary dir)")
    ap.add_argument("--prefix", help="name prefix of the sweep's datasets (default sweep-<time>-)")
    ap.add_argument("--keep-datasets", action="store_true")
    ap.add_argument("--record", metavar="FILE", help="record the server's status every second "
                    "to FILE (JSON lines) for 'carpool report FILE'")
    ap.add_argument("--record-every", type=float, default=1.0, metavar="SECONDS",
                    help="with --record: the period of the status series (default 1; short "
                         "trials need less, or a job may start and end between two records)")
    ap.add_argument("--remove", metavar="PREFIX", help="remove the datasets named PREFIX... "
                    "in --state-dir, then exit")
    for hidden in ("--worker-trials", "--worker-seed"):
        ap.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    for hidden in ("--journal", "--study", "--socket", "--base", "--data"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trials < 1 or args.parallel < 1 or args.epochs < 1:
        ap.error("--trials, --parallel and --epochs must be >= 1")
    return args


def run(args):
    if args.worker:
        args.data, args.journal = pathlib.Path(args.data), pathlib.Path(args.journal)
        return run_worker(args)
    if args.remove:
        if args.state_dir is None:
            raise SystemExit("optuna_sweep.py: --remove needs the --state-dir of the sweep")
        print(f"removed: {remove_prefixed(args.remove, args.state_dir)}")
        return None
    args.prefix = args.prefix or f"sweep-{int(time.time())}-"
    with tempfile.TemporaryDirectory(prefix="carpool-optuna-") as tmp:
        work = pathlib.Path(tmp)
        args.state_dir = args.state_dir or work / "state"
        args.journal, args.study = work / "journal.log", "carpool-sweep"
        try:
            run_sweep(args, work)
        finally:
            if not args.keep_datasets:
                removed = remove_prefixed(args.prefix, args.state_dir)
                print(f"removed the sweep's {len(removed)} datasets ({args.prefix}*)")
    return None


def main():
    args = parse_args()
    try:
        run(args)
    except carpool.CarpoolError as e:  # the server's or the CLI's message, without a traceback
        print(f"optuna_sweep.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
