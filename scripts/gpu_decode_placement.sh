#!/usr/bin/env bash
# Issue 23's measurements of where GPU decode runs (docs/benchmarks.md, "Issue 23, session 32").
# Run it ON the GPU machine, from the repository root, with the bundle (scripts/bundle.sh) at
# dist/carpool-bundle and a CUDA build's carpool_jpeg_decode_bench and libcarpool_decode_probe.so
# (CARPOOL_BUILD_BENCHMARKS, in build/server/) in BIN, with libturbojpeg.so.0 beside them where
# the GPU machine lacks it:
#   bash scripts/gpu_decode_placement.sh variants|placement|per-step
#     variants:  one trainer (bench.gpu.train_beside), and nvJPEG's settings and output formats
#                from another process beside it, one after another (about 100 s)
#     placement: one trainer; nvJPEG on a thread inside it, then the same rows from another
#                process (about 75 s)
#     per-step:  one trainer that decodes one batch in-process per training step (about 45 s)
# Each writes train.txt (the trainer's 1 s windows, Unix time) and, for the other process's rows,
# bench.txt to $OUT (default /tmp/carpool-gpu-out); a row's trainer rate is the mean of the
# windows inside its start and end. Environment: CARPOOL_BUNDLE (default dist/carpool-bundle), BIN
# (default build/server), PYTHON (default python3), OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

fail() {
  echo "gpu_decode_placement.sh: $*" >&2
  exit 2
}

what=${1:-}
bundle=${CARPOOL_BUNDLE:-dist/carpool-bundle}
bin=${BIN:-build/server}
out=${OUT:-/tmp/carpool-gpu-out}
py=${PYTHON:-python3}
case $what in
  variants | placement | per-step) ;;
  *) fail "give variants, placement or per-step (got '${what}')" ;;
esac
[[ -x $bundle/bin/carpool-env ]] || fail "no bundle at '$bundle': build it with scripts/bundle.sh"
[[ -x $bin/carpool_jpeg_decode_bench && -f $bin/libcarpool_decode_probe.so ]] ||
  fail "'$bin' lacks carpool_jpeg_decode_bench or libcarpool_decode_probe.so: build them in a" \
    "CUDA build with CARPOOL_BUILD_BENCHMARKS and point BIN at its server/ folder"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this is not a GPU machine"
eval "$("$bundle/bin/carpool-env")"
export PYTHONPATH="${PYTHONPATH:-}:$PWD" PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$bundle/lib:$bin:${LD_LIBRARY_PATH:-}"
mkdir -p "$out" || fail "cannot make '$out'"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
probe=$bin/libcarpool_decode_probe.so

case $what in
  variants)
    $py -m bench.gpu.train_beside --seconds 100 --window 1 >"$out/train.txt" 2>&1 &
    trainer=$!
    timeout 130 "$bin/carpool_jpeg_decode_bench" --images 1024 --batch 256 --seconds 6 --gap 3 \
      --variants hardware,hardware+pools+prealloc,hardware+nv12,hardware+yuv,hardware+pools+prealloc+nv12,gpu-hybrid,gpu-hybrid+pools \
      >"$out/bench.txt" 2>&1
    wait "$trainer"
    ;;
  placement)
    $py -m bench.gpu.train_beside --seconds 75 --window 1 --decode-in-process "$probe" \
      --decode-variants hardware,gpu-hybrid --decode-start 5 --decode-seconds 6 --decode-gap 3 \
      --decode-images 512 >"$out/train.txt" 2>&1 &
    trainer=$!
    # The other process's rows once both in-process rows are done.
    for _ in $(seq 120); do
      [[ $(grep -c '^in-process' "$out/train.txt") -ge 2 ]] && break
      sleep 0.5
    done
    timeout 60 "$bin/carpool_jpeg_decode_bench" --images 512 --batch 256 --seconds 6 --gap 3 \
      --variants hardware,gpu-hybrid >"$out/bench.txt" 2>&1
    wait "$trainer"
    ;;
  per-step)
    $py -m bench.gpu.train_beside --seconds 42 --window 1 --decode-per-step "$probe" \
      --decode-start 12 --decode-seconds 18 >"$out/train.txt" 2>&1
    ;;
esac
echo "gpu_decode_placement.sh: $what done; the windows and rows are in $out"
