#!/usr/bin/env bash
# Builds the libFuzzer targets (libFuzzer + ASan + UBSan, clang-14) in build-fuzz and runs each for
# SECONDS (default 60) on a copy of its seed corpus in a temporary folder: the protocol frame
# decoder, the IDX header parser, the tar member listing and the prepare spec parser. Exits
# non-zero if any target finds something, and prints each input that did. See docs/fuzzing.md.
# Usage: scripts/fuzz.sh [SECONDS]. Environment: BUILD_DIR (default build-fuzz); FUZZ_TARGETS, the
# targets to run (default all: protocol idx tar_members prepare_spec); FUZZ_ARGS, more libFuzzer
# flags; FUZZ_CORPUS_OUT, a folder that receives each target's grown corpus in a subfolder.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-60}
BUILD_DIR=${BUILD_DIR:-build-fuzz}
if ! [[ "$DURATION" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: SECONDS is '$DURATION', expected a positive whole number (e.g. scripts/fuzz.sh 60)" >&2
  exit 2
fi

# name -> fuzzer binary (under BUILD_DIR) and seed corpus.
declare -A BINARY=(
  [protocol]=protocol/carpool_protocol_fuzzer
  [idx]=datasets/carpool_idx_fuzzer
  [tar_members]=datasets/carpool_tar_members_fuzzer
  [prepare_spec]=datasets/carpool_prepare_spec_fuzzer
)
declare -A SEEDS=(
  [protocol]=protocol/fuzz_corpus
  [idx]=datasets/fuzz_corpus/idx
  [tar_members]=datasets/fuzz_corpus/tar_members
  [prepare_spec]=datasets/fuzz_corpus/prepare_spec
)
TARGETS=${FUZZ_TARGETS:-protocol idx tar_members prepare_spec}
build_targets=(carpool_fuzz_seed_gen)
for name in $TARGETS; do
  if [ -z "${BINARY[$name]:-}" ]; then
    echo "fuzz: FUZZ_TARGETS names '$name'; the targets are: ${!BINARY[*]}" >&2
    exit 2
  fi
  build_targets+=("$(basename "${BINARY[$name]}")")
done

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCARPOOL_BUILD_FUZZERS=ON -DCARPOOL_WITH_CUDA=OFF -DCARPOOL_BUILD_TESTS=OFF \
    -DCARPOOL_BUILD_BENCHMARKS=OFF
fi
cmake --build "$BUILD_DIR" -j2 --target "${build_targets[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/carpool-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The generated protocol seeds must match the checked-in ones; otherwise the wire format changed
# and every seed would be rejected at the header. Other files there (an input kept from a
# finding) are not checked. The datasets seeds are files of fixed formats (datasets/fuzz_seeds.py).
mkdir "$work/protocol-seeds"
"$BUILD_DIR/protocol/carpool_fuzz_seed_gen" "$work/protocol-seeds"
for seed in "$work/protocol-seeds"/*; do
  if ! cmp -s "$seed" "protocol/fuzz_corpus/$(basename "$seed")"; then
    echo "fuzz: protocol/fuzz_corpus/$(basename "$seed") is missing or stale (did the wire format" \
         "change?); regenerate: $BUILD_DIR/protocol/carpool_fuzz_seed_gen protocol/fuzz_corpus" >&2
    exit 1
  fi
done

# Findings are written outside the temporary folder, so they outlive this script.
stamp=$(date +%Y%m%d-%H%M%S)
failed=()
summary=()   # one line per target that found nothing
problems=()  # the lines of those that did
for name in $TARGETS; do
  fuzzer=$BUILD_DIR/${BINARY[$name]}
  corpus=$work/$name
  artifacts=$BUILD_DIR/fuzz-artifacts/$stamp/$name
  mkdir -p "$corpus" "$artifacts"
  cp "${SEEDS[$name]}"/* "$corpus/"
  echo "fuzz: $name: $fuzzer for ${DURATION} s on $(ls "$corpus" | wc -l) seeds"
  set +e
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  "$fuzzer" -max_total_time="$DURATION" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} "$corpus" 2>&1 | tee "$work/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ -n "${FUZZ_CORPUS_OUT:-}" ]; then
    mkdir -p "$FUZZ_CORPUS_OUT/$name"
    cp "$corpus"/* "$FUZZ_CORPUS_OUT/$name/"
  fi
  findings=$(find "$artifacts" -type f)
  if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
    failed+=("$name")
    problems+=("fuzz: $name: FAILED (fuzzer exit $rc)")
    if [ -z "$findings" ]; then problems+=("fuzz: $name: it wrote no input; see its output above"); fi
    while IFS= read -r f; do
      [ -n "$f" ] && problems+=("fuzz: $name: input $f (reproduce: $fuzzer $f)")
    done <<<"$findings"
  else
    rmdir "$artifacts"
    summary+=("fuzz: $name: no finding in ${DURATION} s: $(grep -E '^#[0-9]+[[:space:]]+DONE' \
      "$work/$name.log" | tail -1)")
  fi
done
rmdir "$BUILD_DIR/fuzz-artifacts/$stamp" 2>/dev/null || true

if [ "${#summary[@]}" -gt 0 ]; then printf '%s\n' "${summary[@]}"; fi
if [ "${#failed[@]}" -gt 0 ]; then
  printf '%s\n' "${problems[@]}" "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
