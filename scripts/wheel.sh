#!/usr/bin/env bash
# Builds the platform wheel carpool-<version>-py3-none-manylinux_2_<N>_x86_64.whl: the Python
# package with libcarpool.so, the `carpool` binary and the libraries they need (those of the
# portable bundle, scripts/bundle.sh), so that `pip install` of it puts `carpool` on PATH and the
# package finds its library and binary with no environment variable. N is the newest glibc symbol
# version the bundle's code asks for. Python-version independent (ctypes, no extension module).
#
#   scripts/wheel.sh [--bundle DIR] [--out DIR] [--check] [bundle.sh options: --build-dir,
#                    --cuda, --jobs]
#
#   --bundle DIR  pack this existing bundle instead of building one (scripts/bundle.sh --out DIR)
#   --out DIR     where the wheel goes (default dist/)
#   --check       then install it with --no-deps into a fresh venv (/usr/bin/python3 -m venv
#                 --system-site-packages: numpy and torch from apt) and run the README's tour
#                 from there, with no CARPOOL_* variable and outside the source tree
# Inside the wheel: carpool/*.py, carpool/bin/carpool (RPATH $ORIGIN/../lib), carpool/lib/
# (libcarpool.so and the bundled libraries, each under its SONAME), carpool/BUILD-INFO (what the
# wheel expects from the machine: glibc, libstdc++, libgcc_s), and the console script `carpool`
# (carpool._command: execs carpool/bin/carpool).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="$ROOT/dist"
BUNDLE=""
CHECK=0
BUNDLE_ARGS=()
MAX_MIB=48

while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$(realpath -m "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --check) CHECK=1; shift ;;
    --build-dir|--cuda|--jobs) BUNDLE_ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done

if [ -z "$BUNDLE" ]; then
  BUNDLE="$OUT/wheel-bundle"
  "$ROOT/scripts/bundle.sh" --out "$BUNDLE" "${BUNDLE_ARGS[@]}"
fi
for f in bin/carpool lib/libcarpool.so python/carpool/__init__.py BUILD-INFO; do
  [ -e "$BUNDLE/$f" ] || { echo "wheel: $BUNDLE/$f missing; is $BUNDLE a bundle (scripts/bundle.sh)?" >&2; exit 1; }
done
mkdir -p "$OUT"

WHEEL=$(/usr/bin/python3 - "$BUNDLE" "$OUT" "$ROOT/client/python/pyproject.toml" "$MAX_MIB" <<'EOF'
import base64, hashlib, pathlib, re, sys, zipfile

bundle, out, pyproject, max_mib = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), \
    pathlib.Path(sys.argv[3]).read_text(), int(sys.argv[4])
version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
info = (bundle / "BUILD-INFO").read_text()
glibc = re.search(r"GLIBC_2\.(\d+)", info)
if not glibc:
    sys.exit(f"wheel: no GLIBC_2.N in {bundle}/BUILD-INFO; rebuild the bundle")
tag = f"py3-none-manylinux_2_{glibc.group(1)}_x86_64"
dist_info = f"carpool-{version}.dist-info"
files = []  # (archive name, bytes, executable)
for p in sorted((bundle / "python" / "carpool").rglob("*")):
    if p.is_file() and "__pycache__" not in p.parts:
        files.append((f"carpool/{p.relative_to(bundle / 'python' / 'carpool')}", p.read_bytes(),
                      False))
files.append(("carpool/bin/carpool", (bundle / "bin" / "carpool").read_bytes(), True))
for p in sorted((bundle / "lib").iterdir()):
    files.append((f"carpool/lib/{p.name}", p.read_bytes(), False))
files.append(("carpool/BUILD-INFO", info.encode(), False))
meta = {
    "METADATA": f"Metadata-Version: 2.1\nName: carpool\nVersion: {version}\nSummary: carpool's "
                "data-loading server, CLI and Python loader for collocated training jobs\n"
                "Requires-Python: >=3.9\nRequires-Dist: numpy\n",
    "WHEEL": f"Wheel-Version: 1.0\nGenerator: carpool scripts/wheel.sh\nRoot-Is-Purelib: false\n"
             f"Tag: {tag}\n",
    "entry_points.txt": "[console_scripts]\ncarpool = carpool._command:main\n",
}
files += [(f"{dist_info}/{k}", v.encode(), False) for k, v in meta.items()]
record = []
for name, data, _ in files:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"{dist_info}/RECORD,,")
files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), False))
wheel = out / f"carpool-{version}-{tag}.whl"
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data, executable in files:
        zi = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))  # fixed time: the same bytes each build
        zi.external_attr = (0o100755 if executable else 0o100644) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(zi, data)
size = wheel.stat().st_size
print(f"wheel: {wheel.name}: {size / 2**20:.1f} MiB (limit {max_mib} MiB), {len(files)} files",
      file=sys.stderr)
if size > max_mib * 2**20:
    sys.exit(f"wheel: {size / 2**20:.1f} MiB is over the {max_mib} MiB limit; see BUILD-INFO")
print(wheel)
EOF
)
echo "wheel: $WHEEL"
sed 's/^/wheel:   /' "$BUNDLE/BUILD-INFO"

[ "$CHECK" = 1 ] || exit 0
# The README's tour from a fresh venv: nothing of the source tree or the build is reachable.
WORK=$(mktemp -d -t carpool-wheel-check-XXXXXX)
trap 'kill "${SERVER:-0}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-deps "$WHEEL"
cd "$WORK"
export PATH="$WORK/venv/bin:$PATH" CARPOOL_STATE_DIR="$WORK/state"
unset CARPOOL_BIN CARPOOL_LIB CARPOOL_BUILD_DIR PYTHONPATH
echo "wheel check: carpool on PATH is $(command -v carpool)"
FM=/usr/share/datasets/fashion-mnist
set -x
carpool dataset add fmnist --idx $FM/train-images-idx3-ubyte.gz $FM/train-labels-idx1-ubyte.gz -q
carpool dataset add fmnist-tops --from fmnist --classes 0,2,4,6
carpool dataset ls
carpool dataset overlap fmnist fmnist-tops
carpool dataset gen "$WORK/synth" --count 200 --size 500x375 --classes 10 --seed 1 -q
carpool dataset add synth --dir "$WORK/synth" --prepare resize=256,crop=256 -q
carpool sim --job a=0:1000 --job b=500:1500 --json >/dev/null
carpool server --cache-size 256MiB >"$WORK/server.log" 2>&1 &
SERVER=$!
{ set +x; } 2>/dev/null  # the wait is not part of the tour
for _ in $(seq 100); do [ -S "$WORK/state/carpool.sock" ] && break; sleep 0.1; done
set -x
carpool consume --dataset fmnist-tops --batch-size 64 --epochs 2 --json
carpool status >/dev/null
python - <<'PY'
import carpool, carpool.datasets
print("library:", carpool.library_path(), "binary:", carpool.binary())
assert "/venv/" in carpool.library_path() and "/venv/" in carpool.binary()
loader = carpool.Loader("fmnist", batch_size=64, epochs=2)
n = sum(len(labels) for epoch in range(loader.epochs) for images, labels in loader)
print("python: fmnist, 2 epochs:", n, "samples; sharing ratio",
      carpool.server_stats()["sharing_ratio"], "; datasets:",
      [d["name"] for d in carpool.datasets.list()])
assert n == 2 * 60000
PY
set +x
echo "wheel check: passed"
