#!/usr/bin/env bash
# ctest's carpool_wheel_test: scripts/wheel.sh --check (the platform wheel installed with --no-deps
# into a fresh venv, then the README's tour from there, no CARPOOL_* variable) on an EXISTING
# bundle, about 10 s. Making the bundle is a Release build of its own (scripts/bundle.sh: 8.5 min
# on the 2-core VM with a warm ccache), too long for CI, so this test does not build one: it skips
# (exit 77, saying why) without a bundle of the source tree's commit, without python3's venv
# module, or without Fashion-MNIST. Bundle: $CARPOOL_WHEEL_BUNDLE, else dist/carpool-bundle.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${CARPOOL_WHEEL_BUNDLE:-$ROOT/dist/carpool-bundle}
skip() { echo "SKIP: $*"; exit 77; }
[ -f "$BUNDLE/BUILD-INFO" ] ||
  skip "no bundle at $BUNDLE; make one with scripts/bundle.sh (a Release build) or set CARPOOL_WHEEL_BUNDLE"
built=$(sed -n '1s/^carpool \([0-9a-f]*\).*/\1/p' "$BUNDLE/BUILD-INFO")
head=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$built" ] && [ "$built" = "$head" ] ||
  skip "the bundle at $BUNDLE is of commit '${built:-?}', the source tree is at $head; rebuild it with scripts/bundle.sh"
/usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null ||
  skip "/usr/bin/python3 has no venv/ensurepip module; install python3-venv"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "Fashion-MNIST is not in /usr/share/datasets/fashion-mnist (scripts/setup.sh installs it)"
OUT=$(mktemp -d -t carpool-wheel-test-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
"$ROOT/scripts/wheel.sh" --bundle "$BUNDLE" --out "$OUT" --check
