#!/usr/bin/env bash
# Prints the manifests of one trial of a sweep: its rendezvous Service (trial-service.yaml) and
# one Job per node (trial-job.yaml), for `kubectl apply -f -`. Walk-through: docs/deploy.md.
#
#   CARPOOL_NODES="gpu-a gpu-b" deploy/kubernetes/launch-trial.sh NAME [TRAIN_ARGS]
#   CARPOOL_NODES="gpu-a gpu-b" deploy/kubernetes/launch-trial.sh lr-0-1 "--lr 0.1" |
#       kubectl -n carpool apply -f -
#
# CARPOOL_NODES   the sweep's nodes (kubernetes.io/hostname), in the same order for every trial:
#                 a node's position is its node rank, and so the part of the data its server
#                 serves each trial (required)
# GPUS_PER_TRIAL  ranks per node (torchrun --nproc-per-node)                                [4]
# TRIAL_GPU_BASE  the trial's first GPU on each node; trial ranks use cuda:(base + LOCAL_RANK) [0]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
TRIAL=$1
TRAIN_ARGS=${2:-}
GPUS_PER_TRIAL=${GPUS_PER_TRIAL:-4}
TRIAL_GPU_BASE=${TRIAL_GPU_BASE:-0}
read -r -a NODES <<<"${CARPOOL_NODES:-}"

fail() { echo "launch-trial: $*" >&2; exit 2; }
[ "${#NODES[@]}" -gt 0 ] || fail "set CARPOOL_NODES to the sweep's node names, in a fixed order"
# The Job's pods are named NAME-node<k>-<suffix>: NAME must be a DNS label, short enough.
[[ "$TRIAL" =~ ^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$ ]] ||
  fail "trial name \"$TRIAL\" is not a DNS label of at most 40 characters (a-z, 0-9, -)"
[[ "$GPUS_PER_TRIAL" =~ ^[1-9][0-9]*$ ]] || fail "GPUS_PER_TRIAL \"$GPUS_PER_TRIAL\" is not a count"
[[ "$TRIAL_GPU_BASE" =~ ^[0-9]+$ ]] || fail "TRIAL_GPU_BASE \"$TRIAL_GPU_BASE\" is not a GPU index"

# TRAIN_ARGS goes into a YAML double-quoted string.
yaml_escaped=${TRAIN_ARGS//\\/\\\\}
yaml_escaped=${yaml_escaped//\"/\\\"}

# Replaces each ${NAME} of the template with the value given (quoted: no `&` expansion).
render() {
  local template=$1 node=$2 rank=$3 line
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line//"\${TRIAL}"/"$TRIAL"}
    line=${line//"\${NODE}"/"$node"}
    line=${line//"\${NODE_RANK}"/"$rank"}
    line=${line//"\${NNODES}"/"${#NODES[@]}"}
    line=${line//"\${GPUS_PER_TRIAL}"/"$GPUS_PER_TRIAL"}
    line=${line//"\${TRIAL_GPU_BASE}"/"$TRIAL_GPU_BASE"}
    line=${line//"\${TRAIN_ARGS}"/"$yaml_escaped"}
    printf '%s\n' "$line"
  done <"$template"
}

echo "---"
render "$HERE/trial-service.yaml" "" 0
for rank in "${!NODES[@]}"; do
  echo "---"
  render "$HERE/trial-job.yaml" "${NODES[$rank]}" "$rank"
done
