#!/usr/bin/env bash
# Builds everything with clang and its thread-safety analysis (-Wthread-safety) as errors: the
# GUARDED_BY / REQUIRES annotations (common/thread_annotations.h) are checked, and any
# finding fails the build. GCC ignores the annotations, so this is the build that checks them.
# BUILD_DIR (default build-clang), CLANG_VERSION (default 14), extra CMake arguments via
# CARPOOL_CMAKE_ARGS (e.g. -DCARPOOL_WITH_CUDA=OFF where nvcc is absent or too new for it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-clang}
CLANG_VERSION=${CLANG_VERSION:-14}
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="clang++-$CLANG_VERSION" -DCMAKE_C_COMPILER="clang-$CLANG_VERSION" \
  -DCMAKE_CXX_FLAGS='-Wthread-safety -Wthread-safety-beta -Werror=thread-safety -Werror=thread-safety-beta' ${CARPOOL_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j2
