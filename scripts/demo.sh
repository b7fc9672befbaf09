#!/usr/bin/env bash
# The main demo: a hyperparameter sweep of PyTorch jobs sharing one carpool server with a cache that
# holds the whole prepared set, then one holding 10% of it, beside the same sweep with sharing off
# (--cache-size 0). Installs what is missing (scripts/setup.sh), builds
# what is needed (carpool, libcarpool.so), works in a temporary state dir and removes it.
#   scripts/demo.sh            BUILD_DIR (default build) picks the build folder.
# Takes a few minutes on 2 cores: 3 sweeps x 4 jobs of a small CNN, 1 epoch each.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
PY=/usr/bin/python3
# bench.sweep_demo and the carpool package of this tree (python -m bench.X, from the root).
export PYTHONPATH="$ROOT:$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}"
FMNIST=${CARPOOL_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}

say() { printf '\n== %s\n' "$*"; }

# 1. Packages: a cheap check first; setup.sh (apt) only when something is missing.
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null ||
   [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] ||
   ! "$PY" -c 'import numpy, torch' 2>/dev/null; then
  say "installing missing packages (scripts/setup.sh)"
  scripts/setup.sh
fi

# 2. Build (a no-op when up to date).
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  GEN=()
  if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
  say "configuring $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
say "building carpool and libcarpool.so in $BUILD_DIR"
cmake --build "$BUILD_DIR" -j2 --target carpool carpool_c | tail -n 1
export CARPOOL_BIN=$ROOT/$BUILD_DIR/tools/carpool
export CARPOOL_LIB=$ROOT/$BUILD_DIR/client/libcarpool.so
CARPOOL=$CARPOOL_BIN

# 3. A temporary state dir, removed on exit with whatever server is still running.
STATE=$(mktemp -d "${TMPDIR:-/tmp}/carpool-demo.XXXXXX")
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$STATE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "registering Fashion-MNIST and an overlapping half of it (state dir $STATE)"
"$CARPOOL" dataset add fmnist --idx "$FMNIST/train-images-idx3-ubyte.gz" \
  "$FMNIST/train-labels-idx1-ubyte.gz" --state-dir "$STATE" --quiet
"$CARPOOL" dataset add fmnist-half --from fmnist --fraction 0.5 --seed 1 --state-dir "$STATE" --quiet
"$CARPOOL" dataset ls --state-dir "$STATE"
"$CARPOOL" dataset overlap fmnist fmnist-half --state-dir "$STATE"

start_server() {  # start_server LOG FLAGS...: waits until the socket answers
  local log=$1
  shift
  "$CARPOOL" server --state-dir "$STATE" --workers 2 "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 300); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "demo: carpool server exited:" >&2
      cat "$log" >&2
      exit 1
    fi
    if "$PY" -c 'import sys, carpool
carpool.server_stats(socket=sys.argv[1])' "$STATE/carpool.sock" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "demo: carpool server did not answer within 30 s; its log:" >&2
  cat "$log" >&2
  exit 1
}

stop_server() {
  kill "$SERVER_PID"
  wait "$SERVER_PID" || true
  SERVER_PID=
}

run_sweep() {  # run_sweep LABEL OUT SERVER-FLAGS...
  local label=$1 out=$2
  shift 2
  say "sweep with $label: carpool server $*"
  start_server "$STATE/server-$out.log" "$@"
  "$PY" -m bench.sweep_demo sweep --socket "$STATE/carpool.sock" --label "$label" \
    --out "$STATE/$out.json"
  stop_server
}

# The prepared set is Fashion-MNIST's 60,000 samples of 784 bytes (47.0 MB): 256 MiB holds all of
# it (5.7x); 4,704,000 bytes is 10% of it, where the data outgrows the cache as at ImageNet scale.
run_sweep "cache 570%" on --cache-size 256MiB
run_sweep "cache 10%" small --cache-size 4704000
run_sweep "sharing off" off --cache-size 0

say "the three sweeps side by side (same jobs, same seeds; cache as a share of the prepared set)"
"$PY" -m bench.sweep_demo compare "$STATE/on.json" "$STATE/small.json" "$STATE/off.json"
echo
echo "A Fashion-MNIST preparation is a 784-byte copy, so here wall time is the CNN's training and"
echo "varies with machine load; what sharing saves is the preparations (decode-bound speed-ups:"
echo "'carpool bench e2e', docs/benchmarks.md). At 10% the jobs train at their own speeds and d"
echo "starts late: with preparation this cheap the server lets the faster jobs run ahead rather than"
echo "hold them (docs/scheduler.md, \"Pacing\"), and prepares again what the cache let go."
