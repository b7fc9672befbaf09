#!/usr/bin/env bash
# Installs every system package carpool needs, from Debian's apt. Idempotent: packages already
# present are skipped, so a second run does nothing but report.
set -euo pipefail

PACKAGES=(
  # build
  cmake ninja-build g++ pkg-config
  # libraries
  libroaring-dev libboost-dev libboost-program-options-dev libfmt-dev libsqlite3-dev zlib1g-dev
  nlohmann-json3-dev
  # the narrow OpenCV set (the full libopencv-dev is ~800 MB)
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
  # decoders of the portable bundle (scripts/bundle.sh): TurboJPEG and libpng
  libturbojpeg0-dev libpng-dev
  # tests and benchmarks
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  # the protocol fuzzer (scripts/fuzz.sh): clang, and libFuzzer's runtime, which clang-14 only
  # recommends (libclang_rt.fuzzer-x86_64.a)
  clang-14 libclang-rt-14-dev
  # the /metrics end-to-end test scrapes with curl and parses with the Prometheus client
  curl python3-prometheus-client
  # python side and the embedded default dataset
  python3 python3-numpy python3-torch python3-torchvision dataset-fashion-mnist
  # examples/optuna_sweep.py: trials of one study in several processes (Debian 12: optuna 3.1)
  python3-optuna
  # `carpool report`: the PNG of a status series (client/python/carpool/report.py)
  python3-matplotlib
  # bench.stagger_floor: the linear program bounding the stagger scenario (HiGHS, SciPy >= 1.6)
  python3-scipy
  # scripts/fetch_nvjpeg.sh (run by CMake with CUDA): pip downloads nvJPEG's wheel from PyPI into
  # the build folder, never installing it
  python3-pip
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
