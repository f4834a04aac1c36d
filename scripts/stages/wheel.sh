#!/usr/bin/env bash
# The wheel stage: the release as a user gets it.   (or: bash scripts/test wheel)
#   bash scripts/stages/wheel.sh
# Builds the sdist and, from it, the wheel (python -m build, with the pinned build
# backend of requirements/wheel.txt, no isolated build env), checks their metadata
# (twine check --strict) and their files (scripts/stages/wheel_check.py artifacts),
# then installs the wheel into a fresh venv in a temporary folder as a user runs
# `pip install accel-torch`, torch unpinned: pip picks the newest torch it finds, and
# the check fails unless that is at least requirements/newest.txt's (2.14.1, PyPI's
# CUDA build). From a temporary working directory with no checkout on sys.path, it runs
# `accel --version`, `accel list`, `accel demo --steps 2` and imports every public
# module the installed wheel holds (wheel_check.py installed).
# About 1 minute on 2 idle cores, nearer 2 on a busy machine: pip unpacking torch and
# its NVIDIA libraries into the venv (pip's cache keeps the download), three processes
# that import torch, and removing the venv (about 5 GB) after.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"
python="${ACCEL_TEST_PYTHON:-python3}"
check="$repo/scripts/stages/wheel_check.py"

quiet_pip() {
    # pip warns about this machine's unused local index locations; keep the log readable.
    "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# The newest torch the tests run (the newest tier's): an unpinned install gets it or newer.
newest_torch="$(sed -n 's/^torch==//p' requirements/newest.txt)"
[[ -n "$newest_torch" ]] || { echo "error: requirements/newest.txt pins no torch==" >&2; exit 1; }

tools="$(scripts/ensure-env requirements/wheel.txt)"
work="$(mktemp -d "${TMPDIR:-/tmp}/accel-wheel-stage.XXXXXX")"
cleanup() {
    local start=$SECONDS
    rm -rf "$work"
    echo "-- removed $work ($((SECONDS - start)) s)"
}
trap cleanup EXIT
mkdir "$work/cwd"
phase_start=$SECONDS
took() { echo "   ($(($SECONDS - phase_start)) s)"; phase_start=$SECONDS; }

echo "-- python -m build: the sdist, then the wheel from the sdist"
"$tools/bin/python" -u -m build --no-isolation --outdir "$work/dist" "$repo"

echo "-- twine check --strict"
"$tools/bin/twine" --no-color check --strict "$work"/dist/*

"$tools/bin/python" -u "$check" artifacts "$work/dist" "$repo"
took
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' accel/__init__.py)"

echo "-- a fresh venv in $work/venv: pip install the wheel, torch unpinned (pip install accel-torch)"
# From outside the checkout and with no PYTHONPATH (the test commands point it at the
# checkout): what the venv imports comes from the wheel. --no-compile: byte-compiling
# all of torch would take longer than the checks (imports compile what they load).
# The venv gets no pip of its own: the tools env's pip installs into it (--python).
cd "$work/cwd"
unset PYTHONPATH
"$python" -m venv --without-pip "$work/venv"
venv_pip=("$tools/bin/python" -m pip --python "$work/venv/bin/python")
quiet_pip "${venv_pip[@]}" install --quiet --no-compile \
    "$work/dist/accel_torch-$version-py3-none-any.whl"
took
echo "   holds: $("${venv_pip[@]}" list --format=freeze 2>/dev/null | tr '\n' ' ')"
"$work/venv/bin/python" -I -u "$check" installed "$version" "$repo" "$newest_torch"
took
