#!/usr/bin/env bash
# Issue 9's standing GPU harness. Run it ON the GPU machine, from the repository root, with the
# relocatable bundle (scripts/bundle.sh) at dist/carpool-bundle:
#   bash scripts/gpu_bench.sh [bench.gpu's options, e.g. --count 20000 --scenarios n1 n4]
# It puts the bundle first (its bin/carpool-env: bin/ on PATH, python/ on PYTHONPATH, CARPOOL_BIN,
# CARPOOL_LIB), prints the GPUs, checks the bundle with a GPU job (its bundle_smoke.sh --gpu), runs
# its GPU unit tests when it has them (bin/carpool_gpu_test), then `python -m bench.gpu` (the
# repository's bench/ package, this checkout's root on PYTHONPATH after the bundle's python/). All it
# writes goes to $OUT (default /tmp/carpool-gpu-out), 7 files at most:
#   nvidia-smi.txt bundle_smoke.log gpu_test.log bench_gpu.log bench_gpu.json bench_gpu.md
#   server-logs.tgz
# Environment: CARPOOL_BUNDLE (default dist/carpool-bundle), PYTHON (default python3), OUT.
# Exits 2 at once when the bundle or the GPU is missing, 1 when the bundle's GPU job fails (the
# bench would fail too); else non-zero if a unit test or the bench failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

fail() {
  echo "gpu_bench.sh: $*" >&2
  exit 2
}

bundle=${CARPOOL_BUNDLE:-dist/carpool-bundle}
out=${OUT:-/tmp/carpool-gpu-out}
py=${PYTHON:-python3}
[[ -x $bundle/bin/carpool ]] ||
  fail "no carpool bundle: '$bundle/bin/carpool' is missing; build it with scripts/bundle.sh on" \
    "the build machine and bring dist/carpool-bundle along, or point CARPOOL_BUNDLE at it"
[[ -d $bundle/python/carpool ]] || fail "'$bundle/python/carpool' is missing: an incomplete bundle?"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this is not a GPU machine"
command -v "$py" >/dev/null || fail "'$py' not found; set PYTHON to the interpreter with torch"

bundle=$(cd "$bundle" && pwd)
if [[ -x $bundle/bin/carpool-env ]]; then
  eval "$("$bundle/bin/carpool-env")" || fail "'$bundle/bin/carpool-env' failed"
else  # the same exports, for a bundle without carpool-env
  export PATH="$bundle/bin:$PATH" PYTHONPATH="$bundle/python${PYTHONPATH:+:$PYTHONPATH}"
  export CARPOOL_BIN=$bundle/bin/carpool CARPOOL_LIB=$bundle/lib/libcarpool.so
fi
export PYTHON=$py PYTHONUNBUFFERED=1
# bench/ from this checkout; carpool itself stays the bundle's (first on PYTHONPATH)
export PYTHONPATH="$PYTHONPATH:$PWD"
[[ -f bench/gpu/__main__.py ]] || fail "no bench/gpu in $PWD: run this from the repository root"
mkdir -p "$out" || fail "cannot create OUT folder '$out'"

nvidia-smi -L | tee "$out/nvidia-smi.txt"
df -h /dev/shm | tee -a "$out/nvidia-smi.txt"  # the server's cache segment lives there
"$py" -c 'import carpool, torch, torchvision
print(f"carpool {carpool.__version__} ({carpool.library_path()}), binary {carpool.binary()}")
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"CUDA available: {torch.cuda.is_available()}")' 2>&1 | tee -a "$out/nvidia-smi.txt" ||
  fail "'$py' cannot import carpool (from $bundle/python), torch and torchvision"

if [[ -x $bundle/bundle_smoke.sh ]]; then
  "$bundle/bundle_smoke.sh" --gpu 2>&1 | tee "$out/bundle_smoke.log"
  ((PIPESTATUS[0] == 0)) || {
    echo "gpu_bench.sh: the bundle's GPU job failed (bundle_smoke.log); not running the bench" >&2
    exit 1
  }
else
  echo "no bundle_smoke.sh in the bundle: its GPU check skipped" | tee "$out/bundle_smoke.log"
fi

status=0
if [[ -x $bundle/bin/carpool_gpu_test ]]; then
  "$bundle/bin/carpool_gpu_test" 2>&1 | tee "$out/gpu_test.log"
  test_rc=${PIPESTATUS[0]}
  echo "carpool_gpu_test: exit $test_rc"
  ((test_rc == 0)) || status=1
else
  echo "no bin/carpool_gpu_test in the bundle: GPU tests skipped" | tee "$out/gpu_test.log"
fi

logs=$(mktemp -d /tmp/carpool-gpu-logs.XXXXXX)
"$py" -m bench.gpu --json-out "$out/bench_gpu.json" --md-out "$out/bench_gpu.md" \
  --log-dir "$logs" "$@" 2>&1 | tee "$out/bench_gpu.log"
bench_rc=${PIPESTATUS[0]}
tar czf "$out/server-logs.tgz" -C "$logs" . && rm -rf "$logs"
echo "bench.gpu: exit $bench_rc; outputs in $out"
((bench_rc == 0)) || status=1
exit $status
