"""The carpool server's cache in the benchmarks, as a fraction of the prepared set.

`--cache-fraction F` gives the cache room for F of the prepared set's samples, each taking 5/4
of its prepared bytes in a cache slot (slot header and size-class rounding), the same figure as
`carpool bench e2e` and `bench load` (tools/cache_fraction.h). `--cache-size` gives the bytes
instead, and the reports state it as a fraction all the same. Imported by bench.gpu,
bench.peers and the sweeps of examples/; it imports none of them."""

import argparse
import math
import re

MAX_FRACTION = 4.0  # a larger cache only repeats the full-cache case at a higher memory cost
SLOT_OVERHEAD = 1.25
# Without --cache-fraction or --cache-size: the cache that holds every sample, and one that holds
# a tenth of them, where evictions limit sharing.
DEFAULT_FRACTIONS = (1.0, 0.1)

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "KB": 10**3, "M": 1 << 20,
          "MiB": 1 << 20, "MB": 10**6, "G": 1 << 30, "GiB": 1 << 30, "GB": 10**9,
          "T": 1 << 40, "TiB": 1 << 40, "TB": 10**12}


def parse_fraction(text):
    """argparse type of --cache-fraction: a float in (0, MAX_FRACTION]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_FRACTION):  # also rejects nan
        what = "not a number in" if not math.isfinite(value) else "outside"
        raise argparse.ArgumentTypeError(
            f'"{text}" is {what} (0, {MAX_FRACTION:g}]; give the cache as a fraction of the '
            "prepared set, e.g. 0.1 for room for a tenth of its samples or 1 for all of them")
    return value


def parse_bytes(prog, flag, text):
    """Bytes of "512MiB", "8GiB", "1.5GB", "0": the units of `carpool server --cache-size`."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    try:
        value = float(m.group(1)) * _UNITS[m.group(2)] if m else None
    except (KeyError, ValueError):
        value = None
    if value is None or value > 1e15:
        raise SystemExit(f'{prog}: {flag} "{text}" is not a byte count; expected e.g. 0, '
                         "512MiB, 8GiB or 1.5GB")
    return int(value)


def fmt_bytes(n):
    """49152000 -> "49.2 MB" (decimal units)."""
    for unit, scale, spec in (("GB", 1e9, ".2f"), ("MB", 1e6, ".1f"), ("kB", 1e3, ".1f")):
        if n >= scale:
            return f"{n / scale:{spec}} {unit}"
    return f"{n} B"


def label(fraction):
    """0.1 -> "10%", 0.125 -> "12.5%", 9.13 -> "913%"."""
    p = fraction * 100
    if p >= 100:
        return f"{p:.0f}%"
    text = f"{p:.1f}" if p >= 1 else f"{p:.2f}"
    return text.rstrip("0").rstrip(".") + "%"


def prepared_set(samples, sample_bytes):
    """The prepared set: every sample a run's jobs may read, as the server prepares them."""
    raw = samples * sample_bytes
    return {"samples": samples, "sample_bytes": sample_bytes, "bytes": raw,
            "cache_bytes": int(raw * SLOT_OVERHEAD)}


def describe_set(s):
    return (f"the prepared set: {s['samples']} samples x {s['sample_bytes']} B = "
            f"{fmt_bytes(s['bytes'])} ({fmt_bytes(s['cache_bytes'])} in cache slots)")


def choose(prog, pset, fractions, cache_size, gpu_cache_size=None, gpu=False):
    """The caches of a run, one per row: [{"fraction", "label", "cache_size" (the server flag),
    "bytes", "given_as", "description"[, "gpu_cache_size", "gpu_bytes", "gpu_fraction"]}].
    --cache-fraction (a list) or --cache-size (one), else DEFAULT_FRACTIONS; both: exit with a
    message. With `gpu`, the GPU's device-resident area is the same fraction of the set, unless
    --gpu-cache-size gives its bytes."""
    if fractions and cache_size is not None:
        raise SystemExit(f"{prog}: --cache-fraction {' '.join(map(str, fractions))} and "
                         f"--cache-size {cache_size} both set the server's cache; give one of them")
    full = pset["cache_bytes"]
    rows = []
    if cache_size is not None:
        n = parse_bytes(prog, "--cache-size", cache_size)
        rows.append({"fraction": n / full if full else 0.0, "cache_size": str(cache_size),
                     "bytes": n, "given_as": "cache-size"})
    else:
        for f in fractions or DEFAULT_FRACTIONS:
            n = math.ceil(f * full)
            rows.append({"fraction": f, "cache_size": str(n), "bytes": n,
                         "given_as": "cache-fraction"})
    for c in rows:
        c["label"] = label(c["fraction"])
        given = f"--cache-size {c['cache_size']} = " if c["given_as"] == "cache-size" else ""
        c["description"] = (f"cache {c['label']} of the prepared set ({given}"
                            f"{fmt_bytes(c['bytes'])})")
        if gpu:
            g = (parse_bytes(prog, "--gpu-cache-size", gpu_cache_size) if gpu_cache_size is not None
                 else math.ceil(c["fraction"] * full))
            c.update(gpu_cache_size=str(gpu_cache_size if gpu_cache_size is not None else g),
                     gpu_bytes=g, gpu_fraction=g / full if full else 0.0)
            c["description"] += (f", GPU area {label(c['gpu_fraction'])} "
                                 f"({fmt_bytes(g)})")
    return rows


def add_arguments(ap, cache_size_help):
    """--cache-fraction and --cache-size on an argparse parser."""
    ap.add_argument("--cache-fraction", type=parse_fraction, nargs="+", metavar="F",
                    help=f"server cache as a fraction F of the prepared set, 0 < F <= "
                         f"{MAX_FRACTION:g}: room for F of its samples at 5/4 of a prepared "
                         "sample's bytes each; several: one row per fraction (default: "
                         f"{' '.join(map(str, DEFAULT_FRACTIONS))}, the full cache and a tenth)")
    ap.add_argument("--cache-size", help=cache_size_help)
