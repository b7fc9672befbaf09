#!/usr/bin/python3
"""The sweep of examples/optuna_sweep.py on Ray Tune: class subset and learning rate, 8 trials 4 at
a time, Tune's Optuna searcher (TPE) and the median rule of Optuna's MedianPruner. Each Ray node
runs one carpool server (carpool.ray, cache 10% of the prepared set), started with the sweep and
gone when Ray stops; a trial reads through carpool.Loader from its node's server. Every epoch a
trial completes is checked to hold each sample of its dataset exactly once.

    scripts/ray_venv.sh                     # build-ray/venv with ray[tune]
    PYTHONPATH=.:client/python build-ray/venv/bin/python examples/ray_tune_sweep.py [--trials 8]
        [--parallel 4] [--epochs 2] [--train-samples N] [--address auto]  # auto: ray start --head

from the repository root: the bench package and carpool come from PYTHONPATH; the trials get the
folders this process imported them (and examples/optuna_sweep.py) from.

It prints each trial, the best one, and per node the server's sharing ratio, jobs and reference
counts after the sweep (0 and 0), then checks that the servers are gone after ray.shutdown().
docs/python.md, "Ray Tune"."""

import argparse
import functools
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import zlib

import numpy as np
import ray
import torch
from ray import train, tune
from ray.tune.search.optuna import OptunaSearch

# examples/ (this script's folder): the subsets, data and datasets; first, because it says how
# to run this where the bench or carpool package is not found.
import optuna_sweep as osw  # isort: skip

import bench
import carpool
import carpool.datasets as cds
import carpool.ray
from bench import cache as bench_cache
from bench import fmnist_train as ft
from carpool.idx import read_idx

# Where the trials (Ray workers, any folder) import optuna_sweep, bench and carpool from: the
# folders this process imported them from, ahead of its PYTHONPATH.
PATHS = [str(pathlib.Path(m.__file__).resolve().parents[i]) for m, i in
         ((osw, 0), (bench, 1), (carpool, 1))]


def trainable(config, args=None, test=None, train_labels=None):
    """One trial on the node it runs on: derive its subset there, train, report each epoch."""
    torch.set_num_threads(1)  # the trials share the cores with each other and the server
    socket, state_dir = carpool.ray.local_server()
    classes = osw.SUBSET_SPACES[args.subsets][config["classes"]]
    name = osw.derive_subset(args.prefix, args.base, classes, state_dir)
    expected = osw.expected_epoch(train_labels, cds.info(args.base, state_dir=state_dir), classes)
    keep = np.isin(test[1], classes)
    seed = zlib.crc32(train.get_context().get_trial_id().encode())
    model = ft.make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    with carpool.Loader(name, batch_size=args.batch_size, epochs=args.epochs,
                        transform=ft.TRANSFORM, socket=socket, seed=seed) as loader:
        for epoch in range(loader.epochs):
            ids, labels = [], []
            ft.train_epoch(model, opt, osw.recorded(loader, ids, labels))
            once = osw.exactly_once(ids, labels, expected)
            train.report({"accuracy": ft.test_accuracy(model, (test[0][keep], test[1][keep])),
                          "epoch": epoch, "exactly_once": once, "samples": sum(map(len, ids)),
                          "job": loader.job_id})


def node_setup(args, data, state_dir):
    """Runs on each node before its server starts: the base dataset in that node's catalog."""
    node_args = argparse.Namespace(**{**vars(args), "state_dir": pathlib.Path(state_dir)})
    osw.register_base(node_args, data)


def drained(nodes, wait=10.0):
    """Each node's server statistics once its job list is empty (a stopped trial's job leaves
    within the lease), or after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        stats = carpool.ray.server_stats()
        if all(not s["jobs"] for s in stats.values()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


class MedianStop(tune.schedulers.FIFOScheduler):
    """Optuna's MedianPruner(n_startup_trials=2) as a Tune scheduler, rule for rule: nothing stops
    until `min_trials` trials have completed; then, after an epoch other than the last, a trial
    whose best result so far is worse than the median of the *completed* trials' results at that
    epoch stops (running and stopped trials are not compared against, as Optuna compares only
    COMPLETE trials). It never pauses a trial, which Tune's MedianStoppingRule does while it has
    too few results to compare (a paused function trial restarts as a second job)."""

    def __init__(self, min_trials=2, epochs=None):
        super().__init__()
        self.min_trials = min_trials
        self.epochs = epochs  # the last epoch completes, never stops (Optuna's example's rule)
        self.maximize = True
        self.results = {}     # trial id -> {epoch: metric}
        self.completed = {}   # the same, for the trials that ran to their end
        self.stopped = set()  # Tune calls on_trial_complete for the trials it stops too

    def set_search_properties(self, metric, mode, **spec):
        if mode:
            self.maximize = mode == "max"
        return super().set_search_properties(metric, mode, **spec)

    def on_trial_result(self, tune_controller, trial, result):
        if self.metric not in result:
            return tune.schedulers.TrialScheduler.CONTINUE
        step, value = result["training_iteration"], result[self.metric]
        mine = self.results.setdefault(trial.trial_id, {})
        mine[step] = value
        others = [r[step] for r in self.completed.values() if step in r]
        last = self.epochs is not None and step >= self.epochs
        if last or len(self.completed) < self.min_trials or not others:
            return tune.schedulers.TrialScheduler.CONTINUE
        best = max(mine.values()) if self.maximize else min(mine.values())
        median = float(np.median(others))
        if (best < median) if self.maximize else (best > median):
            self.stopped.add(trial.trial_id)
            return tune.schedulers.TrialScheduler.STOP
        return tune.schedulers.TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result):
        if trial.trial_id not in self.stopped and trial.trial_id in self.results:
            self.completed[trial.trial_id] = self.results[trial.trial_id]
        super().on_trial_complete(tune_controller, trial, result)


def stopper(args):
    """Early stopping that stops trials and never pauses one: a paused function trial restarts
    from scratch (no checkpoint), a new job reading its epochs again."""
    if args.stopper == "asha":  # stops half the trials at each rung
        return tune.schedulers.ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=2)
    return MedianStop(min_trials=2, epochs=args.epochs)  # optuna_sweep.py's MedianPruner(2)


def tune_sweep(args, test, train_labels):
    # With a searcher other than random search, Tune starts one trial at a time (one pending
    # placement group: ray.tune's _get_max_pending_trials), and the first trials' jobs joined 3-5 s
    # apart; let the --parallel trials start together, so that they read together and share.
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(args.parallel))
    space = {"classes": tune.choice(sorted(osw.SUBSET_SPACES[args.subsets])),
             "lr": tune.loguniform(0.005, 0.2)}
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, args=args, test=test,
                                                 train_labels=train_labels), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="accuracy", mode="max", num_samples=args.trials,
            max_concurrent_trials=args.parallel, search_alg=OptunaSearch(seed=args.seed),
            # A new trial runs in a finished one's worker: without, each started a process and
            # imported torch, and the trials joined 8-9 s after the ones they replaced.
            reuse_actors=True,

            scheduler=stopper(args)),
        run_config=train.RunConfig(storage_path=str(args.work / "ray_results"),
                                   name="carpool-tune", verbose=0))
    return tuner.fit()


def summarize(results, args, seconds):
    """Prints each trial and the best; returns the epochs completed and those not exactly once."""
    epochs = not_once = complete = 0
    for r in results:
        if r.error:
            raise SystemExit(f"ray_tune_sweep.py: trial {r.path} failed: {r.error}")
        rows = r.metrics_dataframe
        if rows["job"].nunique() != 1:  # a restarted trial reads its epochs again as a new job
            raise SystemExit(f"ray_tune_sweep.py: trial {r.path} ran as jobs "
                             f"{sorted(rows['job'].unique())}; it must run once")
        epochs += len(rows)
        not_once += int((~rows["exactly_once"].astype(bool)).sum())
        done = len(rows) == args.epochs
        complete += done
        print(f"trial classes {r.config['classes']:<13} lr {r.config['lr']:.4g}: "
              f"{len(rows)} epochs ({'complete' if done else 'stopped'}), accuracy "
              f"{r.metrics['accuracy']:.4f}, job {r.metrics['job']}", flush=True)
    print(f"{len(results)} trials in {seconds:.1f} s: {complete} complete, "
          f"{len(results) - complete} stopped early")
    best = results.get_best_result(metric="accuracy", mode="max", scope="last")
    print(f"best trial: accuracy {best.metrics['accuracy']:.4f} classes "
          f"{best.config['classes']} lr {best.config['lr']:.4g}")
    print(f"{epochs} epochs completed; {epochs - not_once} of them held every sample of their "
          f"dataset exactly once, each with its label")
    return epochs, not_once


def run_sweep(args):
    data, synthetic = osw.fmnist_files(args.work)
    if synthetic:
        print(f"Fashion-MNIST not found in {ft.FMNIST}: using synthetic IDX data in {data}")
    args.base, samples = osw.register_base(args, data)
    cache = bench_cache.choose("ray_tune_sweep.py",
                               bench_cache.prepared_set(samples, osw.SAMPLE_BYTES),
                               [osw.CACHE_FRACTION], None)[0]
    print(f"base dataset {args.base}: {samples} samples; {cache['description']}")
    test = (read_idx(data / "t10k-images-idx3-ubyte.gz")[:args.test_samples],
            read_idx(data / "t10k-labels-idx1-ubyte.gz")[:args.test_samples].astype(np.int64))
    env = {"PYTHONPATH": os.pathsep.join(PATHS + [os.environ.get("PYTHONPATH", "")])}
    env.update({k: v for k, v in os.environ.items() if k.startswith("CARPOOL_")})
    ray.init(address=args.address, num_cpus=None if args.address else args.parallel,
             include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False)
    try:
        nodes = carpool.ray.start_servers(args.state_dir, functools.partial(node_setup, args, data),
                                          cache_size=cache["cache_size"], follow=args.follow)
        print(f"carpool servers on {len(nodes)} Ray node(s): "
              f"{', '.join(s for s, _ in nodes.values())}", flush=True)
        t0 = time.monotonic()
        # --record: every node's server status every second (through its actor: each node's
        # socket is on that node), then the sharing bound per node.
        files = {node: record_file(args.record, node, len(nodes)) for node in nodes}
        recorder = Recorder(files) if args.record else None
        try:
            results = tune_sweep(args, test, read_idx(data / "train-labels-idx1-ubyte.gz"))
        finally:
            if recorder:
                time.sleep(2)  # a record or two after the last job left
                recorder.stop()
        epochs, not_once = summarize(results, args, time.monotonic() - t0)
        space = osw.SUBSET_SPACES[args.subsets]
        for node, path in (files.items() if recorder else ()):
            print(f"node {node[:12]}: status series in {path}")
            # The replay reads the node's catalog: only the driver's own node's is on this disk
            # (every node has the same path, each its own catalog).
            local = node == ray.get_runtime_context().get_node_id()
            osw.sharing_bound(path, {osw.subset_name(args.prefix, args.base, c): (k, c)
                                     for k, c in space.items()},
                              replay={"state_dir": nodes[node][1], "batch_size": args.batch_size,
                                      "follow": args.follow} if local else None)
        for node, s in drained(nodes).items():
            print(f"node {node[:12]}: {s['deliveries']} deliveries, {s['preparations']} "
                  f"preparations, sharing ratio {s['sharing_ratio']:.2f}; after the sweep "
                  f"{len(s['jobs'])} jobs, refcount {s['refcount_total']}")
    finally:
        ray.shutdown()
    gone = servers_gone([s for s, _ in nodes.values()])
    print(f"servers after ray.shutdown(): {'gone' if gone else 'STILL ANSWERING'}")
    return not_once == 0 and epochs > 0 and gone


def record_file(record, node, nodes):
    """The --record file of a node's server: FILE itself on one node, FILE.<node id> on several."""
    return record if nodes == 1 else f"{record}.{node[:12]}"


class Recorder:
    """Writes every node's server status once a second, as `carpool status --json-lines` does
    ({"elapsed_s", "status"} lines, which optuna_sweep.sharing_bound reads), until stop()."""

    def __init__(self, files, every=1.0):
        self.files = {node: open(path, "w") for node, path in files.items()}
        self.every, self.t0 = every, time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while True:
            elapsed = time.monotonic() - self.t0
            try:
                nodes = carpool.ray.server_stats()
            except Exception as e:  # a node lost mid-sweep: say so, keep recording the others
                print(f"ray_tune_sweep.py: --record missed a second: {e}", file=sys.stderr)
                nodes = {}
            for node, stats in nodes.items():
                if node in self.files:
                    self.files[node].write(json.dumps({"elapsed_s": elapsed, "status": stats}) +
                                           "\n")
                    self.files[node].flush()
            if self.done.wait(self.every):
                return

    def stop(self):
        self.done.set()
        self.thread.join()
        for f in self.files.values():
            f.close()


def servers_gone(sockets, wait=15.0):
    """True once no socket answers (the actors' exit stops the servers), within `wait` s."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        answering = 0
        for socket in sockets:
            try:
                carpool.server_stats(socket=socket)
                answering += 1
            except carpool.CarpoolError:
                pass
        if not answering:
            return True
        time.sleep(0.2)
    return False


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, text in (
            ("trials", 8, None), ("parallel", 4, "trials at once"), ("epochs", 2, None),
            ("batch-size", 64, None), ("test-samples", 10000, None), ("seed", 0, None),
            ("train-samples", 0, "the first N records of the train set (default: all 60,000)")):
        ap.add_argument("--" + flag, type=int, default=default, help=text)
    ap.add_argument("--subsets", choices=sorted(osw.SUBSET_SPACES), default="drop",
                    help="the class subsets trials pick from (examples/optuna_sweep.py)")
    ap.add_argument("--stopper", choices=("median", "asha"), default="median",
                    help="early stopping: median (Optuna's MedianPruner, as "
                         "examples/optuna_sweep.py) or asha (stops half the trials each epoch)")
    ap.add_argument("--address", help="a running Ray cluster ('auto' after `ray start --head`); "
                    "default: a local Ray started here with --parallel CPUs")
    ap.add_argument("--state-dir", type=pathlib.Path,
                    help="each node's catalog and socket (default: a temporary dir)")
    ap.add_argument("--follow", choices=("on", "off"), default="on",
                    help="the servers' --follow: a trial joining mid-epoch copies a running "
                    "trial's order in its first epoch (off: for comparison)")
    ap.add_argument("--record", metavar="FILE",
                    help="record each node's server status every second (FILE, or FILE.<node id> "
                         "on several nodes) and print the sharing bound of the jobs it saw")
    args = ap.parse_args()
    if args.trials < 1 or args.parallel < 1 or args.epochs < 1:
        ap.error("--trials, --parallel and --epochs must be >= 1")
    return args


def main():
    args = parse_args()
    args.prefix = f"tune-{int(time.time())}-"
    with tempfile.TemporaryDirectory(prefix="carpool-tune-") as tmp:
        args.work = pathlib.Path(tmp)
        args.state_dir = args.state_dir or args.work / "state"
        try:
            ok = run_sweep(args)
        except carpool.CarpoolError as e:
            print(f"ray_tune_sweep.py: {e}", file=sys.stderr)
            return 1
        finally:
            removed = osw.remove_prefixed(args.prefix, args.state_dir)
            print(f"removed the sweep's {len(removed)} datasets ({args.prefix}*)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
