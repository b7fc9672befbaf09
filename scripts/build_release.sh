#!/usr/bin/env bash
# Compiles everything, tests and benchmarks included, as a Release build (-O3) with warnings as
# errors: the optimizer inlines more and warns where scripts/test.sh's -O2 build does not. It only
# builds; scripts/test.sh runs the tests. CI runs it (.ci/run).
# BUILD_DIR (default build-release) and extra CMake arguments via CARPOOL_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-release}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARPOOL_BUILD_TESTS=ON \
    -DCARPOOL_WERROR=ON ${CARPOOL_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j2
echo "build_release: $BUILD_DIR built clean (-O3, -Werror) in ${SECONDS} s"
