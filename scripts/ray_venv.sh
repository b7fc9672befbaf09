#!/usr/bin/env bash
# Creates the virtual environment that examples/ray_tune_sweep.py runs in: /usr/bin/python3 (apt's
# numpy and torch, seen through --system-site-packages) plus ray[tune] from PyPI, never installed
# system-wide. Idempotent: a venv that already imports the pinned Ray is left as it is.
#   scripts/ray_venv.sh [VENV]      # default build-ray/venv; prints the interpreter's path last
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/build-ray/venv}"
RAY_VERSION=2.40.0  # supports Python 3.9-3.12; Debian 12's is 3.11

if [ -x "$VENV/bin/python" ] &&
   "$VENV/bin/python" -c "import ray, ray.tune; assert ray.__version__ == '$RAY_VERSION'" 2>/dev/null; then
  echo "ray_venv: $VENV already has ray $RAY_VERSION" >&2
else
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  # numpy<2: keep numpy 1.x (torch 1.13 is built against it), and so a pyarrow that accepts it.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "ray[tune]==$RAY_VERSION" "numpy<2" "pyarrow<18"
  echo "ray_venv: installed ray[tune]==$RAY_VERSION into $VENV" >&2
fi
echo "$VENV/bin/python"
