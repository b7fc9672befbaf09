#!/usr/bin/env bash
# The whole test suite under ThreadSanitizer (docs/sanitizers.md): configures a TSan build (CUDA
# and benchmarks off), builds it (-j2) and runs every ctest test (-j2) with tests/tsan.supp.
# log_path puts each report in a file of the log directory, also those of the `carpool` processes
# the e2e tests spawn and of the Python test (its interpreter gets LD_PRELOAD of libtsan from
# tests/CMakeLists.txt). 1800 s per test: under TSan on a loaded machine the slowest took 574 s.
# Exits non-zero on a failed test or on any report in the log directory.
# BUILD_DIR (default build-tsan), TSAN_LOG_DIR (default $BUILD_DIR/tsan-logs, emptied first),
# extra CMake arguments via CARPOOL_CMAKE_ARGS, extra TSan options via TSAN_OPTIONS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-tsan}
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCARPOOL_SANITIZE=thread -DCARPOOL_BUILD_BENCHMARKS=OFF \
    -DCARPOOL_WITH_CUDA=OFF -DCARPOOL_BUILD_TESTS=ON ${CARPOOL_CMAKE_ARGS:-}
fi
if ! grep -q '^CARPOOL_SANITIZE:STRING=thread$' "$BUILD_DIR/CMakeCache.txt"; then
  echo "tsan.sh: $BUILD_DIR is not a CARPOOL_SANITIZE=thread build; pick another BUILD_DIR" >&2
  exit 2
fi
cmake --build "$BUILD_DIR" -j2

LOG_DIR=${TSAN_LOG_DIR:-$BUILD_DIR/tsan-logs}
rm -rf "$LOG_DIR"
mkdir -p "$LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)  # the tests run in other directories
start=$(date +%s)
rc=0
(cd "$BUILD_DIR" &&
  TSAN_OPTIONS="log_path=$LOG_DIR/log:second_deadlock_stack=1:suppressions=$ROOT/tests/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}" \
  ctest -j2 --output-on-failure --timeout 1800) || rc=$?
echo "tsan.sh: ctest exit $rc, wall $(($(date +%s) - start)) s"
reports=$(find "$LOG_DIR" -type f | wc -l)
if [ "$reports" -ne 0 ]; then
  echo "tsan.sh: $reports TSan report file(s) in $LOG_DIR:"
  grep -h '^SUMMARY' "$LOG_DIR"/* | sort | uniq -c
  exit 1
fi
echo "tsan.sh: no TSan report in $LOG_DIR"
exit "$rc"
