"""Every Python block of README.md and docs/*.md runs, so the docs cannot drift from the code.

The ``doc-test`` convention (docs/contributing.md) marks what a block takes as given,
which tier it needs, and why a block is not run. Blocks run with no third-party
plugins loaded, in a fresh default registry, in a temporary directory.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.tools.cli import main as accel_main
from helpers.doc_blocks import (
    REPO,
    Block,
    as_installed,
    chains,
    doc_pages,
    masked,
    output_matches,
    parse_page,
    pycon_examples,
    sample_command,
)
from helpers.models import TiedLM

Namespace = dict[str, Any]


# -- what a block may take as given ---------------------------------------------------


class _CrossCuttingPlugin:
    """A plugin of the reader's that declares no accelerator (``MyPlugin``)."""

    @accel.hookimpl
    def pre_move_hook(self, model: torch.nn.Module) -> None:
        pass


class _VendorPlugin:
    """A vendor's accelerator, available here and moving to the CPU (``VendorPlugin``)."""

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("npu", priority=150, description="a vendor's NPU")]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")


class _BetterCudaPlugin:
    """A replacement for the built-in ``cuda`` accelerator (``MyBetterCudaPlugin``)."""

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("cuda", aliases=("gpu",), priority=100)]


def _hide_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "torch_xla" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _xla_device() -> Any:
    import torch_xla

    return torch_xla.device()


def _needs(name: str, ns: Namespace) -> Any:
    if name not in ns:
        raise LookupError(f"give {name!r} before the names built from it")
    return ns[name]


#: name -> builds it, given the names given before it. ``no_torch_xla`` is a situation:
#: torch_xla looks uninstalled.
GIVENS: dict[str, Callable[[Namespace, pytest.MonkeyPatch], Any]] = {
    "model": lambda ns, mp: TiedLM(),
    "optimizer": lambda ns, mp: torch.optim.SGD(_needs("model", ns).parameters(), lr=0.1),
    "tokens": lambda ns, mp: torch.randint(0, 16, (2, 8)),
    "mask": lambda ns, mp: torch.ones(2, 8, dtype=torch.bool),
    "batch": lambda ns, mp: {"tokens": torch.randint(0, 16, (2, 8))},
    "registry": lambda ns, mp: accel.AcceleratorRegistry(entry_points=None),
    "MyPlugin": lambda ns, mp: _CrossCuttingPlugin,
    "VendorPlugin": lambda ns, mp: _VendorPlugin,
    "MyBetterCudaPlugin": lambda ns, mp: _BetterCudaPlugin,
    "xla_device": lambda ns, mp: _xla_device(),
    "no_torch_xla": lambda ns, mp: _hide_torch_xla(mp),
    "train": lambda ns, mp: _training_loop().train,
}


def _training_loop() -> Any:
    """examples/training_loop.py, the loop docs/training.md shows."""
    spec = importlib.util.spec_from_file_location(
        "training_loop", REPO / "examples" / "training_loop.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _give(name: str, ns: Namespace, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    if name in GIVENS:
        value = GIVENS[name](ns, monkeypatch)
        if value is not None:
            ns[name] = value
        return
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name) and importlib.util.find_spec(
        name.split(".")[0]
    ):
        importlib.import_module(name)  # `given accel.distributed`: as `import accel.distributed`
        top = name.split(".")[0]
        ns[top] = importlib.import_module(top)
        return
    pytest.fail(
        f"{where}: unknown given {name!r}; known: {', '.join(GIVENS)}, or a module name. "
        f"Add it to GIVENS in tests/docs/test_docs.py"
    )


# -- collecting ---------------------------------------------------------------------


def _chain_params() -> list[Any]:
    params = []
    for path in doc_pages():
        for chain in chains(parse_page(path)):
            first = chain[0]
            marks: list[Any] = [pytest.mark.xla] if first.xla else []
            if first.skip is not None:
                marks.append(pytest.mark.skip(reason=f"{first.where}: {first.skip}"))
            params.append(pytest.param(chain, id=first.where, marks=marks))
    return params


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_doc_test_directives_are_well_formed(page: Path) -> None:
    problems = parse_page(page).problems
    assert not problems, "\n".join(problems) + "\n(see docs/contributing.md, 'Docs examples')"


@pytest.fixture
def doc_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What a reader with accel alone installed has: no third-party plugins."""
    monkeypatch.setattr(accel, "_default_registry", None)
    monkeypatch.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.chdir(tmp_path)  # blocks that save files save them here
    # PJRT_DEVICE, which a block importing torch_xla sets, is put back by conftest.


@pytest.mark.usefixtures("doc_environment")
@pytest.mark.parametrize("chain", _chain_params())
def test_doc_block_runs(chain: list[Block], monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: Namespace = {"__name__": "__doc_test__"}
    for block in chain:
        for name in block.givens:
            _give(name, namespace, monkeypatch, block.where)
        if block.language == "pycon":
            _run_pycon(block, namespace)
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(block.code, block.where, "exec"), namespace)


def _run_pycon(block: Block, namespace: Namespace) -> None:
    examples = pycon_examples(block.code)
    assert examples, f"{block.where}: a pycon block without '>>>' lines"
    for example in examples:
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(example.source, block.where, "single"), namespace)
            got = printed.getvalue()
        except Exception as exc:
            got = f"{_public_type_name(type(exc))}: {exc}"
        assert output_matches(example.expected, got), (
            f"{block.where}: >>> {example.source.strip()}\n"
            f"the page shows:\n{example.expected}\nthe code gives:\n{got}"
        )


def _public_type_name(cls: type) -> str:
    return next(k.__name__ for k in cls.__mro__ if not k.__name__.startswith("_"))


# -- sample outputs -------------------------------------------------------------------


_MAIN_TIER_ONLY = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is not None,
    reason="the sample shows the main tier's output (no torch_xla installed); it runs there",
)


def _output_params() -> list[Any]:
    params = []
    for path in doc_pages():
        for block in parse_page(path).blocks:
            if block.output:
                # The pages show a machine without torch_xla (the main tier's, on
                # torch 2.13.0 and 2.14.1: a `torch (VERSION)` sample reads the
                # installed torch) or, for XLA blocks, the XLA tier's; the oldest-torch
                # run, in the XLA env, matches neither.
                marks = [pytest.mark.xla] if block.xla else [_MAIN_TIER_ONLY]
                params.append(pytest.param(block, id=block.where, marks=marks))
    return params


@pytest.mark.parametrize("block", _output_params())
def test_sample_output_is_what_the_command_prints(
    block: Block, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``$ accel ...`` sample is what that command prints here: stderr (warnings)
    first, then stdout, as a terminal shows them. In this process, with a default
    registry of its own, unless it sets ``PJRT_DEVICE``: torch_xla's setup is once a
    process, so that one runs in a fresh interpreter."""
    environment, arguments, shown = sample_command(block)
    if block.no_plugins:
        environment = {"ACCEL_DISABLE_PLUGIN_AUTOLOAD": "1", **environment}
    if block.xla or "PJRT_DEVICE" in environment:
        got = _accel_in_a_process(arguments, environment)
    else:
        got = _accel_here(arguments, environment, monkeypatch, capsys)
    expected = masked(as_installed(block, shown, *_installed_torch()), block.vary)
    assert output_matches(expected, got), (
        f"{block.where}: the page shows:\n{shown}\n`accel {' '.join(arguments)}` prints:\n{got}"
    )


def test_torch_samples_show_the_newest_tested_torch() -> None:
    """A ``torch (VERSION)`` sample shows the torch of requirements/newest.txt, so the
    newest tier compares it as the page shows it, build-dependent lines included."""
    pinned = re.findall(
        r"^torch==(\S+)$", (REPO / "requirements" / "newest.txt").read_text(), re.MULTILINE
    )
    assert len(pinned) == 1, "requirements/newest.txt pins one torch=="
    shown = {
        block.where: block.torch
        for path in doc_pages()
        for block in parse_page(path).blocks
        if block.torch is not None
    }
    assert shown, "no sample marked torch (VERSION)"
    assert {where: v for where, v in shown.items() if v != pinned[0]} == {}, (
        f"these samples do not show torch {pinned[0]}, requirements/newest.txt's"
    )


def _installed_torch() -> tuple[str, bool]:
    """The installed torch's version as its distribution names it (``accel list`` and
    ``accel info`` show that one), and whether it is a CUDA (or ROCm) build."""
    cuda_build = torch.backends.cuda.is_built() or torch.version.hip is not None  # type: ignore[no-untyped-call]
    return importlib.metadata.version("torch"), bool(cuda_build)


def _accel_in_a_process(arguments: list[str], environment: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "PJRT_"))}
    result = subprocess.run(
        [sys.executable, "-m", "accel", *arguments],
        capture_output=True,
        text=True,
        env={**env, **environment},
        cwd=REPO,
        timeout=600,
        check=False,
    )
    return result.stderr + result.stdout


def _accel_here(
    arguments: list[str],
    environment: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """``accel ARGS`` as `python -m accel` would run it from the repository root."""
    for name in [k for k in os.environ if k.startswith(("ACCEL_", "PJRT_"))]:
        monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(accel, "_default_registry", None)
    monkeypatch.setattr(sys, "path", [str(REPO), *sys.path])  # `python -m` puts the cwd first
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    try:
        accel_main(arguments)
    except SystemExit:  # argparse: --help and usage errors
        pass
    out, err = capsys.readouterr()
    return err + out
