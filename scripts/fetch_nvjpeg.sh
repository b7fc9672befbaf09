#!/usr/bin/env bash
# Fetches nvJPEG's header and library from PyPI's nvidia-nvjpeg wheel into a build folder (never
# system-wide), for the server's GPU decode (docs/gpu.md "GPU decode"). The CUDA toolkit here has
# no nvJPEG. Idempotent: a folder that already holds this version is left alone.
#
#   scripts/fetch_nvjpeg.sh DEST     # DEST/include/nvjpeg.h, DEST/lib/libnvjpeg.so.13
#
# Exit 0 when DEST holds them; 1 with the reason (offline, a checksum mismatch) otherwise. The
# build then goes on without GPU decode (CMake prints why).
set -euo pipefail
dest=${1:?usage: scripts/fetch_nvjpeg.sh DEST}
version=13.3.2.43
wheel=nvidia_nvjpeg-${version}-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
sha256=27f9c4a25a73f1d1ad35c342c8d657c8ff43e23877f338ef15fb2602ac2e5aa8
py=${PYTHON:-/usr/bin/python3}
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$version" ] &&
   [ -f "$dest/include/nvjpeg.h" ] && [ -f "$dest/lib/libnvjpeg.so.13" ]; then
  exit 0
fi
mkdir -p "$dest/wheel"
if [ ! -f "$dest/wheel/$wheel" ]; then
  echo "fetch_nvjpeg: downloading nvidia-nvjpeg==$version from PyPI into $dest/wheel" >&2
  if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      --python-version 3 -d "$dest/wheel" "nvidia-nvjpeg==$version" >&2; then
    echo "fetch_nvjpeg: could not download nvidia-nvjpeg==$version (offline, or no pip for $py);" \
         "GPU decode is left out of this build" >&2
    exit 1
  fi
fi
if ! echo "$sha256  $dest/wheel/$wheel" | sha256sum --check --status; then
  echo "fetch_nvjpeg: $dest/wheel/$wheel does not match its sha256 $sha256; delete it and retry" >&2
  exit 1
fi
"$py" - "$dest" "$dest/wheel/$wheel" <<'PY'
import pathlib, sys, zipfile
dest, wheel = pathlib.Path(sys.argv[1]), sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for member, target in (("nvidia/cu13/include/nvjpeg.h", "include/nvjpeg.h"),
                           ("nvidia/cu13/lib/libnvjpeg.so.13", "lib/libnvjpeg.so.13"),
                           ("nvidia_nvjpeg-13.3.2.43.dist-info/licenses/License.txt", "LICENSE.txt")):
        out = dest / target
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(member))
PY
echo "$version" > "$dest/VERSION"
echo "fetch_nvjpeg: nvJPEG $version in $dest" >&2
