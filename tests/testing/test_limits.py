"""The declaration of what a device cannot do: one field per capability, with a reason."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import accel
from accel.testing.conformance import Limits, all_promises
from accel.testing.conformance._limits import CAPABILITIES, load_limits


def test_every_capability_is_a_field_and_some_promise_needs_it() -> None:
    assert set(Limits().__dataclass_fields__) == set(CAPABILITIES)
    needed = {need for promise in all_promises() for need in promise.needs}
    assert needed == set(CAPABILITIES)


def test_a_misspelt_capability_is_refused_when_the_declaration_is_built() -> None:
    with pytest.raises(accel.AcceleratorTypeError) as caught:
        Limits(foward="no kernels yet")  # type: ignore[call-arg]
    message = str(caught.value)
    assert "Limits() got an unknown capability 'foward'" in message
    assert "Did you mean 'forward'?" in message
    assert "The capabilities: forward, reductions, random" in message
    # Still the TypeError Python raises for an unknown keyword, and far from every name.
    with pytest.raises(TypeError, match=r"unknown capability 'matmul'\. The capabilities"):
        Limits(matmul="no kernel")  # type: ignore[call-arg]
    with pytest.raises(accel.AcceleratorTypeError, match=r"unknown capability 'randm'"):
        dataclasses.replace(Limits(), randm="no generator")  # type: ignore[call-arg]
    assert Limits("no kernels").forward == "no kernels"  # positional still works


def test_a_limit_needs_a_reason() -> None:
    with pytest.raises(accel.AcceleratorValueError, match=r"Limits.forward is declared without"):
        Limits(forward="  ")
    with pytest.raises(accel.AcceleratorTypeError, match=r"Limits.compile must be the reason"):
        Limits(compile=True)  # type: ignore[arg-type]


def test_declared_lists_what_was_declared_and_reason_asks_one() -> None:
    limits = Limits(random="no generator on the device")
    assert limits.declared() == {"random": "no generator on the device"}
    assert limits.reason("random") == "no generator on the device"
    assert limits.reason("forward") is None
    with pytest.raises(accel.AcceleratorValueError, match=r"no capability is called 'fwd'"):
        limits.reason("fwd")


def test_load_limits_finds_the_object_and_refuses_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "vendor_limits.py").write_text(
        "from accel.testing.conformance import Limits\n"
        "LIMITS = Limits(compile='no backend')\nNOT_LIMITS = {'compile': 'x'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vendor_limits", raising=False)
    assert load_limits("vendor_limits:LIMITS") == Limits(compile="no backend")
    with pytest.raises(accel.AcceleratorValueError, match=r"expected MODULE:ATTRIBUTE"):
        load_limits("vendor_limits")
    with pytest.raises(accel.AcceleratorValueError, match=r"cannot import 'no_such_module'"):
        load_limits("no_such_module:LIMITS")
    with pytest.raises(accel.AcceleratorValueError, match=r"has no attribute 'MISSING'"):
        load_limits("vendor_limits:MISSING")
    with pytest.raises(accel.AcceleratorTypeError, match=r"is a dict, not an"):
        load_limits("vendor_limits:NOT_LIMITS")
