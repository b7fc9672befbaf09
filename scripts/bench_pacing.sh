#!/usr/bin/env bash
# Issue 20's by-hand experiment, repeatable: one `carpool server` with a small cache and N
# `carpool consume` jobs started together on the same dataset, polled with `carpool status`
# while they run. Prints the pacing's state every 2 s and a final line with preparations per
# delivery and the wall time, so --pacing on and off (or two look-aheads) compare in one go:
#
#   scripts/bench_pacing.sh --state-dir DIR --dataset NAME [--cache-size 39321600] [--jobs 4]
#       [--epochs 2] [--batch-size 32] [--step-ms 20] [--workers 2] [--carpool BIN]
#       [-- extra server flags, e.g. --pacing off or --lookahead 1024]
#
# DIR is a catalog with NAME registered (`carpool bench e2e` leaves one in
# <--dir>/state-<images>, dataset "e2e"). Exits non-zero if a job fails.
set -euo pipefail
state="" dataset="" cache=39321600 jobs=4 epochs=2 batch=32 step=20 workers=2
bin=${CARPOOL_BIN:-$(dirname "$0")/../build/tools/carpool}
py=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --state-dir) state=$2; shift 2 ;;
    --dataset) dataset=$2; shift 2 ;;
    --cache-size) cache=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --step-ms) step=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --carpool) bin=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_pacing.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$state" ] && [ -n "$dataset" ] ||
  { echo "bench_pacing.sh: give --state-dir and --dataset (see --help)" >&2; exit 2; }
[ -x "$bin" ] || { echo "bench_pacing.sh: no carpool binary at '$bin'; build it or pass --carpool" >&2; exit 2; }

tmp=$(mktemp -d)
sock=$tmp/s.sock
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$bin" server --state-dir "$state" --socket "$sock" --workers "$workers" --cache-size "$cache" \
  "$@" >"$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$tmp/server.log" >&2; exit 1; }

summary() {  # the status JSON on stdin; $1: a label
  "$py" -c '
import json, sys
d = json.load(sys.stdin)
c, p = d["cache"], d["pacing"]
prep, deliv = d["preparations"], d["deliveries"]
print(sys.argv[1], "preparations %d deliveries %d per-delivery %.3f" % (prep, deliv, prep / max(1, deliv)),
      "evictions %d L %d window %d owed %d holds %d lifts %d" % (
          c["evictions"], d["lookahead"], p["window"], p["owed"], p["holds"], p["lifts"]),
      "held_s", [round(j["held_s"], 1) for j in d["jobs"]])' "$1"
}

start=$(date +%s.%N)
pids=()
for i in $(seq "$jobs"); do
  "$bin" consume --socket "$sock" --state-dir "$state" --dataset "$dataset" --batch-size "$batch" \
    --epochs "$epochs" --prefetch 4 --step-ms "$step" --seed "$i" --json >"$tmp/job$i.json" 2>&1 &
  pids+=($!)
done
alive() {
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
while alive; do
  sleep 2
  "$bin" status --socket "$sock" --json 2>/dev/null | summary "  running:" || true
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { failed=1; echo "job $((i + 1)) failed: $(cat "$tmp/job$((i + 1)).json")" >&2; }
done
wall=$("$py" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$start" "$(date +%s.%N)")
"$bin" status --socket "$sock" --json | summary "final (server flags: ${*:-none}, wall ${wall} s):"
exit "$failed"
