#!/usr/bin/python3
"""A model of a sampler that is not built: per round, one uniformly random order of the union of
the participants' remaining sets, each job taking the first sample of its own R. Each job's draw
is still uniform over its R (the first of its R in a random order), two jobs share a round with
probability |R1 & R2| / |R1 | R2|, and no third job changes that. It counts the sharing ratio
(assignments per distinct sample of a round) for jobs on class subsets of Fashion-MNIST, every
job in every round, to set against `carpool sim` (the built sampling tree) on the same subsets:
docs/benchmarks.md, "What the sampler itself allows when the subsets differ".

  /usr/bin/python3 -m bench.union_order_model [--epochs 2] [--seed 1]

Samples are grouped by which jobs still hold them (atoms), so a round costs O(atoms) per draw."""

import argparse
import gzip
import os
import pathlib
import random

FMNIST = pathlib.Path(os.environ.get("CARPOOL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
SUBSETS = {"fh": {0, 1, 2, 3, 4}, "tops": {0, 2, 3, 4, 6}, "fb": {5, 7, 8, 9},
           "fm": set(range(10))}
MIXES = (["fh", "fh", "fb"], ["fh", "fh", "tops"], ["fh", "fh", "fm"],
         ["fh"] * 4 + ["fb"] * 2 + ["tops", "fm"])


class Atoms:
    """Samples by the bitmask of jobs whose remaining set holds them; O(1) moves."""

    def __init__(self):
        self.mask, self.lists, self.pos = {}, {}, {}

    def move(self, sample, new):
        old = self.mask.get(sample, 0)
        if old:
            lst, i = self.lists[old], self.pos[sample]
            lst[i] = lst[-1]
            self.pos[lst[i]] = i
            lst.pop()
            if not lst:
                del self.lists[old]
        self.mask[sample] = new
        if new:
            lst = self.lists.setdefault(new, [])
            self.pos[sample] = len(lst)
            lst.append(sample)

    def add_job(self, j, samples):
        for s in samples:
            self.move(s, self.mask.get(s, 0) | (1 << j))


def sharing(labels, jobs, epochs, seed):
    rng = random.Random(seed)
    data = [[i for i, c in enumerate(labels) if c in SUBSETS[d]] for d in jobs]
    atoms = Atoms()
    remaining, epoch = [len(d) for d in data], [0] * len(jobs)
    for j, d in enumerate(data):
        atoms.add_job(j, d)
    assigned = distinct = 0
    while True:
        active = 0
        for j, d in enumerate(data):
            if remaining[j] == 0 and epoch[j] + 1 < epochs:
                epoch[j] += 1
                remaining[j] = len(d)
                atoms.add_job(j, d)
            if remaining[j]:
                active |= 1 << j
        if not active:
            return assigned / distinct
        unassigned = active
        while unassigned:  # the next sample of the union's random order that some job still needs
            cands = [(m, len(lst)) for m, lst in atoms.lists.items() if m & unassigned]
            r = rng.randrange(sum(c for _, c in cands))
            for m, c in cands:
                if r < c:
                    break
                r -= c
            lst = atoms.lists[m]
            takers = m & unassigned
            atoms.move(lst[rng.randrange(len(lst))], m & ~takers)
            assigned += bin(takers).count("1")
            distinct += 1
            for j in range(len(jobs)):
                remaining[j] -= takers >> j & 1
            unassigned &= ~takers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with gzip.open(FMNIST / "train-labels-idx1-ubyte.gz") as f:
        labels = list(f.read()[8:])
    for jobs in MIXES:
        print(f"{' + '.join(jobs)}: sharing ratio {sharing(labels, jobs, a.epochs, a.seed):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
