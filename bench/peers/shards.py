"""webdataset's side of the peers benchmark: its tar shards of the JPEGs, how well a delivery
order mixes them, and the order model of its loader (--wds-model)."""

import math
import pathlib
import random
import shutil

from bench.peers.scenarios import MIX_WINDOW, WDS_SHUFFLE


def shard_layout(indices, shard_size):
    """Where webdataset's shards put each sample: the dataset's ImageFolder indices in a fixed
    shuffled order (seed 0; writers shuffle before sharding, or each shard would hold one class
    here), cut into shards of shard_size. Returns {index: shard}."""
    order = list(indices)
    random.Random(0).shuffle(order)
    return {i: k // shard_size for k, i in enumerate(order)}


def write_shards(root, samples, indices, shard_size, key):
    """The dataset's shards, written once with webdataset's ShardWriter next to the image folder
    (ROOT-wdsSIZE/KEY/shard-NNNNNN.tar): in shard_layout's order, each sample's key its
    ImageFolder index, .jpg the file's bytes, .cls its label. Returns the shard paths."""
    import webdataset as wds
    out = root.parent / f"{root.name}-wds{shard_size}" / key
    done = out / "complete"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        shard = shard_layout(indices, shard_size)
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=shard_size, verbose=0) as sink:
            for i in sorted(shard, key=shard.get):  # shard order; within a shard, the layout's
                path, label = samples[i]
                sink.write({"__key__": f"{i:06d}", "jpg": pathlib.Path(path).read_bytes(),
                            "cls": label})
        done.write_text("")
    return [str(x) for x in sorted(out.glob("shard-*.tar"))]


def shard_mix(ids, shard_of, window=MIX_WINDOW):
    """How well an order mixes webdataset's shards: the mean number of distinct shards among each
    run of `window` consecutive deliveries, divided by its expectation for a uniform permutation,
    sum over shards of 1 - C(n - size, window) / C(n, window). 1 = as mixed as a uniform shuffle;
    webdataset draws each batch from one worker's shuffle buffer, filled from few shards."""
    n = len(shard_of)
    if len(ids) < window or n < window:
        return None
    sizes = {}
    for s in shard_of.values():
        sizes[s] = sizes.get(s, 0) + 1
    expected = sum(1 - math.comb(n - z, window) / math.comb(n, window) for z in sizes.values())
    runs = [ids[k:k + window] for k in range(0, len(ids) - window + 1, window)]
    seen = sum(len({shard_of[i] for i in run if i in shard_of}) for run in runs) / len(runs)
    return seen / expected


def wds_order_model(n, shard_size, workers, batch, buffer=WDS_SHUFFLE, seed=1):
    """webdataset's epoch order without images, through its own shuffle (filters._shuffle): the
    shards dealt to DataLoader workers (shard k to worker k mod W), each worker's shards shuffled,
    its samples through a `buffer`-sample shuffle buffer, the batches taken from the workers in
    turn as the DataLoader does. Returns (shard mix of batch-long runs, share of the shards that
    the first tenth of the epoch comes from, exactly once)."""
    import itertools
    from webdataset.filters import _shuffle
    shards = [list(range(k, min(n, k + shard_size))) for k in range(0, n, shard_size)]
    rng = random.Random(seed)
    streams = []
    for w in range(workers):
        mine = shards[w::workers]
        rng.shuffle(mine)
        streams.append(_shuffle(iter(itertools.chain.from_iterable(mine)), bufsize=buffer,
                                rng=random.Random(seed * 1000 + w)))
    order, active = [], list(range(workers))
    while active:
        for w in list(active):
            got = list(itertools.islice(streams[w], batch))
            if not got:
                active.remove(w)
            order += got
    shard_of = {i: i // shard_size for i in range(n)}
    first = {shard_of[i] for i in order[:n // 10]}
    return (shard_mix(order, shard_of, batch), len(first) / len(shards),
            sorted(order) == list(range(n)))


def wds_model_table():
    """--wds-model: what webdataset's shuffles give, here and at a larger scale."""
    lines = ["| samples | shard size | workers | batch | shard mix | shards in the first tenth "
             "| exactly once |", "|---|---|---|---|---|---|---|"]
    for n, size, workers, batch in ((2500, 50, 4, 64), (2500, 50, 1, 64), (128000, 1000, 8, 256),
                                    (128000, 1000, 1, 256)):
        mix, first, once = wds_order_model(n, size, workers, batch)
        lines.append(f"| {n} | {size} | {workers} | {batch} | {mix:.2f} | {first:.2f} | "
                     f"{'yes' if once else 'no'} |")
    return "\n".join(lines)
