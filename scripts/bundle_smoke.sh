#!/usr/bin/env bash
# Checks a portable bundle (scripts/bundle.sh) on the machine it runs on, which needs none of
# carpool's dependencies installed:
#  1. copies it to a fresh folder, so that nothing depends on where it was built or unpacked;
#  2. ldd: every library of bin/carpool and lib/libcarpool.so that is not the machine's own
#     (glibc's, libstdc++, libgcc_s, the NVIDIA driver's) resolves inside that copy;
#  3. `carpool --help` and `carpool-env` with an empty environment (env -i PATH=/usr/bin:/bin);
#  4. end to end: `dataset gen` (50 JPEGs), `dataset add --prepare resize=256,crop=256`, a
#     server in the background, one `carpool consume`, and the Python loader (numpy, and torch
#     when importable) with PYTHONPATH=<copy>/python;
#  5. with --gpu: the same job and loader on device cuda:0 (needs a GPU and a CUDA bundle).
#
#   scripts/bundle_smoke.sh [BUNDLE] [--gpu]   (default: dist/carpool-bundle)
#   carpool-bundle/bundle_smoke.sh [--gpu]     (the copy in a bundle checks that bundle)
# Python: $PYTHON, else the first of /usr/bin/python3 and python3 that imports numpy.
# Exits non-zero at the first failed check, naming it.
set -euo pipefail

# The bundle holds a copy of this script: there it checks its own folder.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUNDLE="$HERE/../dist/carpool-bundle"
[ -x "$HERE/bin/carpool" ] && BUNDLE=$HERE
GPU=0
for arg in "$@"; do
  case "$arg" in
    --gpu) GPU=1 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) BUNDLE=$arg ;;
  esac
done
[ -x "$BUNDLE/bin/carpool" ] || { echo "smoke: no bin/carpool in '$BUNDLE'; run scripts/bundle.sh" >&2; exit 1; }

WORK=$(mktemp -d /tmp/carpool-smoke.XXXXXX)
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "smoke: FAILED: $*" >&2; exit 1; }

X=$(realpath -m "$WORK/bundle")
cp -a "$BUNDLE" "$X"
CLEAN=(env -i PATH=/usr/bin:/bin HOME="$WORK")
echo "smoke: bundle copied to $X ($(du -sh "$X" | cut -f1)); $(uname -m), $(ldd --version | head -1)"

# 2. Where each library comes from.
SYSTEM='^(linux-vdso\.so|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libBrokenLocale\.so|libnss_|libthread_db\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia)'
for entry in "$X/bin/carpool" "$X/lib/libcarpool.so"; do
  inside=0 system=()
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [ "$path" = "not" ] && fail "ldd $(basename "$entry"): $name not found"
    path=$(realpath -m "$path")
    if [[ "$name" =~ $SYSTEM ]]; then
      system+=("$name")
    elif [[ "$path" == "$X/lib/"* ]]; then
      inside=$((inside + 1))
    else
      fail "ldd $(basename "$entry"): $name resolves to $path, outside the bundle"
    fi
  done < <("${CLEAN[@]}" ldd "$entry")
  echo "smoke: ldd $(basename "$entry"): $inside libraries from the bundle's lib/, system: ${system[*]:-none}"
done

# 3. An empty environment.
"${CLEAN[@]}" "$X/bin/carpool" --help >"$WORK/help.txt" || fail "carpool --help"
grep -q "dataset" "$WORK/help.txt" || fail "carpool --help does not list the dataset command"
( eval "$("${CLEAN[@]}" "$X/bin/carpool-env")" && [ "$CARPOOL_LIB" = "$X/lib/libcarpool.so" ] &&
  [ "$(command -v carpool)" = "$X/bin/carpool" ] ) || fail "carpool-env exports"
echo "smoke: carpool --help and carpool-env ran with env -i"

# 4. End to end.
STATE="$WORK/state"
run() { "${CLEAN[@]}" "$X/bin/carpool" "$@"; }
run dataset gen "$WORK/data" --count 50 --classes 5 --size 320x240 --seed 7 --quiet
run dataset add smoke --dir "$WORK/data" --prepare resize=256,crop=256 --state-dir "$STATE"
"${CLEAN[@]}" "$X/bin/carpool" server --state-dir "$STATE" --cache-size 256MiB \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  [ -S "$STATE/carpool.sock" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; fail "the server exited"; }
  sleep 0.1
done
[ -S "$STATE/carpool.sock" ] || fail "no server socket after 10 s"
consume=$(run consume --dataset smoke --batch-size 16 --epochs 2 --transform 'random_crop(224)|flip' \
  --state-dir "$STATE" --json) || fail "carpool consume"
echo "smoke: carpool consume: $consume"
echo "$consume" | grep -Eq '"samples": ?100\b' || fail "consume delivered other than 2 x 50 samples"
echo "$consume" | grep -Eq '"skipped": ?0\b' || fail "consume skipped samples"

PY=${PYTHON:-}
# An interpreter named without a path must resolve here: the checks below run with PATH=/usr/bin.
if [ -n "$PY" ]; then PY=$(command -v "$PY") || fail "PYTHON='$PYTHON' is not found"; fi
if [ -z "$PY" ]; then
  # Checked in the same clean environment the loader check runs in (an inherited PYTHONPATH
  # must not make a Python look as if it had numpy).
  for candidate in python3 /usr/bin/python3; do
    path=$(command -v "$candidate" || true)
    if [ -n "$path" ] && "${CLEAN[@]}" "$path" -c 'import numpy' 2>/dev/null; then
      PY=$path
      break
    fi
  done
fi
[ -n "$PY" ] || fail "no Python with numpy (set PYTHON=...)"
loader_check() {  # DEVICE
  "${CLEAN[@]}" PYTHONPATH="$X/python" PYTHONDONTWRITEBYTECODE=1 "$PY" - "$STATE" "$X" "$1" <<'EOF'
import sys
import carpool
state, bundle, device = sys.argv[1], sys.argv[2], sys.argv[3]
assert carpool.library_path().startswith(bundle + "/lib/"), carpool.library_path()
loader = carpool.Loader("smoke", batch_size=16, epochs=1, state_dir=state, device=device,
                        transform="random_crop(224)|flip|normalize(imagenet)|float32|nchw")
seen, shape, kind = 0, None, None
for images, labels in loader:
    seen += len(labels)
    shape, kind = tuple(images.shape), type(images).__module__ + "." + type(images).__name__
    where = str(getattr(images, "device", "cpu"))
assert seen == 50, seen
assert shape[1:] == (3, 224, 224), shape
print(f"python {sys.version.split()[0]}: {len(loader)} batches, {seen} samples, last {shape} "
      f"{kind} on {where}; libcarpool from {carpool.library_path()}")
EOF
}
out=$(loader_check cpu) || fail "Python loader ($PY)"
echo "smoke: $out"

# 5. GPU batches.
if [ "$GPU" = 1 ]; then
  run consume --dataset smoke --batch-size 16 --epochs 1 --device cuda:0 --state-dir "$STATE" \
    --json >"$WORK/gpu.json" || fail "carpool consume --device cuda:0"
  echo "smoke: carpool consume --device cuda:0: $(cat "$WORK/gpu.json")"
  out=$(loader_check cuda:0) || fail "Python loader on cuda:0 ($PY)"
  echo "smoke: $out"
fi

kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "the server did not stop cleanly on SIGTERM: $(tail -3 "$WORK/server.log")"
SERVER_PID=""
echo "smoke: OK"
