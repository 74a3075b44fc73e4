#!/usr/bin/env bash
# The xray_parity wheel in a fresh venv (no torch): install it, run `xray --version`, fill a
# reference cache with the checkout's xray (the oracle, in .venv), then the tests of this folder
# with the venv's own pytest (the Python API on the committed dumps, the CLI, a torch-free
# `xray check` from that cache, the pytest plugin under pytester). Prints the wheel's size and
# each phase's time. Usage: bindings/python/tests/fresh-venv.sh WHEEL_DIR (from `make test-wheel`).
set -euo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
wheel=$(ls "${1:?usage: fresh-venv.sh WHEEL_DIR}"/xray_parity-*.whl)
py=${PY_BASE:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) kB"
t=$(now)
"$py" -m venv "$tmp/venv"
echo "wheel: fresh venv made in $(took "$t")"
# pytest at the version oracle/requirements.txt pins (the one source of the repository's pins).
pytest_pin=$(grep -E '^pytest==' oracle/requirements.txt)
t=$(now)
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "$wheel"
echo "wheel: pip install of the wheel (numpy from the registry or pip's cache) in $(took "$t")"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "$pytest_pin"
if "$tmp/venv/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  echo "wheel: FAIL torch is importable in the fresh venv" >&2; exit 1
fi
# Run from an empty directory: nothing of the checkout is on the venv's sys.path.
cd "$tmp"
"$tmp/venv/bin/xray" --version
cd "$root"
# The reference the torch-free checks read: computed once by the checkout's xray and its .venv.
t=$(now)
target/release/xray check --model fixtures/build/whisper-rand-a --audio fixtures/audio/fox.wav \
  --max-steps 3 --reference-cache "$tmp/cache" --evidence "$tmp/cold.evidence.json" 2>"$tmp/cold.log" \
  || { cat "$tmp/cold.log" >&2; exit 1; }
echo "wheel: reference cache filled by the checkout's xray (cold check) in $(took "$t")"
t=$(now)
cd "$tmp"
XRAY_ROOT=$root XRAY_TEST_CACHE=$tmp/cache XRAY_TEST_VENV=$tmp/venv \
  "$tmp/venv/bin/pytest" -q -p no:cacheprovider --rootdir "$root/bindings/python/tests" "$root/bindings/python/tests"
echo "wheel: tests in the fresh venv took $(took "$t")"
