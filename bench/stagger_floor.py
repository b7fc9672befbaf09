"""The least preparations per delivery any sampler can reach in bench e2e's stagger scenario when
the cache is smaller than the lead (docs/benchmarks.md, issue 20, "stagger").

Two jobs on one dataset of N samples, two epochs each, the second N/2 samples behind the first at
one speed. A sample is shared only when both take it in the same stretch of N/2 rounds. Per
sample, t: in the leader's epoch-1 second half; x: in the follower's epoch-1 first half; u: in the
leader's epoch-2 first half; v: in the follower's epoch-2 first half (each 1/2 by uniformity).
Shared deliveries per sample are at most E[x t] + E[u (1 - x)] + E[v (1 - u)]; a linear program
over the joint law of (t, x, u, v) gives the most, with and without each job's epochs independent
of its own earlier ones. Of 4N deliveries the rest are preparations.

    /usr/bin/python3 -m bench.stagger_floor
"""

import itertools
import sys

try:
    from scipy.optimize import linprog
except ImportError:
    sys.exit("bench.stagger_floor needs SciPy: apt install python3-scipy (Debian's), then run it "
             "with /usr/bin/python3")


def most_shared(independent):
    laws = list(itertools.product([0, 1], repeat=4))  # (t, x, u, v)
    gain = [-(t * x + u * (1 - x) + v * (1 - u)) for t, x, u, v in laws]
    rows, rhs = [[1] * len(laws)], [1]
    for k in range(4):  # each indicator 1/2
        rows.append([law[k] for law in laws])
        rhs.append(0.5)
    if independent:  # u independent of t, v of x: P(both) = 1/4
        rows.append([law[0] * law[2] for law in laws])
        rhs.append(0.25)
        rows.append([law[1] * law[3] for law in laws])
        rhs.append(0.25)
    best = linprog(gain, A_eq=rows, b_eq=rhs, bounds=[(0, 1)] * len(laws))
    return -best.fun


def main():
    for independent in (True, False):
        shared = most_shared(independent)
        print(f"epochs independent of the job's earlier ones: {independent}: at most {shared:.4f}N "
              f"shared deliveries, so at least {(4 - shared) / 4:.4f} preparations per delivery")


if __name__ == "__main__":
    main()
