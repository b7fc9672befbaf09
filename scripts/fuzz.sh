#!/usr/bin/env bash
# Builds the protocol fuzzer (libFuzzer + ASan + UBSan, clang-14) in build-fuzz and runs it for
# SECONDS (default 60) on a copy of protocol/fuzz_corpus in a temporary folder. Exits non-zero on
# a finding and prints the input that caused it. See docs/fuzzing.md.
# Usage: scripts/fuzz.sh [SECONDS]. Environment: BUILD_DIR (default build-fuzz); FUZZ_ARGS, more
# libFuzzer flags; FUZZ_CORPUS_OUT, a folder that receives the grown corpus at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-60}
BUILD_DIR=${BUILD_DIR:-build-fuzz}
if ! [[ "$DURATION" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: SECONDS is '$DURATION', expected a positive whole number (e.g. scripts/fuzz.sh 60)" >&2
  exit 2
fi

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCARPOOL_BUILD_FUZZERS=ON -DCARPOOL_WITH_CUDA=OFF -DCARPOOL_BUILD_TESTS=OFF \
    -DCARPOOL_BUILD_BENCHMARKS=OFF
fi
cmake --build "$BUILD_DIR" -j2 --target carpool_protocol_fuzzer carpool_fuzz_seed_gen
FUZZER=$BUILD_DIR/protocol/carpool_protocol_fuzzer

work=$(mktemp -d "${TMPDIR:-/tmp}/carpool-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/seeds" "$work/corpus"

# The generated seeds must match the checked-in ones; otherwise the wire format changed and every
# seed would be rejected at the header. Other files there (an input kept from a finding) are not
# checked.
"$BUILD_DIR/protocol/carpool_fuzz_seed_gen" "$work/seeds"
for seed in "$work/seeds"/*; do
  if ! cmp -s "$seed" "protocol/fuzz_corpus/$(basename "$seed")"; then
    echo "fuzz: protocol/fuzz_corpus/$(basename "$seed") is missing or stale (did the wire format" \
         "change?); regenerate: $BUILD_DIR/protocol/carpool_fuzz_seed_gen protocol/fuzz_corpus" >&2
    exit 1
  fi
done
cp protocol/fuzz_corpus/* "$work/corpus/"

# Findings are written outside the temporary folder, so they outlive this script.
artifacts=$BUILD_DIR/fuzz-artifacts/$(date +%Y%m%d-%H%M%S)
mkdir -p "$artifacts"
echo "fuzz: $FUZZER for ${DURATION} s on $(ls "$work/corpus" | wc -l) seeds"
set +e
# shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
"$FUZZER" -max_total_time="$DURATION" -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} "$work/corpus" 2>&1 | tee "$work/log"
rc=${PIPESTATUS[0]}
set -e

if [ -n "${FUZZ_CORPUS_OUT:-}" ]; then
  mkdir -p "$FUZZ_CORPUS_OUT"
  cp "$work/corpus"/* "$FUZZ_CORPUS_OUT/"
fi
findings=$(find "$artifacts" -type f)
if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
  echo "fuzz: FAILED (fuzzer exit $rc)" >&2
  if [ -z "$findings" ]; then echo "fuzz: it wrote no input; see its output above" >&2; fi
  while IFS= read -r f; do
    [ -n "$f" ] && echo "fuzz: input $f (reproduce: $FUZZER $f)" >&2
  done <<<"$findings"
  exit 1
fi
rmdir "$artifacts"
echo "fuzz: no finding in ${DURATION} s: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$work/log" | tail -1)"
