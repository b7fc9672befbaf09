#!/usr/bin/env bash
# Configures (warnings as errors: this is our and CI's build), builds (-j2) and runs every test.
# Exits non-zero on any failure.
# BUILD_DIR (default build) and extra CMake arguments via CARPOOL_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCARPOOL_BUILD_TESTS=ON -DCARPOOL_WERROR=ON ${CARPOOL_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j2
cd "$BUILD_DIR"
ctest --output-on-failure -j2 --timeout 600
