"""How few preparations per delivery any sampler could reach in bench e2e's stagger scenario at a
small cache (docs/benchmarks.md, issue 20, "stagger"): a linear-programming bound, not a proof
about carpool's sampler.

Two jobs on one dataset of N samples, two epochs each, the second `--lead` x N samples behind the
first, both at one speed. Time runs in segments of C / k samples (C = the cache, `--cache`
x N), so each epoch is S = k / cache segments. A sample has four take times, one per job and
epoch; between consecutive takes (in time order) it is shared, not prepared again, when they are
at most `w` segments apart. w = 1 counts only takes in adjacent segments (always within C of each
other, so the cache could have held the sample); w = 2 counts every pair that could be within C
(an upper bound on sharing). The LP chooses the joint law of the four segments with each take
uniform over its epoch's segments (a uniform permutation), and with `--independent` each job's
second epoch independent of its first. Of 4N deliveries the rest are preparations.

    /usr/bin/python3 -m bench.stagger_floor [--cache 0.1] [--lead 0.5] [--k 2]
"""

import argparse
import sys

try:
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack
except ImportError:
    sys.exit("bench.stagger_floor needs NumPy and SciPy: apt install python3-numpy python3-scipy "
             "(Debian's), then run it with /usr/bin/python3")


def least_preparations(segments, lead, w, independent):
    """The least preparations per delivery over the joint laws of (a1, a2, b1, b2)."""
    s = segments
    grid = np.indices((s,) * 4).reshape(4, -1)  # A's epochs 1, 2, then B's, as segment numbers
    times = np.stack([grid[0], grid[1] + s, grid[2] + lead, grid[3] + lead + s])
    times.sort(axis=0)
    shared = (np.diff(times, axis=0) <= w).sum(axis=0).astype(float)
    n, cols = grid.shape[1], np.arange(grid.shape[1])
    rows, rhs = [], []
    for k in range(4):  # each take uniform over its epoch
        rows.append(csr_matrix((np.ones(n), (grid[k], cols)), shape=(s, n)))
        rhs += [1 / s] * s
    if independent:  # a job's second epoch independent of its first
        for p, q in ((0, 1), (2, 3)):
            rows.append(csr_matrix((np.ones(n), (grid[p] * s + grid[q], cols)), shape=(s * s, n)))
            rhs += [1 / s / s] * (s * s)
    best = linprog(-shared, A_eq=vstack(rows).tocsr(), b_eq=rhs, bounds=(0, None), method="highs")
    if best.status != 0:
        sys.exit(f"bench.stagger_floor: the LP did not solve: {best.message}")
    return (4 + best.fun) / 4


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=float, default=0.1, help="the cache, a fraction of N")
    ap.add_argument("--lead", type=float, default=0.5, help="the second job's lag, a fraction of N")
    ap.add_argument("--k", type=int, default=2, help="segments per cache's worth of samples")
    a = ap.parse_args()
    segments = round(a.k / a.cache)
    lead = round(a.lead * segments)
    if not 0 < a.cache <= 0.5 or a.k < 1 or segments > 24 or not 0 <= lead <= segments:
        sys.exit("bench.stagger_floor: give --cache in (0, 0.5], --k >= 1 with k / cache <= 24 "
                 "segments an epoch (the LP has segments^4 unknowns), --lead in [0, 1]")
    print(f"cache {a.cache:g} N, lead {lead / segments:g} N, {segments} segments an epoch:")
    for independent in (True, False):
        for w in (1, 2):
            what = "adjacent segments" if w == 1 else "within 2 segments (upper bound)"
            print(f"  epochs independent: {str(independent):5}  shared when {what:33} "
                  f">= {least_preparations(segments, lead, w, independent):.4f} preparations per "
                  "delivery", flush=True)


if __name__ == "__main__":
    main()
