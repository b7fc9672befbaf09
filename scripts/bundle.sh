#!/usr/bin/env bash
# Builds the portable bundle (docs/architecture.md "Packaging"): `carpool`, libcarpool.so, every
# non-system runtime library the two need, and the Python package, in one folder that runs where
# it is copied on any x86-64 Linux with glibc >= this machine's, with nothing of carpool's
# dependencies installed there. Check it with scripts/bundle_smoke.sh.
#
#   scripts/bundle.sh [--build-dir DIR] [--out DIR] [--cuda on|off] [--tar] [--jobs N]
#
# Layout of OUT (default dist/carpool-bundle):
#   bin/carpool        the CLI and server (RPATH $ORIGIN/../lib)
#   bin/carpool-env    prints the exports that put the bundle to use: eval "$(bin/carpool-env)"
#   lib/               libcarpool.so (RPATH $ORIGIN) and the libraries, each under its SONAME
#   python/carpool     the Python package; it finds ../../lib/libcarpool.so by itself
#   README.txt, BUILD-INFO, bundle_smoke.sh (scripts/bundle_smoke.sh: checks the bundle it is in)
# Not bundled, because the target machine has its own and must use it: glibc's libraries,
# libstdc++, libgcc_s, and the NVIDIA driver's (libcuda, libnvidia-*). The CUDA runtime is linked
# statically; were libcudart.so needed, it would be bundled like any other library.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build-bundle-rel"
OUT="$ROOT/dist/carpool-bundle"
CUDA=""
TAR=0
JOBS=2
MAX_MIB=48

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --cuda) CUDA=$2; shift 2 ;;
    --tar) TAR=1; shift ;;
    --jobs) JOBS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bundle: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
case "$CUDA" in
  "") CUDA_FLAG=() ;;  # the project's default: on where nvcc is found
  on|ON) CUDA_FLAG=(-DCARPOOL_WITH_CUDA=ON) ;;
  off|OFF) CUDA_FLAG=(-DCARPOOL_WITH_CUDA=OFF) ;;
  *) echo "bundle: --cuda '$CUDA' is not on or off" >&2; exit 2 ;;
esac
for tool in cmake ninja ldd readelf objdump strip; do
  command -v "$tool" >/dev/null || { echo "bundle: '$tool' not found; run scripts/setup.sh" >&2; exit 1; }
done

# Release, no imgcodecs (it drags GDAL in), no tests or benchmarks, warnings not errors (-O3
# brings false positives that must not stop a user's bundle). DT_RPATH rather than
# DT_RUNPATH (--disable-new-dtags): the loader then searches the bundle's lib/ for the libraries'
# own dependencies too, not only for the binary's, so the copied libraries need no patching.
echo "bundle: configuring $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCARPOOL_WITH_IMGCODECS=OFF -DCARPOOL_BUILD_TESTS=OFF -DCARPOOL_BUILD_BENCHMARKS=OFF \
  -DCARPOOL_WERROR=OFF \
  "${CUDA_FLAG[@]}" \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
  -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags >/dev/null
echo "bundle: building carpool and libcarpool.so (-j$JOBS)"
TARGETS=(carpool carpool_c)
# GPU decode in the jobs' processes (server/job_decode.h): libcarpool dlopens it from its lib/.
cmake --build "$BUILD" --target help | grep -q '^carpool_job_decode:' && TARGETS+=(carpool_job_decode)
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
BIN="$BUILD/tools/carpool"
LIB=$(readlink -f "$BUILD/client/libcarpool.so")
JOB_DECODE="$BUILD/client/libcarpool_job_decode.so"
[ -f "$JOB_DECODE" ] || JOB_DECODE=""

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/python"
cp "$BIN" "$OUT/bin/carpool"
cp "$LIB" "$OUT/lib/libcarpool.so"
[ -n "$JOB_DECODE" ] && cp "$JOB_DECODE" "$OUT/lib/libcarpool_job_decode.so"

# Libraries the target machine provides: glibc's, the C++ runtime, the NVIDIA driver's.
SYSTEM='^(linux-vdso\.so|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libBrokenLocale\.so|libnss_|libthread_db\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia)'
declare -A SOURCE=()
while read -r name path; do
  [[ "$name" =~ $SYSTEM ]] && continue
  if [ "$path" = "not" ]; then
    echo "bundle: $name is not found on this machine (ldd); cannot bundle it" >&2
    exit 1
  fi
  soname=$(readelf -d "$path" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  soname=${soname:-$name}
  [ -n "${SOURCE[$soname]:-}" ] && continue
  SOURCE[$soname]=$(readlink -f "$path")
  cp -L "$path" "$OUT/lib/$soname"
done < <(ldd "$BIN" "$LIB" $JOB_DECODE | awk '$2 == "=>" { print $1, $3 }' | sort -u)

chmod u+w "$OUT"/bin/* "$OUT"/lib/*
strip --strip-unneeded "$OUT/bin/carpool" "$OUT"/lib/*

# GPU decode: libnvjpeg is opened at run time (dlopen), so ldd does not list it; the binary's
# DT_RPATH ($ORIGIN/../lib) is where dlopen finds it. NVIDIA's build, copied as it is.
NVJPEG="$BUILD/_deps/nvjpeg/lib/libnvjpeg.so.13"
if [ -f "$NVJPEG" ]; then
  cp -L "$NVJPEG" "$OUT/lib/libnvjpeg.so.13"
  SOURCE[libnvjpeg.so.13]="$(readlink -f "$NVJPEG") (PyPI nvidia-nvjpeg, scripts/fetch_nvjpeg.sh)"
fi

(cd "$ROOT/client/python" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - carpool) |
  tar -xf - -C "$OUT/python"

cp "$ROOT/scripts/bundle_smoke.sh" "$OUT/bundle_smoke.sh"

cat >"$OUT/bin/carpool-env" <<'EOF'
#!/usr/bin/env bash
# Prints the exports that put this carpool bundle to use:  eval "$(/path/to/bundle/bin/carpool-env)"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
printf 'export PATH=%q:"$PATH"\n' "$root/bin"
printf 'export PYTHONPATH=%q${PYTHONPATH:+:"$PYTHONPATH"}\n' "$root/python"
printf 'export CARPOOL_LIB=%q\n' "$root/lib/libcarpool.so"
printf 'export CARPOOL_BIN=%q\n' "$root/bin/carpool"
EOF
chmod +x "$OUT/bin/carpool-env"

cat >"$OUT/README.txt" <<'EOF'
carpool portable bundle: runs where it is copied, on x86-64 Linux with glibc at least the
version in BUILD-INFO; nothing else of carpool's needs to be installed (see BUILD-INFO for what
the bundle expects from the machine).

  eval "$(/path/to/carpool-bundle/bin/carpool-env)"   # PATH, PYTHONPATH, CARPOOL_LIB, CARPOOL_BIN
  carpool --help
  carpool server --cache-size 8GiB &
  python3 -c 'import carpool; print(carpool.library_path())'
  ./bundle_smoke.sh [--gpu]     # checks this bundle here: libraries, env -i, an end-to-end job

Images: JPEG and PNG only (no OpenCV imgcodecs in the bundle); convert other formats first.
EOF

{
  echo "carpool $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown), built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "build: Release, CARPOOL_WITH_IMGCODECS=OFF, $(grep -E '^CARPOOL_WITH_CUDA:' "$BUILD/CMakeCache.txt")"
  # The newest symbol versions the bundle's code asks of glibc and libstdc++.
  newest() { objdump -T "$OUT"/bin/carpool "$OUT"/lib/* | grep -o "$1[0-9.]*" | sort -uV | tail -1; }
  gpu=""
  grep -q '^CARPOOL_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" && gpu=", and for GPUs the NVIDIA driver (libcuda)"
  echo "needs from the machine: $(newest GLIBC_) (glibc), $(newest GLIBCXX_) (libstdc++), libgcc_s$gpu"
  echo "bundled libraries (from):"
  for soname in $(printf '%s\n' "${!SOURCE[@]}" | sort); do echo "  lib/$soname  ${SOURCE[$soname]}"; done
} >"$OUT/BUILD-INFO"

bytes=$(du -sb "$OUT" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "bundle: $OUT: $mib MiB (limit $MAX_MIB MiB), ${#SOURCE[@]} libraries bundled besides libcarpool.so"
if [ "$bytes" -gt $((MAX_MIB * 1048576)) ]; then
  echo "bundle: $mib MiB is over the $MAX_MIB MiB limit; see BUILD-INFO for what is in lib/" >&2
  exit 1
fi
if [ "$TAR" = 1 ]; then
  tarball="$(dirname "$OUT")/$(basename "$OUT").tar.gz"
  tar -C "$(dirname "$OUT")" -czf "$tarball" "$(basename "$OUT")"
  echo "bundle: $tarball: $(du -h "$tarball" | cut -f1)"
fi
