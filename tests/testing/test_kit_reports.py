"""What the kit tells a vendor: rows that name the hook and plugin at fault, a remedy
where there is one, and a suggestion for a misspelt promise."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import accel
from accel.testing.conformance import run
from accel.tools.cli import main
from helpers.fakes import FakeAccelerator
from helpers.registries import isolated_registry


@pytest.mark.parametrize(
    ("asked", "meant"),
    [("moves.rollbak", "moves.rollback"), ("mvoes", "moves"), ("step.compil", "step.compile")],
)
def test_a_misspelt_promise_is_an_error_suggesting_the_closest(asked: str, meant: str) -> None:
    says = rf"no promise is called '{asked}'\. Did you mean '{meant}'\?"
    with pytest.raises(ValueError, match=says):
        run("cpu", promises=[asked])


def test_the_cli_suggests_the_closest_promise(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "cpu", "--promise", "moves.rollbak"]) == 2
    assert "Did you mean 'moves.rollback'?" in capsys.readouterr().err


class RaisesInSynchronize(FakeAccelerator):
    """A synchronize that fails (the new vendor's mistake of issue 37)."""

    @accel.hookimpl
    def synchronize(self) -> bool:
        raise RuntimeError("the queue was lost\nsecond line")


BLAME = "raised in hook 'synchronize' of plugin 'fakedev'"


def _registry() -> accel.AcceleratorRegistry:
    registry = isolated_registry()
    registry.register(RaisesInSynchronize(), name="fakedev")
    return registry


def test_a_failed_row_names_the_hook_and_the_plugin() -> None:
    [outcome] = run("fake", registry=_registry(), promises=["runtime.synchronize"])
    assert outcome.outcome == "failed"
    assert outcome.reason.startswith("RuntimeError: the queue was lost; " + BLAME)
    assert "\n" not in outcome.reason


def test_the_cli_and_its_json_name_the_hook_and_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(accel, "_default_registry", _registry())
    report = tmp_path / "report.json"
    argv = ["conformance", "fake", "--promise", "runtime.synchronize", "--json", str(report)]
    status = main(argv)
    row = capsys.readouterr().out.splitlines()[0]
    assert status == 1
    assert row.startswith("failed  runtime.synchronize  RuntimeError: the queue was lost; ")
    assert BLAME in row
    [stored] = json.loads(report.read_text())
    assert set(stored) == {"promise", "outcome", "reason"}
    assert BLAME in stored["reason"]


class UntiesLikeAPrivateUse1Backend(FakeAccelerator):
    """Gives every slot a Parameter of its own, as ``Module.to`` does on XLA and every
    PrivateUse1 backend (here on the CPU, where torch's rule says nothing unties)."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        for module in model.modules():
            for name, parameter in list(module.named_parameters(recurse=False)):
                setattr(module, name, nn.Parameter(parameter.detach().clone().to(device)))
        return model


PROMISES = ["moves.ties_kept_to_device", "moves.ties_kept_back_to_cpu"]


def test_a_tie_lost_on_the_move_points_at_the_declaration_that_keeps_it() -> None:
    plugin = UntiesLikeAPrivateUse1Backend()
    outcomes = run("fake", registry=isolated_registry(plugin), promises=PROMISES)
    assert [o.outcome for o in outcomes] == ["failed", "failed"]
    for outcome in outcomes:
        assert "no longer one Parameter" in outcome.reason
        assert "AcceleratorSpec('fake', ..., unties_weights=True)" in outcome.reason
    # The remedy named is the one that works.
    plugin.spec = dataclasses.replace(plugin.spec, unties_weights=True)
    outcomes = run("fake", registry=isolated_registry(plugin), promises=["moves"])
    assert [o for o in outcomes if o.outcome != "passed"] == []
