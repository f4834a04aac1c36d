#!/usr/bin/env bash
# The devices stage: accel on two real third-party PrivateUse1 backends nobody here wrote,
# each through a vendor's plugin package really installed (an `accel` entry point):
#   bash scripts/stages/devices.sh [PYTEST_ARGS...]     (or: bash scripts/test devices)
#   - opencl: torch 2.11.0 + torch-opencl 0.1.0.dev23 on pocl's CPU OpenCL driver
#     (requirements/opencl.txt, CPython 3.11; pocl-opencl-icd installed with apt-get
#     where missing, as root), plugin examples/accel-opencl-plugin;
#   - nntile: torch 2.9.1 + torch-nntile 0.1.0 on StarPU's CPU workers
#     (requirements/nntile.txt, CPython 3.12: the one wheel torch-nntile has), plugin
#     examples/accel-nntile-plugin.
# In each env: accel's conformance kit on the device (`accel conformance NAME`: every
# promise the device can keep holds, what its plugin declares it cannot do is skipped and
# listed), then the stage's own tests (pytest marker `devices`, tests/devices). Then the
# same with the vendor plugin switched off (ACCEL_DISABLE_PLUGIN_AUTOLOAD=1): accel's
# stand-in for a device type torch drives ("no plugin (torch)") keeps every promise the
# plugin keeps, under the same declared limits (the plugin package's limits module is
# importable with autoload off), and tests/devices/test_without_a_plugin.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this tree's accel, in child processes too

quiet_pip() {
    # pip warns about this machine's unused local index locations; keep the log readable.
    "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

python_for() {
    # python_for 3.12: the path of a CPython of that version (on PATH, or under pyenv).
    local version="$1" candidate
    for candidate in "python$version" "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/"$version".*/bin/python"$version"; do
        if "$candidate" -c 'import sys; sys.exit(sys.version[:len(sys.argv[1]) + 1] != sys.argv[1] + ".")' \
            "$version" >/dev/null 2>&1; then
            "$candidate" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    echo "error: the devices stage needs CPython $version (python$version on PATH, or under pyenv)" >&2
    return 1
}

# -- an OpenCL platform for torch-opencl: pocl's CPU driver ------------------------------

has_opencl_driver() {
    # An ICD file names its driver's library; a removed package can leave the file behind
    # (apt-get remove keeps /etc/OpenCL/vendors/pocl.icd), so the library must be there too.
    local icd library
    for icd in /etc/OpenCL/vendors/*.icd; do
        [[ -f "$icd" ]] || continue
        library="$(head -n1 "$icd")"
        if [[ "$library" == /* ]]; then
            [[ -e "$library" ]] && return 0
        elif ldconfig -p | grep -qF "$library"; then
            return 0
        fi
    done
    return 1
}

if ! has_opencl_driver; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "error: torch-opencl needs an OpenCL driver; as root run:" >&2
        echo "  apt-get update && apt-get install -y pocl-opencl-icd" >&2
        exit 1
    fi
    echo "== installing pocl-opencl-icd (apt-get)"
    # A fresh machine may have no package lists yet: fetch them only then.
    if ! apt-cache policy pocl-opencl-icd 2>/dev/null | grep -q "Candidate: [0-9]"; then
        apt-get update -qq
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd >/dev/null
fi

# -- the two environments, accel and each vendor's plugin installed ---------------------

python311="$(python_for 3.11)"
python312="$(python_for 3.12)"
opencl_env="$(ACCEL_TEST_PYTHON="$python311" scripts/ensure-env requirements/opencl.txt)"
nntile_env="$(ACCEL_TEST_PYTHON="$python312" scripts/ensure-env requirements/nntile.txt)"

prepare() {
    local env="$1" plugin="$2"
    echo "-- installing accel and $plugin into $env"
    quiet_pip "$env/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
    quiet_pip "$env/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$plugin"
}
prepare "$opencl_env" examples/accel-opencl-plugin
prepare "$nntile_env" examples/accel-nntile-plugin

# StarPU keeps its calibration under ~/.starpu unless told otherwise; a run keeps its own.
STARPU_HOME="$(mktemp -d)"
# The kit's JSON reports: kept in $ACCEL_DEVICES_REPORTS where set, else thrown away.
if [[ -n ${ACCEL_DEVICES_REPORTS:-} ]]; then
    reports="$ACCEL_DEVICES_REPORTS"
    mkdir -p "$reports"
    trap 'rm -rf "$STARPU_HOME"' EXIT
else
    reports="$(mktemp -d)"
    trap 'rm -rf "$STARPU_HOME" "$reports"' EXIT
fi
export STARPU_HOME STARPU_SILENT=1 ACCEL_TIER=devices
unset PJRT_DEVICE ACCEL_ACCELERATOR ACCEL_PLUGINS ACCEL_DISABLE_PLUGIN_AUTOLOAD

fail() {
    echo "error: $1" >&2
    exit 1
}

phase_start=$SECONDS
took() { echo "   ($((SECONDS - phase_start)) s)"; phase_start=$SECONDS; }

run_device() {
    local name="$1" env="$2"
    shift 2
    echo "-- $name: accel info $name"
    "$env/bin/python" -m accel info "$name" || fail "accel info $name failed"
    took
    # What the device cannot do is declared in its plugin package, next to its hooks.
    local limits="accel_${name}_plugin.conformance:LIMITS"
    echo "-- $name: the conformance kit (accel conformance $name --limits $limits)"
    local status=0
    timeout 900 "$env/bin/python" -m accel conformance "$name" --limits "$limits" \
        --json "$reports/$name.json" || status=$?
    [[ $status -eq 0 ]] || fail "the conformance kit failed on $name (exit $status; 124: timed out)"
    took
    echo "-- $name: pytest -m devices tests/devices/test_$name.py"
    status=0
    timeout 900 "$env/bin/python" -m pytest -p no:cacheprovider -m devices \
        "tests/devices/test_$name.py" "$@" || status=$?
    if [[ $status -eq 5 ]]; then
        fail "the $name device tests collected no tests (pytest exit 5); that is a failure"
    fi
    [[ $status -eq 0 ]] || fail "the $name device tests failed (exit $status; 124: timed out)"
    took
}

run_without_plugin() {
    # run_without_plugin NAME ENV SETUP [PYTEST_ARGS...]: SETUP is the Python a user runs
    # before using accel on the device (torch-nntile has no backend autoload: the user
    # imports it and starts its context; torch-opencl loads with torch, so nothing).
    local name="$1" env="$2" setup="$3"
    shift 3
    local limits="accel_${name}_plugin.conformance:LIMITS"
    echo "-- $name without its plugin: the conformance kit (ACCEL_DISABLE_PLUGIN_AUTOLOAD=1, the same --limits $limits)"
    local status=0
    ACCEL_DISABLE_PLUGIN_AUTOLOAD=1 timeout 900 "$env/bin/python" -c "$setup
import sys
from accel.tools.cli import main
sys.exit(main(sys.argv[1:]))" conformance "$name" --limits "$limits" \
        --json "$reports/$name-no-plugin.json" || status=$?
    [[ $status -eq 0 ]] ||
        fail "the conformance kit failed on $name without its plugin (exit $status; 124: timed out)"
    took
    echo "-- $name without its plugin: pytest -m devices tests/devices/test_without_a_plugin.py"
    status=0
    timeout 900 "$env/bin/python" -m pytest -p no:cacheprovider -m devices \
        tests/devices/test_without_a_plugin.py "$@" || status=$?
    if [[ $status -eq 5 ]]; then
        fail "the $name tests without a plugin collected no tests (pytest exit 5); that is a failure"
    fi
    [[ $status -eq 0 ]] || fail "the $name tests without a plugin failed (exit $status; 124: timed out)"
    took
}

run_device opencl "$opencl_env" "$@"
run_without_plugin opencl "$opencl_env" "" "$@"
run_device nntile "$nntile_env" "$@"
run_without_plugin nntile "$nntile_env" "import torch_nntile; torch_nntile.init_context()" "$@"
