#!/usr/bin/env bash
# The wheel stage: the release as a user gets it.   (or: bash scripts/test wheel)
#   bash scripts/stages/wheel.sh
# Builds the sdist and, from it, the wheel (python -m build, with the pinned build
# backend of requirements/wheel.txt, no isolated build env), checks their metadata
# (twine check --strict) and their files (scripts/stages/wheel_check.py artifacts),
# then installs the wheel with the main env's torch pin into a fresh venv in a
# temporary folder and, from a temporary working directory with no checkout on
# sys.path, runs `accel --version`, `accel list`, `accel demo --steps 2` and imports
# every public module the installed wheel holds (wheel_check.py installed).
# About a minute on 2 idle cores, most of it pip installing torch into the venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"
python="${ACCEL_TEST_PYTHON:-python3}"
check="$repo/scripts/stages/wheel_check.py"

quiet_pip() {
    # pip warns about this machine's unused local index locations; keep the log readable.
    "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# The torch a user gets in the README's set-up command, and the one the main tier tests.
torch_pin="$(grep -E '^torch==' requirements/main.txt)"
[[ -n "$torch_pin" ]] || { echo "error: requirements/main.txt pins no torch==" >&2; exit 1; }

tools="$(scripts/ensure-env requirements/wheel.txt)"
work="$(mktemp -d "${TMPDIR:-/tmp}/accel-wheel-stage.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir "$work/cwd"

echo "-- python -m build: the sdist, then the wheel from the sdist"
"$tools/bin/python" -u -m build --no-isolation --outdir "$work/dist" "$repo"

echo "-- twine check --strict"
"$tools/bin/twine" --no-color check --strict "$work"/dist/*

"$tools/bin/python" -u "$check" artifacts "$work/dist" "$repo"
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' accel/__init__.py)"

echo "-- a fresh venv in $work/venv: pip install $torch_pin and the wheel"
# From outside the checkout and with no PYTHONPATH (the test commands point it at the
# checkout): what the venv imports comes from the wheel.
cd "$work/cwd"
unset PYTHONPATH
"$python" -m venv "$work/venv"
quiet_pip "$work/venv/bin/python" -m pip install --quiet "$torch_pin" \
    "$work/dist/accel_torch-$version-py3-none-any.whl"
echo "   holds: $("$work/venv/bin/python" -m pip list --format=freeze 2>/dev/null | tr '\n' ' ')"
"$work/venv/bin/python" -I -u "$check" installed "$version" "$repo"
