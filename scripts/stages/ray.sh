#!/usr/bin/env bash
# The Ray Train stage: accel.integrations.ray under a real local Ray cluster.
#   bash scripts/stages/ray.sh [PYTEST_ARGS...]     (or: bash scripts/test ray)
# Two runs of the tests marked `ray`, each starting its own local cluster (2 CPUs, no
# dashboard):
#   - torch 2.13 + Ray Train on the CPU (requirements/ray.txt, its own environment, so
#     that the main tier never pays for Ray): two workers over gloo, on `cpu` and on a
#     vendor's plugin, recovery from a killed worker, bad input, the errors table's rows;
#   - torch 2.9.1 + torch_xla 2.9.0 + Ray (requirements/xla.txt, the XLA tier's
#     environment, which has Ray too) on XLA:CPU: one worker, a tied model.
# About 3 minutes on 2 idle cores; every trainer run is bounded (tests/helpers/ray_training.py),
# and each pytest run by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this tree's accel, in Ray's workers too

quiet_pip() {
    # pip warns about this machine's unused local index locations; keep the log readable.
    "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

prepare() {
    # As scripts/test does: accel editable, and the example plugin really installed.
    local env="$1"
    echo "-- installing accel and examples/accel-example-plugin into $env"
    quiet_pip "$env/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
    quiet_pip "$env/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
        -e examples/accel-example-plugin
}

run() {
    local label="$1" env="$2"
    shift 2
    echo "-- pytest: $label"
    local status=0
    timeout 1800 "$env/bin/python" -m pytest -p no:cacheprovider "$@" || status=$?
    if [[ $status -eq 5 ]]; then
        echo "error: the $label run collected no tests (pytest exit 5); that is a failure" >&2
        exit 1
    elif [[ $status -ne 0 ]]; then
        echo "error: the $label run failed (exit $status; 124: timed out)" >&2
        exit "$status"
    fi
}

ray_env="$(scripts/ensure-env requirements/ray.txt)"
xla_env="$(scripts/ensure-env requirements/xla.txt)"
prepare "$ray_env"
prepare "$xla_env"

(unset PJRT_DEVICE; export ACCEL_TIER=main
    run "Ray Train (torch 2.13, CPU)" "$ray_env" -m "ray and not xla" \
        tests/integrations/test_ray.py tests/docs/test_errors_table.py "$@")
(export PJRT_DEVICE=CPU ACCEL_TIER=xla
    run "Ray Train on XLA:CPU (torch 2.9.1 + torch_xla 2.9.0)" "$xla_env" -m "ray and xla" \
        tests/integrations/test_ray_xla.py "$@")
