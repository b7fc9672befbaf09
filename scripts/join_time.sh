#!/usr/bin/env bash
# How long a job takes to join a 1,281,167-sample dataset (ImageNet's size, as 1x1 IDX images):
# registers it in a temporary state dir, starts a server, runs three jobs on it one after the
# other, and prints each join's line from the server log (total, records' load, engine lock).
# Usage: scripts/join_time.sh [CARPOOL_BINARY]   (default build/tools/carpool)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/tools/carpool}
D=$(mktemp -d /tmp/carpool-join-XXXXXX)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
/usr/bin/python3 - "$D" <<'PY'
import struct, sys
d, n = sys.argv[1], 1281167
open(f"{d}/big-images", "wb").write(struct.pack(">IIII", 0x803, n, 1, 1) + bytes(i % 10 for i in range(n)))
open(f"{d}/big-labels", "wb").write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
PY
"$BIN" dataset add big --idx "$D/big-images" "$D/big-labels" --state-dir "$D/state" -q
"$BIN" server --state-dir "$D/state" > "$D/server.out" 2> "$D/server.err" &
SERVER=$!
for _ in $(seq 100); do [ -S "$D/state/carpool.sock" ] && break; sleep 0.1; done
for _ in 1 2 3; do
  "$BIN" consume --dataset big --batch-size 1024 --state-dir "$D/state" > /dev/null
done
grep -o 'job [0-9]*: dataset "big".*joined in.*' "$D/server.err" | sed 's/: dataset.*joined/ joined/'
