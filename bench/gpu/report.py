"""The Markdown tables of a GPU benchmark report (also used to regenerate them from its JSON)."""

from bench import cache as bench_cache
from bench.common import PREPARE, fmt
from bench.gpu.jobs import rate_from_go, ratio


SIDE_NAMES = {"carpool": "carpool", "baseline": "DataLoader", "gpudecode": "GPU decode",
              "tensorsocket": "TensorSocket", "inproc": "decode in the job (Python probe)"}


def versus_best(rates, peers):
    """'carpool ÷ the best peer (its name)' of {side: img/s}."""
    best = max(((rates[x], x) for x in peers if rates.get(x) is not None), default=None)
    if not best or rates.get("carpool") is None:
        return "–"
    return f"{fmt(ratio(rates['carpool'], best[0]), '.2f')} ({SIDE_NAMES[best[1]]})"


# The scenario table: (header, value from (scenario row, carpool side, baseline side), format).
COLUMNS = [
    ("cache", lambda s, cp, bl: s["cache"]["label"], "s"),
    ("jobs", lambda s, cp, bl: s["jobs"], "d"),
    ("carpool img/s", lambda s, cp, bl: cp.get("images_per_s"), ".0f"),
    ("baseline img/s", lambda s, cp, bl: bl.get("images_per_s"), ".0f"),
    ("carpool ÷ baseline", lambda s, cp, bl: s.get("carpool_vs_baseline"), ".2f"),
    ("limit img/s", lambda s, cp, bl: s["limit_images_per_s"], ".0f"),
    ("carpool ÷ limit", lambda s, cp, bl: s.get("carpool_vs_limit"), ".2f"),
    ("GPU util % carpool", lambda s, cp, bl: cp.get("gpu_util_pct"), ".0f"),
    ("GPU util % baseline", lambda s, cp, bl: bl.get("gpu_util_pct"), ".0f"),
    ("server CPU ms/img", lambda s, cp, bl: cp.get("server_cpu_ms_per_image"), ".2f"),
    ("baseline workers CPU ms/img", lambda s, cp, bl: bl.get("workers_cpu_ms_per_image"), ".2f"),
    ("CPU/img baseline ÷ carpool", lambda s, cp, bl: s.get("cpu_per_image_baseline_vs_carpool"),
     ".1f"),
    ("server CPU % of cores", lambda s, cp, bl: cp.get("server_cores_pct"), ".0f"),
    ("prep ÷ deliv", lambda s, cp, bl: cp.get("prep_per_delivery"), ".3f"),
    ("H2D B/img", lambda s, cp, bl: cp.get("h2d_bytes_per_image"), ".0f"),
    ("decoder", lambda s, cp, bl: cp.get("decoder"), "s"),
    ("GPU decodes", lambda s, cp, bl: (cp.get("gpu") or {}).get("gpu_decodes"), "d"),
    ("decoded in the jobs", lambda s, cp, bl: (cp.get("gpu") or {}).get("job_decodes"), "d"),
    ("JPEG util % mean/max",
     lambda s, cp, bl: (lambda u: None if u.get("jpg_pct_mean") is None
                        else f"{u['jpg_pct_mean']:.0f}/{u['jpg_pct_max']}")(
                            cp.get("gpu_utilization") or {}), "s"),
    ("unique B/img", lambda s, cp, bl: cp.get("unique_bytes_per_image"), ".0f"),
]


def rows(r):
    """The scenario rows, each row at another cache with its scenario's other sides (measured
    once, in its first row) filled in."""
    out = {}
    for key, s in r["scenarios"].items():
        base = r["scenarios"].get(s.get("peers_from"), {})
        out[key] = dict({k: v for k, v in base.items() if k in SIDE_NAMES and k != "carpool"},
                        **s)
    return out


def markdown(r):
    c = r["config"]
    scenarios = rows(r)
    lines = [f"{c['count']} JPEGs 500x375, prepare {PREPARE}, {r.get('device')} (torch "
             f"{r.get('torch')}), {r['cores']} cores, {c['workers']} loader workers, batch "
             f"{c['batch_size']}, {c['epochs']} epoch(s) (at most {c['max_seconds']} s), model "
             f"{c['model']}, slow job: {c['slow_mode']}, run {r.get('run_s', 0):.0f} s" +
             (", every side under MPS" if c.get("mps") else "") +
             f", CUDA_DEVICE_MAX_CONNECTIONS={r.get('cuda_connections', 'unset')}",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items() if v),
             f"GPU training rate alone: {fmt(r.get('gpu_rate'))} img/s; server prepare rate: "
             f"{fmt(r.get('prepare_rate_images_per_s'))} img/s",
             "carpool server: " + (f"look-ahead {c['lookahead']}" if c["lookahead"] else
                                   "its own look-ahead") + "; "
             f"{bench_cache.describe_set(c['prepared_set'])}; rows at " + "; ".join(
                 x["description"] for x in c["caches"]) +
             " (the other sides have no such cache: measured once per scenario, repeated in its "
             "rows at other caches)", "",
             "| scenario | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for name, s in scenarios.items():
        cp, bl = s.get("carpool", {}), s.get("baseline", {})
        lines.append(f"| {name}: {s['what']} | " + " | ".join(
            fmt(get(s, cp, bl), f) for _, get, f in COLUMNS) + " |")
    sides = [x for x in SIDE_NAMES if any(x in s for s in scenarios.values())]
    names = [SIDE_NAMES[x] for x in sides]
    lines += ["", f"| scenario | job | dataset | start s {' / '.join(names)} | " +
              " | ".join(f"{n} img/s" for n in names) + " |", "|---" * (4 + len(sides)) + "|"]
    for name, s in scenarios.items():
        for j, key in enumerate(s["datasets"]):
            js = [(s.get(x, {}).get("jobs") or [{}] * s["jobs"])[j] for x in sides]
            lines.append(f"| {name} | {j} | {key} | "
                         f"{' / '.join(fmt(x.get('start_offset_s'), '.1f') for x in js)} | " +
                         " | ".join(fmt(x.get("images_per_s")) for x in js) + " |")
    peers = [x for x in sides if x != "carpool"]
    if set(peers) - {"baseline"}:  # issue 13: carpool against every peer of the run
        lines += ["", "| scenario | " + " | ".join(f"{n} img/s" for n in names) +
                  " | carpool ÷ best peer | GPU util % " + " / ".join(names) + " |",
                  "|---" * (len(sides) + 3) + "|"]
        for name, s in scenarios.items():
            rates = {x: s.get(x, {}).get("images_per_s") for x in sides}
            lines.append(f"| {name} | " + " | ".join(
                fmt(rates[x]) if "error" not in s.get(x, {}) else "failed" for x in sides) +
                f" | {versus_best(rates, peers)} | " +
                " / ".join(fmt(s.get(x, {}).get("gpu_util_pct")) for x in sides) + " |")
        lines += ["", "From the first go to the last end, first batches and start-up included:",
                  "", "| scenario | " + " | ".join(f"{n} img/s" for n in names) +
                  " | carpool ÷ best peer |", "|---" * (len(sides) + 2) + "|"]
        for name, s in scenarios.items():
            rates = {x: rate_from_go(s.get(x), c["batch_size"]) for x in sides}
            lines.append(f"| {name} | " + " | ".join(fmt(rates[x]) for x in sides) +
                         f" | {versus_best(rates, peers)} |")
    if "tensorsocket" in sides:
        lines += ["", "| scenario | producers | TensorSocket img/s per job | epochs (per job) | "
                  "order z vs listing | order ρ between jobs | same pixels across jobs | first "
                  "batch after s | producer CPU ms/img | notes |", "|---" * 10 + "|"]
        for name, s in scenarios.items():
            t = s.get("tensorsocket")
            if not t or s.get("peers_from"):
                continue
            if "jobs" not in t:
                lines.append(f"| {name} | {t.get('error')} |" + " |" * 8)
                continue
            js = t["jobs"]
            notes = t["notes"] + [f"producer {e}" for e in t["producer_errors"]]
            lines.append(
                f"| {name} | {t['producers']} | "
                f"{' / '.join(fmt(j['images_per_s']) for j in js)} | "
                f"{' / '.join(j['epoch_check'] for j in js)} | "
                f"{' / '.join(fmt(j['order_z'], '.1f') for j in js)} | "
                f"{fmt(t['order_rho_max'], '.2f')} | {'yes' if t['same_pixels'] else 'no'} | "
                f"{' / '.join(fmt(j.get('startup_s'), '.1f') for j in js)} | "
                f"{fmt(t['producer_cpu_ms_per_image'], '.2f')} | {'; '.join(notes)} |")
    lines += [f"- FAILED: {e}" for e in r["errors"]]
    return "\n".join(lines) + "\n"
