"""torch/torch_xla pairs: a mismatch is recognised from metadata, with the command that fixes it.

The main tier fakes the installed versions at the importlib.metadata layer; the XLA
tier checks that the real pair (torch 2.9.1 + torch_xla 2.9.0) reports no mismatch.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

import accel
from accel.plugins import _xla_versions, tpu
from helpers.fake_torch_xla import pretend_torch_xla
from helpers.registries import isolated_registry

REPO = Path(__file__).resolve().parents[2]
InstallFake = Callable[..., None]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> InstallFake:
    """Fake the metadata versions: ``installed(torch="2.13.0", torch_xla=None)``."""

    def install(**versions: str | None) -> None:
        def version(distribution: str) -> str:
            found = versions.get(distribution.replace("-", "_"))
            if found is None:
                raise importlib.metadata.PackageNotFoundError(distribution)
            return found

        monkeypatch.setattr(_xla_versions, "version", version)

    return install


@pytest.fixture
def torch_xla_that_must_not_be_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_xla looks installed and PJRT_DEVICE=CPU, but importing it fails."""
    pretend_torch_xla(monkeypatch, pjrt="CPU")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.9.0", (2, 9)),
        ("2.13.0+cpu", (2, 13)),
        ("2.10.0.dev20250101+cu121", (2, 10)),
        ("2.9.0rc1", (2, 9)),
        ("nightly", None),
    ],
)
def test_minor_of(text: str, expected: tuple[int, int] | None) -> None:
    assert _xla_versions.minor_of(text) == expected


def test_a_newer_torch_next_to_torch_xla_is_a_mismatch(installed: InstallFake) -> None:
    installed(torch="2.13.0+cpu", torch_xla="2.9.0")
    mismatch = _xla_versions.find_torch_xla_mismatch()
    assert mismatch is not None
    assert (mismatch.torch, mismatch.torch_xla) == ("2.13.0+cpu", "2.9.0")
    assert mismatch.reason == "torch_xla 2.9.0 needs torch 2.9.x, but torch 2.13.0+cpu is installed"
    assert mismatch.remedy == "pip install 'torch==2.9.*' 'torch_xla==2.9.*'"


def test_an_unsupported_torch_xla_is_moved_to_the_supported_pair(installed: InstallFake) -> None:
    installed(torch="2.9.1", torch_xla="2.10.0")
    mismatch = _xla_versions.find_torch_xla_mismatch()
    assert mismatch is not None
    assert mismatch.reason == "torch_xla 2.10.0 needs torch 2.10.x, but torch 2.9.1 is installed"
    assert mismatch.remedy == "pip install 'torch==2.9.*' 'torch_xla==2.9.*'"


@pytest.mark.parametrize(
    ("torch_version", "torch_xla_version"),
    [("2.9.1", "2.9.0"), ("2.9.1+cu121", "2.9.0+cpu"), ("2.13.0", None), (None, "2.9.0")],
)
def test_a_matching_or_incomplete_pair_is_no_mismatch(
    installed: InstallFake, torch_version: str | None, torch_xla_version: str | None
) -> None:
    installed(torch=torch_version, torch_xla=torch_xla_version)
    assert _xla_versions.find_torch_xla_mismatch() is None


def test_installing_torch_xla_keeps_a_supported_torch(installed: InstallFake) -> None:
    installed(torch="2.9.1")
    assert _xla_versions.install_torch_xla_remedy() == "pip install 'torch_xla==2.9.*'"


def test_installing_torch_xla_next_to_a_newer_torch_says_torch_changes(
    installed: InstallFake,
) -> None:
    installed(torch="2.13.0+cpu")
    remedy = _xla_versions.install_torch_xla_remedy()
    assert remedy.startswith("pip install 'torch==2.9.*' 'torch_xla==2.9.*' ")
    assert "torch 2.13.0+cpu is installed" in remedy


def test_the_probe_reports_a_mismatch_without_importing_torch_xla(
    installed: InstallFake, torch_xla_that_must_not_be_imported: None
) -> None:
    installed(torch="2.13.0+cpu", torch_xla="2.9.0")
    availability = tpu.probe_xla()
    assert not availability.available
    assert availability.reason == (
        "torch_xla 2.9.0 needs torch 2.9.x, but torch 2.13.0+cpu is installed"
    )
    assert availability.remedy == "pip install 'torch==2.9.*' 'torch_xla==2.9.*'"
    registry = isolated_registry()
    with pytest.raises(accel.AcceleratorUnavailableError) as caught:
        registry.get_accelerator("tpu")
    assert "pip install 'torch==2.9.*' 'torch_xla==2.9.*'" in str(caught.value)


def test_the_probe_of_a_matching_pair_goes_on_to_import_it(
    installed: InstallFake, torch_xla_that_must_not_be_imported: None
) -> None:
    installed(torch="2.9.1", torch_xla="2.9.0")
    availability = tpu.probe_xla()  # gets as far as the (failing) import
    assert not availability.available
    assert availability.reason.startswith("importing torch_xla failed: ")
    assert availability.remedy == "pip install --force-reinstall 'torch==2.9.*' 'torch_xla==2.9.*'"


def test_no_remedy_is_the_name_taken_on_pypi(installed: InstallFake) -> None:
    """``pip install 'accel[tpu]'`` installs an unrelated package: never suggest it."""
    for torch_version in ("2.9.1", "2.13.0"):
        installed(torch=torch_version)
        assert "accel[" not in _xla_versions.install_torch_xla_remedy()
        assert "accel[" not in _xla_versions.reinstall_torch_xla_remedy()


def test_the_tpu_extra_pins_the_supported_pair() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == _xla_versions.DISTRIBUTION
    supported = _xla_versions.SUPPORTED_XLA_MINORS
    low, high = min(supported), max(supported)
    bounds = f">={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"
    extra = sorted(project["optional-dependencies"]["tpu"])
    assert extra == [f"torch{bounds}", f"torch_xla{bounds}"]


@pytest.mark.xla
def test_the_real_pair_is_no_mismatch() -> None:
    assert importlib.metadata.version("torch_xla").startswith("2.9.")
    assert _xla_versions.find_torch_xla_mismatch() is None
    assert tpu.probe_xla().available
