"""Parses a /metrics scrape with the Prometheus client's own parser (Debian's
python3-prometheus-client) and prints what it understood, for e2e_metrics_test.cc:
one "TYPE <family> <type>" line per family, then "<sample>{<k>=<v>,...} <value>" per sample.
Exit 77 when the module is missing (the test skips), 1 when the text does not parse."""
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"python3-prometheus-client is not installed ({e}); "
          "install it with scripts/setup.sh", file=sys.stderr)
    sys.exit(77)

with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
try:
    for family in text_string_to_metric_families(text):
        print(f"TYPE {family.name} {family.type}")
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            value = int(s.value) if s.value == int(s.value) else s.value
            print(f"{s.name}{{{labels}}} {value}")
except Exception as e:  # the parser raises ValueError and others on malformed text
    print(f"metrics text does not parse: {e!r}", file=sys.stderr)
    sys.exit(1)
