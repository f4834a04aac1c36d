"""torch-opencl and torch-nntile with no accel plugin loaded (ACCEL_DISABLE_PLUGIN_AUTOLOAD=1):
the device torch runs is an accelerator named by its device type, `accel list` shows it
with "no plugin (torch)" as its provider, and a tied model goes there and back tied. Runs
in `bash scripts/test devices`, in each env on the backend that env has (the vendor
plugin is installed there, so switching autoload off is what keeps it out)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import accel
from helpers.real_devices import (
    assert_same_values,
    assert_tied_and_followed,
    fixed_gradients,
    tied_model,
)

# The backend this env has: the opencl env has no torch-nntile and the nntile env no
# torch-opencl (elsewhere the marker skips the file, naming the stage that runs it).
NAME = "nntile" if importlib.util.find_spec("torch_nntile") is not None else "opencl"
pytestmark = pytest.mark.devices(NAME)

# What a user of torch-nntile runs first: it has no torch backend autoload (torch-opencl
# has, so importing torch is enough there).
USER_SETUP = {
    "nntile": "import torch_nntile; torch_nntile.init_context()\n",
    "opencl": "",
}[NAME]


def _set_up_backend() -> None:
    if NAME != "nntile":
        return
    import torch_nntile

    try:
        torch_nntile.init_context()
    except RuntimeError as exc:  # configured once per process, by whoever came first
        if "already locked" not in str(exc):
            raise


@pytest.fixture(scope="module")
def registry() -> accel.AcceleratorRegistry:
    """A registry as a process with ACCEL_DISABLE_PLUGIN_AUTOLOAD=1 builds it."""
    _set_up_backend()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "1")
        registry = accel.AcceleratorRegistry()
        registry.list_accelerators()  # loads now: each test's clean environment unsets it
    return registry


def run_accel(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``accel ARGUMENTS`` as a user runs it, with the vendor plugin switched off."""
    code = USER_SETUP + (
        f"import sys\nfrom accel.tools.cli import main\nsys.exit(main({list(arguments)!r}))\n"
    )
    env = {**os.environ, "ACCEL_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_device_is_selectable_by_its_name_without_its_plugin(
    registry: accel.AcceleratorRegistry,
) -> None:
    (info,) = [info for info in registry.list_accelerators() if info.name == NAME]
    assert info.provider == "no plugin (torch)", f"{NAME} answered by {info.provider!r}"
    assert info.available, info.reason
    acc = registry.get_accelerator(NAME)
    assert acc.device == torch.device(NAME, 0)
    assert registry.get_accelerator(f"{NAME}:0").device == torch.device(NAME, 0)


def test_accel_list_shows_it_with_no_plugin_as_its_provider() -> None:
    done = run_accel("list")
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.split()[:1] == [NAME]]
    assert "no plugin (torch)" in row, row
    assert f"accel-{NAME}-plugin" not in done.stdout, "the vendor plugin was loaded"


def test_a_tied_model_goes_there_and_back_tied_with_its_optimizer(
    registry: accel.AcceleratorRegistry,
) -> None:
    acc = registry.get_accelerator(NAME)
    cpu = registry.get_accelerator("cpu")
    reference = tied_model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, foreach=False)
    model = tied_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)

    model = acc.model_to_device(model, optimizer=optimizer)
    assert model.emb.weight.device.type == NAME
    assert_tied_and_followed(model, optimizer)
    # Gradients set by hand: torch-opencl has no forward pass (no matmul).
    for number in range(2):
        for module, opt, on in ((model, optimizer, acc), (reference, reference_optimizer, cpu)):
            fixed_gradients(module, number)
            on.optimizer_step(opt)
    assert_same_values(reference, model)

    back = cpu.model_to_device(model, optimizer=optimizer)
    assert back.emb.weight.device.type == "cpu"
    assert_tied_and_followed(back, optimizer)
    assert_same_values(reference, back)


def test_a_batch_with_a_transposed_view_moves(registry: accel.AcceleratorRegistry) -> None:
    # torch-opencl copies only contiguous host tensors ("src must be contiguous").
    acc = registry.get_accelerator(NAME)
    view = torch.arange(6.0).reshape(2, 3).t()
    batch = acc.batch_to_device({"x": view, "y": [view, torch.ones(2)]})
    assert batch["x"].device.type == NAME
    assert batch["y"][0] is batch["x"], "a tensor twice in the batch came out as two"
    assert torch.equal(batch["x"].to("cpu"), view)


def test_autocast_is_refused_with_a_clear_error(registry: accel.AcceleratorRegistry) -> None:
    # torch-nntile's module names float16 and bfloat16 for autocast but the device makes
    # neither; torch-opencl's names none. A float16 GradScaler would fail at its first step.
    acc = registry.get_accelerator(NAME)
    with pytest.raises(accel.AcceleratorValueError, match=f"'{NAME}' cannot autocast"):
        acc.autocast(dtype=torch.float16)
    with pytest.raises(accel.AcceleratorValueError, match="cannot autocast"):
        acc.grad_scaler(torch.float16)


if NAME == "nntile":  # torch-opencl has no reductions: no norm to clip by

    def test_clip_grad_norm_runs_where_the_backend_lacks_an_operator(
        registry: accel.AcceleratorRegistry,
    ) -> None:
        # torch's clip_grad_norm_ divides on the device, and torch-nntile has no reciprocal.
        acc = registry.get_accelerator(NAME)
        model = acc.model_to_device(torch.nn.Linear(3, 2))
        for parameter in model.parameters():
            parameter.grad = torch.full(parameter.shape, 3.0).to(acc.device)
        norm = acc.clip_grad_norm_(model.parameters(), max_norm=1.0)
        expected = 3.0 * 8**0.5
        assert abs(float(norm.to("cpu")) - expected) < 1e-4
        for parameter in model.parameters():
            assert parameter.grad is not None
            got = parameter.grad.to("cpu")
            assert torch.allclose(got, torch.full_like(got, 3.0 / expected), atol=1e-6)
