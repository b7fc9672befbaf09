"""How few preparations per delivery any sampler could reach in bench e2e's stagger scenario at a
small cache (docs/benchmarks.md, issue 20, "stagger"): a linear-programming lower bound, not a
claim about carpool's sampler.

Two jobs on one dataset of N samples, two epochs each, the second `--lead` x N samples behind the
first, both at one speed. Time runs in segments of C / k samples (C = the cache, `--cache` x N),
so each epoch is S = k / cache segments. A sample has four take times, one per job and epoch; a
take saves a preparation when the cache held the sample since its previous take (in time order).
The LP chooses the joint law of the four segments, each take uniform over its epoch's segments (a
uniform permutation) and, unless `--dependent`, each job's second epoch independent of its first;
and which of each sample's consecutive takes are held, with at most C samples held across any
whole segment. A hold is charged only for the whole segments strictly between its two takes, so
takes in one or adjacent segments cost nothing: every real sampler and eviction maps to a
feasible point and the result is a lower bound. `--charge all` charges every segment a hold
touches, ends included, which overcharges; the true optimum of the discretized problem lies
between the two. Of 4N deliveries the rest are preparations.

    /usr/bin/python3 -m bench.stagger_floor [--cache 0.1] [--lead 0.65] [--k 2] [--dependent]

k = 2 at a 10% cache (20 segments an epoch, 640,000 unknowns) takes about 5 minutes and 2 GB.
Before session 41 this counted a take as shared only within 2 segments of the one before and
ignored the cache's capacity, so a sample could never be kept longer; its 0.65-0.70 were not
lower bounds.
"""

import argparse
import sys
import time

try:
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, hstack, identity, vstack
except ImportError:
    sys.exit("bench.stagger_floor needs NumPy and SciPy: apt install python3-numpy python3-scipy "
             "(Debian's), then run it with /usr/bin/python3")


def least_preparations(segments, lead, cache, independent, charge_all=False):
    """The least preparations per delivery over the joint laws of (a1, a2, b1, b2) and holds."""
    s = segments
    grid = np.indices((s,) * 4).reshape(4, -1)  # A's epochs 1, 2, then B's, as segment numbers
    times = np.stack([grid[0], grid[1] + s, grid[2] + lead, grid[3] + lead + s])
    times.sort(axis=0)
    n, cols = grid.shape[1], np.arange(grid.shape[1])
    width = 4 * n  # unknowns: the law p, then the held mass y_j of each consecutive pair j
    eq, eq_rhs = [], []
    for k in range(4):  # each take uniform over its epoch
        eq.append(csr_matrix((np.ones(n), (grid[k], cols)), shape=(s, width)))
        eq_rhs += [1 / s] * s
    if independent:  # a job's second epoch independent of its first
        for p, q in ((0, 1), (2, 3)):
            eq.append(csr_matrix((np.ones(n), (grid[p] * s + grid[q], cols)),
                                 shape=(s * s, width)))
            eq_rhs += [1 / s / s] * (s * s)
    ident, zero = identity(n, format="csr"), csr_matrix((n, n))
    ub = [hstack([-ident] + [ident if i == j else zero for i in range(3)]) for j in range(3)]
    ub_rhs = [np.zeros(3 * n)]  # y_j <= p: only samples of that law can be held
    horizon = 2 * s + lead + 1
    rows, held = [], []
    for j in range(3):  # a hold fills the segments between its takes
        gap = times[j + 1] - times[j]
        spans = range(0, gap.max() + 1) if charge_all else range(1, gap.max())
        for d in spans:
            m = gap >= d if charge_all else gap > d
            rows.append(times[j][m] + d)
            held.append(cols[m] + (j + 1) * n)
    rows, held = np.concatenate(rows), np.concatenate(held)
    ub.append(csr_matrix((np.ones(len(rows)), (rows, held)), shape=(horizon, width)))
    ub_rhs.append(np.full(horizon, cache))  # at most C samples held at once
    objective = np.concatenate([np.zeros(n), -np.ones(3 * n)])
    best = linprog(objective, A_ub=vstack(ub).tocsr(), b_ub=np.concatenate(ub_rhs),
                   A_eq=vstack(eq).tocsr(), b_eq=eq_rhs, bounds=(0, None), method="highs-ipm")
    if best.status != 0:
        sys.exit(f"bench.stagger_floor: the LP did not solve: {best.message}")
    return (4 + best.fun) / 4


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=float, default=0.1, help="the cache, a fraction of N")
    ap.add_argument("--lead", type=float, default=0.65,
                    help="the second job's lag, a fraction of N (bench e2e's default: about 0.63)")
    ap.add_argument("--k", type=int, default=2, help="segments per cache's worth of samples")
    ap.add_argument("--dependent", action="store_true",
                    help="also solve without independence between a job's epochs")
    ap.add_argument("--charge", choices=("between", "all"), default="between",
                    help="between: the lower bound; all: the overcharged other side")
    a = ap.parse_args()
    segments = round(a.k / a.cache)
    lead = int(a.lead * segments + 0.5)  # to the nearest segment, halves up (round() goes to even)
    if not 0 < a.cache <= 0.5 or a.k < 1 or segments > 24 or not 0 <= lead <= segments:
        sys.exit("bench.stagger_floor: give --cache in (0, 0.5], --k >= 1 with k / cache <= 24 "
                 "segments an epoch (the LP has 4 x segments^4 unknowns), --lead in [0, 1]")
    print(f"cache {a.cache:g} N, lead {lead / segments:g} N, {segments} segments an epoch, holds "
          f"charged for {'every segment they touch' if a.charge == 'all' else 'whole segments between takes'}:")
    for independent in (True, False) if a.dependent else (True,):
        start = time.monotonic()
        least = least_preparations(segments, lead, a.cache, independent, a.charge == "all")
        what = "overcharged:" if a.charge == "all" else ">="
        print(f"  epochs independent: {str(independent):5}  {what} {least:.4f} preparations per "
              f"delivery ({time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
