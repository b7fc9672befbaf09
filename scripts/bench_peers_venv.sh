#!/bin/sh
# The peers of bench.peers (python -m bench.peers) in a virtual environment that also sees apt's numpy, torch
# 1.13 and torchvision (--system-site-packages). Idempotent. Usage: scripts/bench_peers_venv.sh [DIR]
set -eu
venv=${1:-$HOME/.cache/carpool/bench-venv}
here=$(dirname "$0")
root=$(cd "$here/.." && pwd)
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet -r "$here/bench-requirements.txt"
"$venv/bin/pip" install --quiet --no-deps tensorsocket==0.0.5
"$venv/bin/python" -c 'import torch, torchvision, zmq, nvidia.dali, tensorsocket, webdataset' ||
  { echo "bench_peers_venv.sh: a peer does not import in $venv (see above)" >&2; exit 1; }
echo "peers installed; run (from $root): PYTHONPATH=client/python $venv/bin/python -m bench.peers --quick"
