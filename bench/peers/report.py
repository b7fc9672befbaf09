"""The Markdown tables of a peers benchmark report."""

from bench import cache as bench_cache
from bench.common import fmt


def rows(r):
    """The scenario rows, each row at another cache with its scenario's other configurations
    (measured once, in its first row) filled in."""
    out = {}
    for key, s in r["scenarios"].items():
        base = r["scenarios"].get(s.get("peers_from"), {}).get("results", {})
        results = {k: v for k, v in base.items() if k != "carpool"}
        results.update(s["results"])
        out[key] = dict(s, results=results)
    return out


def markdown(r):
    c = r["config"]
    v = ", ".join(f"{k} {x}" for k, x in r["versions"].items() if x)
    lines = [f"{c['count']} JPEGs 500x375, {r['cores']} cores, {c['workers']} workers per "
             f"configuration, step {c['step_ms']} ms per 64 samples (speeds: "
             f"{c['speeds_step_ms']} and {2 * c['speeds_step_ms']} ms), {c['epochs']} epoch(s), "
             f"at most {c['max_seconds']} s each, run {r.get('run_s', 0):.0f} s", f"Versions: {v}",
             f"carpool server: {bench_cache.describe_set(c['prepared_set'])}; rows at " +
             "; ".join(x["description"] for x in c["caches"]) + " (the other configurations "
             "have no such cache: measured once per scenario, repeated in its rows at other "
             "caches)", ""]
    lines += summary_table(r) + [""] + detail_table(r)
    for config, why in r["skipped"].items():
        lines.append(f"- {config} skipped: {why}")
    return "\n".join(lines) + "\n"


def best_peer(results):
    peers = [(x["samples_per_s"], k) for k, x in results.items()
             if k != "carpool" and "samples_per_s" in x]
    return max(peers) if peers else (None, None)


def summary_table(r):
    configs = r["config"]["configs"]
    lines = ["| scenario | cache | " + " | ".join(f"{c} samples/s" for c in configs) +
             " | carpool ÷ best peer | steps' ceiling | carpool prep ÷ deliv | lower bound |",
             "|---" * (len(configs) + 6) + "|"]
    for name, s in rows(r).items():
        res = s["results"]
        cells = [fmt(res.get(c, {}).get("samples_per_s")) if "error" not in res.get(c, {})
                 else "failed" for c in configs]
        best, who = best_peer(res)
        cp = res.get("carpool", {})
        ratio = (f"{cp['samples_per_s'] / best:.2f} ({who})" if best and "samples_per_s" in cp
                 else "–")
        lines.append(f"| {name}: {s['what']} | {s['cache']['label']} | " + " | ".join(cells) +
                     f" | {ratio} | "
                     f"{fmt(s.get('ceiling'))} | {fmt(cp.get('prep_per_delivery'), '.3f')} | "
                     f"{fmt(cp.get('lower_bound'), '.3f')} |")
    return lines


def share(rate, asked):
    """A job's rate over what its steps ask for (1.00 = it never waited on its loader)."""
    return "–" if rate is None or not asked else f"{rate / asked:.2f}"


def detail_table(r):
    lines = ["| scenario | config | per-job samples/s | ÷ asked | CPU ms/sample | "
             "epochs (per job) | order z vs listing | shard mix | order ρ between jobs | "
             "same pixels across jobs | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in r["scenarios"].items():  # each measurement once: no repeated peers
        for config, x in s["results"].items():
            if "jobs" not in x:
                lines.append(f"| {name} | {config} | {x.get('error') or x.get('skipped')} "
                             "| | | | | | | | |")
                continue
            jobs, asked = x["jobs"], s.get("asked") or [None] * len(x["jobs"])
            label = f"{config} ({s['cache']['label']} cache)" if config == "carpool" else config
            lines.append(
                f"| {name} | {label} | {' / '.join(fmt(j['samples_per_s']) for j in jobs)} | "
                f"{' / '.join(share(j['samples_per_s'], a) for j, a in zip(jobs, asked))} | "
                f"{fmt(x['cpu_ms_per_sample'], '.1f')} | "
                f"{' / '.join(j['epochs'] for j in jobs)} | "
                f"{' / '.join(fmt(j['order_z'], '.1f') for j in jobs)} | "
                f"{' / '.join(fmt(j.get('shard_mix'), '.2f') for j in jobs)} | "
                f"{fmt(x['order_rho_max'], '.2f')} | {'yes' if x['same_pixels'] else 'no'} | "
                f"{'; '.join(x['notes'])} |")
    return lines
