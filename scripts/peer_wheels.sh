#!/bin/sh
# TensorSocket for the GPU machine (issue 13.3), whose Python (3.12, with torch) has no network:
# its wheels and its two dependencies' are fetched here and installed there into a folder on
# PYTHONPATH, never system-wide. torch is not fetched: tensorsocket declares torch>=2.0, which the
# GPU machine has, so every install is --no-deps.
#
#   scripts/peer_wheels.sh download [DIR]          here: the wheels into DIR (default
#                                                  dist/peer-wheels), about 1.4 MB
#   eval "$(scripts/peer_wheels.sh install [DIR] [TARGET])"
#                                                  there: pip --no-index --target TARGET (default
#                                                  /tmp/peer-pylib); prints the PYTHONPATH export
#
# Versions: those of scripts/bench-requirements.txt (pyzmq, tornado) and bench_peers_venv.sh
# (tensorsocket), for CPython 3.12 on manylinux x86-64.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
dir=${2:-dist/peer-wheels}
case "$cmd" in
  download)
    pins=$(grep -E '^(pyzmq|tornado)==' "$here/bench-requirements.txt")
    ts=$(grep -o 'tensorsocket==[0-9.]*' "$here/bench_peers_venv.sh")
    mkdir -p "$dir"
    # shellcheck disable=SC2086  # the pins are separate words
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" $pins "$ts"
    ls -l "$dir" >&2
    ;;
  install)
    target=${3:-/tmp/peer-pylib}
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$target" "$dir"/*.whl >&2
    printf 'export PYTHONPATH=%s${PYTHONPATH:+:"$PYTHONPATH"}\n' "$target"
    ;;
  *)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
