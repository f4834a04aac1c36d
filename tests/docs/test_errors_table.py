"""Every row of docs/errors.md, triggered: the bad input, the exception type, the message.

The page is the source of truth for the message fragments: each case here only knows
how to trigger its bad input and which exception (or warning) it expects, and reads the
fragments to look for from the row with the same ID. A row without a case, or a case
without a row, fails; so does a "Known gaps" entry that is not an expected failure here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
import tempfile
import textwrap
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import accel
import accel.distributed
import accel.distributed._launchers as launchers
from accel.distributed import DistributedSetupError
from accel.plugins import tpu
from accel.training.checkpoint import _early_signals as early_signals
from accel.training.checkpoint._rank_generators import RECORD_KEY
from helpers.fake_torch_xla import pretend_torch_xla
from helpers.fakes import MetaTpuPlugin
from helpers.installing import write_distribution
from helpers.models import TiedLM, UntiesOnPurpose
from helpers.registries import isolated_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
COLUMNS = ["ID", "Bad input", "Error", "Message says"]
SLUG = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
CODE_SPAN = re.compile(r"`([^`]+)`")
NOT_AN_ERROR = "—"
ENTRY_POINT_GROUP = "accel-errors-table"


# -- the page ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    bad_input: str
    error: str
    message: str

    @property
    def is_error(self) -> bool:
        return not self.error.startswith(NOT_AN_ERROR)

    @property
    def error_type(self) -> str | None:
        """The exception (or warning) class the row documents, by name."""
        if not self.is_error:
            return None
        spans = CODE_SPAN.findall(self.error)
        return spans[0] if spans else None

    @property
    def fragments(self) -> list[str]:
        """The quoted parts of *Message says*, each expected verbatim."""
        return CODE_SPAN.findall(self.message)


def _cells(line: str) -> list[str]:
    assert "\\|" not in line, f"escaped pipes are not supported in docs/errors.md: {line}"
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def doc_rows() -> dict[str, Row]:
    lines = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    assert lines, "docs/errors.md has no table"
    assert _cells(lines[0]) == COLUMNS, f"table header is {_cells(lines[0])}, not {COLUMNS}"
    assert set(lines[1]) <= set("|-: "), "the second table line must be the separator"
    rows: dict[str, Row] = {}
    for line in lines[2:]:
        cells = _cells(line)
        assert len(cells) == len(COLUMNS), f"row does not have {len(COLUMNS)} cells: {line}"
        row = Row(cells[0].strip("`"), *cells[1:])
        assert row.id not in rows, f"ID {row.id!r} appears twice in docs/errors.md"
        rows[row.id] = row
    return rows


def doc_known_gaps() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    _, found, section = text.partition("\n## Known gaps\n")
    assert found, "docs/errors.md has no '## Known gaps' section"
    section = section.split("\n## ", 1)[0]
    return set(re.findall(r"^- `([a-z0-9-]+)`", section, flags=re.MULTILINE))


# -- the cases ---------------------------------------------------------------------


Trigger = Callable[[pytest.MonkeyPatch], object]


@dataclass(frozen=True)
class Case:
    id: str
    trigger: Trigger
    #: The exception or warning class expected; None: accepted, not an error.
    expected: type[BaseException] | None
    #: Why accel does not behave as documented yet (an expected failure until fixed).
    bug: str | None = None
    #: Some fragments live in exception notes, which exist from Python 3.11.
    needs_notes: bool = False
    #: Needs Ray Train installed: runs in `bash scripts/test ray` (marker ``ray``).
    needs_ray: bool = False


CASES: dict[str, Case] = {}


def case(
    case_id: str,
    expected: type[BaseException] | None,
    *,
    bug: str | None = None,
    needs_notes: bool = False,
    needs_ray: bool = False,
) -> Callable[[Trigger], Trigger]:
    def register(trigger: Trigger) -> Trigger:
        assert case_id not in CASES, f"two cases named {case_id!r}"
        CASES[case_id] = Case(case_id, trigger, expected, bug, needs_notes, needs_ray)
        return trigger

    return register


def _raise(exc: BaseException) -> Any:
    raise exc


def _plugin(name: str = "npu", **hooks: Callable[..., Any] | None) -> object:
    """An accelerator plugin declaring ``name``, available, one device, moving to the CPU.

    Each keyword replaces one hook implementation (``self`` first); ``None`` leaves the
    hook out.
    """
    defaults: dict[str, Callable[..., Any] | None] = {
        "register_accelerators": lambda self: [accel.AcceleratorSpec(name)],
        "is_available": lambda self: accel.Availability(True),
        "get_device": lambda self: torch.device("cpu"),
    }
    methods = {
        hook: accel.hookimpl(function)
        for hook, function in {**defaults, **hooks}.items()
        if function is not None
    }
    return type("NpuPlugin", (), methods)()


def _without_cuda_or_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the built-in GPU plugins see a torch build with neither CUDA nor MPS."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)


def _entry_point_registry(
    monkeypatch: pytest.MonkeyPatch, *entry_points: importlib.metadata.EntryPoint
) -> accel.AcceleratorRegistry:
    """A registry loading only ``entry_points``, from a group of this module's own."""
    real = importlib.metadata.entry_points

    def fake(**params: Any) -> Any:
        if params.get("group") == ENTRY_POINT_GROUP:
            return list(entry_points)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    return accel.AcceleratorRegistry(entry_points=ENTRY_POINT_GROUP)


def _fake_entry_point() -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint("fake", "helpers.fakes:FakeAccelerator", ENTRY_POINT_GROUP)


def _broken_entry_point() -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(
        "broken", "accel_errors_table_no_such_module:Plugin", ENTRY_POINT_GROUP
    )


def _torch_xla(monkeypatch: pytest.MonkeyPatch, *, installed: bool, pjrt: str | None) -> None:
    pretend_torch_xla(monkeypatch, installed=installed, pjrt=pjrt)


def _listed(registry: accel.AcceleratorRegistry, name: str) -> accel.AcceleratorInfo:
    return {info.name: info for info in registry.list_accelerators()}[name]


# Names ---------------------------------------------------------------------------


@case("name-unknown", accel.AcceleratorNotFoundError)
def _name_unknown(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("quantum")


@case("name-typo", accel.AcceleratorNotFoundError)
def _name_typo(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cdua")


@case("name-lookalike", accel.AcceleratorNotFoundError)
def _name_lookalike(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("c\u0440u")  # a Cyrillic er in the middle


@case("name-full-width", None)
def _name_full_width(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry().get_accelerator("\uff43\uff50\uff55")  # NFKC: the letters 'cpu'
    assert acc.name == "cpu"
    return acc


@case("name-empty", accel.AcceleratorValueError)
def _name_empty(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("")


@case("name-whitespace", accel.AcceleratorValueError)
def _name_whitespace(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("   ")


@case("name-none", None)
def _name_none(mp: pytest.MonkeyPatch) -> object:
    registry = isolated_registry()
    assert registry.get_accelerator(None).name == registry.get_accelerator("auto").name
    mp.setenv("ACCEL_ACCELERATOR", "cpu")
    assert registry.get_accelerator(None).name == "cpu"
    return None


@case("name-int", accel.AcceleratorTypeError)
def _name_int(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator(0)  # type: ignore[arg-type]


@case("handle-of-another-registry", accel.AcceleratorValueError)
def _handle_of_another_registry(mp: pytest.MonkeyPatch) -> object:
    handle = isolated_registry().get_accelerator("cpu")
    return isolated_registry().get_accelerator(handle)


@case("name-bytes", accel.AcceleratorTypeError)
def _name_bytes(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator(b"cpu")  # type: ignore[arg-type]


@case("name-torch-device", accel.AcceleratorTypeError)
def _name_torch_device(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator(torch.device("cuda", 1))  # type: ignore[arg-type]


@case("name-unavailable", accel.AcceleratorUnavailableError)
def _name_unavailable(mp: pytest.MonkeyPatch) -> object:
    _without_cuda_or_mps(mp)
    return isolated_registry().get_accelerator("cuda")


@case("name-gpu-unavailable", accel.AcceleratorUnavailableError)
def _name_gpu_unavailable(mp: pytest.MonkeyPatch) -> object:
    _without_cuda_or_mps(mp)
    return isolated_registry().get_accelerator("gpu")


@case("name-auto-none-available", accel.AcceleratorUnavailableError)
def _name_auto_none_available(mp: pytest.MonkeyPatch) -> object:
    unavailable = _plugin(is_available=lambda self: accel.Availability(False, reason="no chip"))
    return isolated_registry(unavailable, builtins=False).get_accelerator("auto")


# Device indices ------------------------------------------------------------------


@case("index-beyond-count", accel.AcceleratorUnavailableError)
def _index_beyond_count(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu:1")


@case("index-not-a-number", accel.AcceleratorValueError)
def _index_not_a_number(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu:x")


@case("index-negative", accel.AcceleratorValueError)
def _index_negative(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu:-1")


@case("index-missing", accel.AcceleratorValueError)
def _index_missing(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu:")


@case("index-twice", accel.AcceleratorValueError)
def _index_twice(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu:0:1")


@case("index-non-ascii-digit", accel.AcceleratorValueError)
def _index_non_ascii_digit(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu:²")


@case("index-on-auto", accel.AcceleratorValueError)
def _index_on_auto(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("auto:0")


# Environment variables -----------------------------------------------------------


@case("env-unknown", accel.AcceleratorNotFoundError)
def _env_unknown(mp: pytest.MonkeyPatch) -> object:
    mp.setenv("ACCEL_ACCELERATOR", "quantum")
    return isolated_registry().get_accelerator()


@case("env-malformed", accel.AcceleratorValueError)
def _env_malformed(mp: pytest.MonkeyPatch) -> object:
    mp.setenv("ACCEL_ACCELERATOR", "cpu:x")
    return isolated_registry().get_accelerator()


@case("env-early-signals-bad-value", accel.PluginWarning)
def _env_early_signals_bad_value(mp: pytest.MonkeyPatch) -> object:
    mp.setattr(early_signals, "_WARNED", set())  # each bad value warns once a process
    mp.setenv("ACCEL_EARLY_SIGNALS", "maybe")
    acc = isolated_registry().get_accelerator("cpu")  # read as unset: selection goes on
    assert acc.name == "cpu"
    return None


@case("env-index-beyond-count", accel.AcceleratorUnavailableError)
def _env_index_beyond_count(mp: pytest.MonkeyPatch) -> object:
    mp.setenv("ACCEL_ACCELERATOR", "cpu:3")
    return isolated_registry().get_accelerator()


@case("env-unavailable", accel.AcceleratorUnavailableError)
def _env_unavailable(mp: pytest.MonkeyPatch) -> object:
    _without_cuda_or_mps(mp)
    mp.setenv("ACCEL_ACCELERATOR", "cuda")
    return isolated_registry().get_accelerator()


@case("env-blank", None)
def _env_blank(mp: pytest.MonkeyPatch) -> object:
    registry = isolated_registry()
    auto = registry.get_accelerator("auto").name
    mp.setenv("ACCEL_ACCELERATOR", "  ")
    assert registry.get_accelerator().name == auto
    return None


@case("env-plugins-unknown", accel.PluginWarning)
def _env_plugins_unknown(mp: pytest.MonkeyPatch) -> object:
    assert "fake" in _entry_point_registry(mp, _fake_entry_point()).names()
    mp.setenv("ACCEL_PLUGINS", "nothing-installed")
    registry = _entry_point_registry(mp, _fake_entry_point())
    names = registry.names()  # warns: the allow-list matches nothing installed
    assert "fake" not in names
    assert {"cpu", "cuda", "mps", "tpu"} <= set(names)
    assert registry.plugin_failures() == []
    return None


@case("env-autoload-bad-value", accel.PluginWarning)
def _env_autoload_bad_value(mp: pytest.MonkeyPatch) -> object:
    mp.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert "fake" not in _entry_point_registry(mp, _fake_entry_point()).names()
    mp.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "maybe")
    assert "fake" in _entry_point_registry(mp, _fake_entry_point()).names()  # and warns
    return None


@case("env-autoload-off", None)
def _env_autoload_off(mp: pytest.MonkeyPatch) -> object:
    for value in ("0", "false", "No", " off ", ""):
        mp.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", value)
        assert "fake" in _entry_point_registry(mp, _fake_entry_point()).names()
    return None


@case("env-plugins-separators", accel.PluginWarning)
def _env_plugins_separators(mp: pytest.MonkeyPatch) -> object:
    mp.setenv("ACCEL_PLUGINS", " , ")
    names = _entry_point_registry(mp, _fake_entry_point()).names()
    assert "fake" not in names and "cpu" in names
    return names


@case("env-auto-index", accel.AcceleratorValueError)
def _env_auto_index(mp: pytest.MonkeyPatch) -> object:
    mp.setenv("ACCEL_ACCELERATOR", "auto:0")
    return isolated_registry().get_accelerator()


# Arguments -----------------------------------------------------------------------


def _stepping() -> tuple[accel.Accelerator, nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(2, 2)
    return (
        isolated_registry().get_accelerator("cpu"),
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
    )


@case("step-autocast-float32", None)
def _step_autocast_float32(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, model, _ = _stepping()
    full = (cpu.autocast(torch.float32), cpu.autocast("fp32"), cpu.autocast(enabled=False))
    for context in full:
        with cpu.autocast(), context:
            assert model(torch.ones(1, 2)).dtype == torch.float32
    return None


@case("step-autocast-dtype-name", accel.AcceleratorTypeError)
def _step_autocast_dtype_name(monkeypatch: pytest.MonkeyPatch) -> object:
    return _stepping()[0].autocast("float8")


@case("step-no-sync-ddp-module", accel.errors.GradientSyncWarning)
def _step_no_sync_ddp_module(mp: pytest.MonkeyPatch) -> object:
    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group(
            "gloo", init_method=f"file://{directory}/store", rank=0, world_size=1
        )
        try:
            ddp = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
            with isolated_registry().get_accelerator("cpu").no_sync(ddp.module):
                ddp(torch.ones(2, 3)).sum().backward()
        finally:
            dist.destroy_process_group()
    return ddp


def _on_meta(model_class: type[nn.Module] = TiedLM) -> nn.Module:
    with torch.device("meta"):
        return model_class()


@case("materialize-move-meta", accel.AcceleratorValueError)
def _materialize_move_meta(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu").model_to_device(_on_meta())


@case("materialize-nothing-on-meta", accel.AcceleratorValueError)
def _materialize_nothing_on_meta(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu").materialize(TiedLM())


class _RotaryCache(TiedLM):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.arange(4.0), persistent=False)


@case("materialize-never-written", accel.AcceleratorValueError)
def _materialize_never_written(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu").materialize(_on_meta(_RotaryCache))


@case("materialize-init-and-load", accel.AcceleratorTypeError)
def _materialize_init_and_load(mp: pytest.MonkeyPatch) -> object:
    cpu = isolated_registry().get_accelerator("cpu")
    return cpu.materialize(_on_meta(), lambda model: None, load=TiedLM().state_dict())


@case("materialize-load-missing", accel.errors.AcceleratorKeyError)
def _materialize_load_missing(mp: pytest.MonkeyPatch) -> object:
    state = TiedLM().state_dict()
    del state["body.bias"]
    return isolated_registry().get_accelerator("cpu").materialize(_on_meta(), load=state)


@case("materialize-load-no-file", accel.errors.AcceleratorFileNotFoundError)
def _materialize_load_no_file(mp: pytest.MonkeyPatch) -> object:
    cpu = isolated_registry().get_accelerator("cpu")
    with tempfile.TemporaryDirectory() as directory:
        return cpu.materialize(_on_meta(), load=Path(directory) / "missing.pt")


def _in_a_world_of_one(run: Callable[[], object]) -> object:
    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group(
            "gloo", init_method=f"file://{directory}/store", rank=0, world_size=1
        )
        try:
            return run()
        finally:
            accel.distributed.destroy_process_group()
            if dist.is_initialized():
                dist.destroy_process_group()


@case("tp-tie-placements-disagree", accel.WeightTyingError)
def _tp_tie_placements_disagree(mp: pytest.MonkeyPatch) -> object:
    from torch.distributed.tensor.parallel import ColwiseParallel

    def parallelize() -> object:
        accel.distributed.init_process_group("cpu")
        plan = {"embed": ColwiseParallel(), "head": ColwiseParallel()}
        return accel.distributed.parallelize_tied(_on_meta(), plan)

    return _in_a_world_of_one(parallelize)


@case("ddp-model-on-meta", accel.AcceleratorValueError)
def _ddp_model_on_meta(mp: pytest.MonkeyPatch) -> object:
    def wrap() -> object:
        accel.distributed.init_process_group("cpu")
        return accel.distributed.wrap_data_parallel(_on_meta())

    return _in_a_world_of_one(wrap)


@case("step-clip-model", accel.AcceleratorTypeError)
def _step_clip_model(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, model, _ = _stepping()
    return cpu.clip_grad_norm_(model, max_norm=1.0)  # type: ignore[arg-type]


@case("step-clip-no-max-norm", TypeError)
def _step_clip_no_max_norm(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, model, _ = _stepping()
    return cpu.clip_grad_norm_(model.parameters())  # type: ignore[call-arg]


@case("step-clip-negative", accel.AcceleratorValueError)
def _step_clip_negative(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, model, _ = _stepping()
    return cpu.clip_grad_norm_(model.parameters(), max_norm=-1.0)


@case("step-clip-norm-type", accel.AcceleratorValueError)
def _step_clip_norm_type(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, model, _ = _stepping()
    return cpu.clip_grad_norm_(model.parameters(), 1.0, norm_type=0)


@case("step-no-sync-optimizer", accel.AcceleratorTypeError)
def _step_no_sync_optimizer(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, _, optimizer = _stepping()
    return cpu.no_sync(optimizer)  # type: ignore[arg-type]


@case("step-scaler-junk", accel.AcceleratorTypeError)
def _step_scaler_junk(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, _, optimizer = _stepping()
    return cpu.optimizer_step(optimizer, scaler=True)  # type: ignore[arg-type]


@case("step-scaler-closure", accel.AcceleratorValueError)
def _step_scaler_closure(monkeypatch: pytest.MonkeyPatch) -> object:
    cpu, _, optimizer = _stepping()
    return cpu.optimizer_step(optimizer, lambda: 0.0, scaler=torch.amp.GradScaler("cpu"))


@case("step-scaler-dtype", accel.AcceleratorValueError)
def _step_scaler_dtype(monkeypatch: pytest.MonkeyPatch) -> object:
    return _stepping()[0].grad_scaler(torch.float64)


@case("step-compile-junk", accel.AcceleratorTypeError)
def _step_compile_junk(monkeypatch: pytest.MonkeyPatch) -> object:
    return _stepping()[0].compile("model")  # type: ignore[type-var]


@case("plugin-compile-backend-int", accel.PluginError)
def _plugin_compile_backend_int(monkeypatch: pytest.MonkeyPatch) -> object:
    acc = isolated_registry(_plugin(compile_backend=lambda self: 3)).get_accelerator("npu")
    return acc.compile(nn.Linear(1, 1))


@case("plugin-clip-float", accel.PluginError)
def _plugin_clip_float(monkeypatch: pytest.MonkeyPatch) -> object:
    acc = isolated_registry(_plugin(clip_grad_norm_=lambda self: 1.5)).get_accelerator("npu")
    return acc.clip_grad_norm_(nn.Linear(1, 1).parameters(), 1.0)


@case("plugin-restore-wrong-count", accel.PluginError)
def _plugin_restore_wrong_count(monkeypatch: pytest.MonkeyPatch) -> object:
    path = Path(tempfile.mkdtemp()) / "model.pt"
    _cpu().save(TiedLM(), path)  # the tied weight stored once: three tensors
    plugin = _plugin(restore_to_device=lambda self: [torch.zeros(1)])
    return isolated_registry(plugin).get_accelerator("npu").load(path, TiedLM())


@case("plugin-grad-scaler-junk", accel.PluginError)
def _plugin_grad_scaler_junk(monkeypatch: pytest.MonkeyPatch) -> object:
    acc = isolated_registry(_plugin(grad_scaler=lambda self: "scaler")).get_accelerator("npu")
    return acc.grad_scaler(torch.float16)


@case("arg-tie-check", accel.AcceleratorValueError)
def _arg_tie_check(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry().get_accelerator("cpu")
    with pytest.raises(ValueError, match="got 'sometimes'"):
        acc.tie_check = "sometimes"  # type: ignore[assignment]
    return isolated_registry().get_accelerator("cpu", tie_check="sometimes")  # type: ignore[arg-type]


@case("arg-model-tensor", accel.AcceleratorTypeError)
def _arg_model_tensor(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu").model_to_device(torch.zeros(2))  # type: ignore[type-var]


@case("arg-model-dict", accel.AcceleratorTypeError)
def _arg_model_dict(mp: pytest.MonkeyPatch) -> object:
    model = {"encoder": nn.Linear(2, 2)}
    return isolated_registry().get_accelerator("cpu").model_to_device(model)  # type: ignore[type-var]


@case("arg-optimizer-str", accel.AcceleratorTypeError)
def _arg_optimizer_str(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry().get_accelerator("cpu")
    return acc.model_to_device(nn.Linear(2, 2), optimizer="adam")  # type: ignore[arg-type]


@case("arg-optimizer-int", accel.AcceleratorTypeError)
def _arg_optimizer_int(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry().get_accelerator("cpu")
    return acc.model_to_device(nn.Linear(2, 2), optimizer=3)  # type: ignore[arg-type]


@case("arg-optimizer-module", accel.AcceleratorTypeError)
def _arg_optimizer_module(mp: pytest.MonkeyPatch) -> object:
    model = nn.Linear(2, 2)
    acc = isolated_registry().get_accelerator("cpu")
    return acc.model_to_device(model, optimizer=model)  # type: ignore[arg-type]


@case("arg-optimizer-list-of-junk", accel.AcceleratorTypeError)
def _arg_optimizer_list_of_junk(mp: pytest.MonkeyPatch) -> object:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = isolated_registry().get_accelerator("cpu")
    return acc.model_to_device(model, optimizer=[optimizer, "sgd"])  # type: ignore[list-item]


@case("arg-optimizer-not-of-the-model", accel.AcceleratorValueError)
def _arg_optimizer_not_of_the_model(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry(MetaTpuPlugin(), builtins=False).get_accelerator("tpu")
    model = TiedLM()
    stale = torch.optim.SGD(model.parameters(), lr=0.1)
    acc.model_to_device(model)  # replaces every parameter; the optimizer was not passed
    return acc.model_to_device(model, optimizer=stale)


# Batches -------------------------------------------------------------------------


@case("batch-list-contains-itself", accel.AcceleratorValueError)
def _batch_list_contains_itself(mp: pytest.MonkeyPatch) -> object:
    batch: list[Any] = [torch.zeros(1)]
    batch.append(batch)
    return isolated_registry().get_accelerator("cpu").batch_to_device(batch)


@case("batch-dict-contains-itself", accel.AcceleratorValueError)
def _batch_dict_contains_itself(mp: pytest.MonkeyPatch) -> object:
    batch: dict[str, Any] = {"x": torch.zeros(1)}
    batch["self"] = batch
    return isolated_registry().get_accelerator("cpu").batch_to_device(batch)


@case("batch-too-deep", accel.AcceleratorValueError)
def _batch_too_deep(mp: pytest.MonkeyPatch) -> object:
    batch: Any = torch.zeros(1)
    for _ in range(2 * sys.getrecursionlimit()):
        batch = [batch]
    return isolated_registry().get_accelerator("cpu").batch_to_device(batch)


class Pair(tuple[Any, ...]):
    """A tuple subclass whose constructor takes the items, not an iterable of them."""

    def __new__(cls, first: object, second: object) -> Pair:
        return super().__new__(cls, (first, second))


@case("batch-unrebuildable-container", accel.AcceleratorTypeError)
def _batch_unrebuildable_container(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().get_accelerator("cpu").batch_to_device(Pair(torch.zeros(1), 1))


# Length buckets --------------------------------------------------------------------

_SIZES = (32, 64, 128, 256)


@case("buckets-too-long", accel.AcceleratorValueError)
def _buckets_too_long(mp: pytest.MonkeyPatch) -> object:
    from accel.training.buckets import pad_to_bucket

    return pad_to_bucket({"input_ids": torch.ones(2, 300)}, _SIZES, {"input_ids": 0})


@case("buckets-sizes-unsorted", accel.AcceleratorValueError)
def _buckets_sizes_unsorted(mp: pytest.MonkeyPatch) -> object:
    from accel.training.buckets import pad_to_bucket

    return pad_to_bucket({"input_ids": torch.ones(2, 3)}, (64, 32), {"input_ids": 0})


@case("buckets-lengths-differ", accel.AcceleratorValueError)
def _buckets_lengths_differ(mp: pytest.MonkeyPatch) -> object:
    from accel.training.buckets import pad_to_bucket

    batch = {"a": torch.ones(1, 3), "b": torch.ones(1, 4)}
    return pad_to_bucket(batch, _SIZES, {"a": 0, "b": 0})


@case("buckets-pad-values-missing-key", accel.AcceleratorValueError)
def _buckets_pad_values_missing_key(mp: pytest.MonkeyPatch) -> object:
    from accel.training.buckets import pad_to_bucket

    return pad_to_bucket({"input_ids": torch.ones(2, 3)}, _SIZES, {"labels": -100})


@case("buckets-pad-values-kind", accel.AcceleratorTypeError)
def _buckets_pad_values_kind(mp: pytest.MonkeyPatch) -> object:
    from accel.training.buckets import pad_to_bucket

    return pad_to_bucket((torch.ones(2, 3), torch.ones(2, 3)), _SIZES, {"labels": -100})


@case("buckets-pad-value-not-a-tensor", accel.AcceleratorTypeError)
def _buckets_pad_value_not_a_tensor(mp: pytest.MonkeyPatch) -> object:
    from accel.training.buckets import pad_to_bucket

    return pad_to_bucket({"n": 3}, _SIZES, {"n": 0})


# Plugins: registration -------------------------------------------------------------


@case("plugin-unknown-hook", accel.PluginError)
def _plugin_unknown_hook(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(model_to_devcie=lambda self, model: model))


@case("plugin-hook-extra-argument", accel.PluginError)
def _plugin_hook_extra_argument(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(is_available=lambda self, verbose: accel.Availability(True)))


@case("plugin-unhashable", accel.PluginError)
def _plugin_unhashable(mp: pytest.MonkeyPatch) -> object:
    plugin = _plugin()
    type(plugin).__hash__ = None  # type: ignore[assignment]
    return isolated_registry(plugin)


class Forgotten:
    """A would-be plugin whose methods lack @accel.hookimpl."""

    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("npu")]

    def is_available(self) -> accel.Availability:
        return accel.Availability(True)


@case("plugin-no-hooks", accel.PluginError)
def _plugin_no_hooks(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(Forgotten())


@case("plugin-registered-twice", accel.PluginError)
def _plugin_registered_twice(mp: pytest.MonkeyPatch) -> object:
    plugin = _plugin()
    registry = isolated_registry(plugin)
    registry.register(plugin)
    return registry


@case("plugin-unregister-unknown", accel.PluginError)
def _plugin_unregister_unknown(mp: pytest.MonkeyPatch) -> object:
    registry = isolated_registry()
    registry.unregister(_plugin())
    return registry


@case("plugin-specs-junk", accel.PluginError)
def _plugin_specs_junk(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(register_accelerators=lambda self: ["npu"]))


@case("plugin-specs-raise", accel.PluginError)
def _plugin_specs_raise(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(register_accelerators=lambda self: _raise(KeyError("npu"))))


@case("plugin-specs-twice", accel.PluginError)
def _plugin_specs_twice(mp: pytest.MonkeyPatch) -> object:
    specs = [accel.AcceleratorSpec("npu"), accel.AcceleratorSpec("NPU")]
    return isolated_registry(_plugin(register_accelerators=lambda self: specs))


@case("plugin-claims-auto", accel.PluginError)
def _plugin_claims_auto(mp: pytest.MonkeyPatch) -> object:
    with pytest.raises(accel.PluginError, match="'auto' is a reserved name"):
        isolated_registry(_plugin(register_accelerators=lambda self: accel.AcceleratorSpec("auto")))
    spec = accel.AcceleratorSpec("npu", aliases=("auto",))
    return isolated_registry(_plugin(register_accelerators=lambda self: spec))


@case("plugin-name-conflict", accel.PluginError)
def _plugin_name_conflict(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin("cuda"))


@case("plugin-alias-conflict", accel.PluginError)
def _plugin_alias_conflict(mp: pytest.MonkeyPatch) -> object:
    spec = accel.AcceleratorSpec("npu", aliases=("gpu",))
    return isolated_registry(_plugin(register_accelerators=lambda self: spec))


# Plugins: what their hooks return ------------------------------------------------------


@case("plugin-available-bool", accel.AcceleratorUnavailableError)
def _plugin_available_bool(mp: pytest.MonkeyPatch) -> object:
    registry = isolated_registry(_plugin(is_available=lambda self: True))
    info = _listed(registry, "npu")
    assert not info.available
    assert "returned bool (True)" in info.reason
    assert registry.get_accelerator("auto").name != "npu"
    return registry.get_accelerator("npu")


@case("plugin-available-raises", accel.AcceleratorUnavailableError)
def _plugin_available_raises(mp: pytest.MonkeyPatch) -> object:
    registry = isolated_registry(
        _plugin(is_available=lambda self: _raise(OSError("driver on fire")))
    )
    info = _listed(registry, "npu")
    assert not info.available
    assert info.reason == "probing it failed: OSError: driver on fire"
    return registry.get_accelerator("npu")


@case("plugin-available-missing", accel.AcceleratorUnavailableError)
def _plugin_available_missing(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(is_available=None)).get_accelerator("npu")


@case("plugin-count-str", accel.PluginError)
def _plugin_count_str(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(device_count=lambda self: "2")).get_accelerator("npu")


@case("plugin-count-bool", accel.PluginError)
def _plugin_count_bool(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(device_count=lambda self: True)).get_accelerator("npu")


@case("plugin-count-negative", accel.PluginError)
def _plugin_count_negative(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(device_count=lambda self: -1)).get_accelerator("npu")


@case("plugin-count-raises", OSError, needs_notes=True)
def _plugin_count_raises(mp: pytest.MonkeyPatch) -> object:
    registry = isolated_registry(_plugin(device_count=lambda self: _raise(OSError("smi gone"))))
    info = _listed(registry, "npu")
    assert not info.available
    assert info.reason == "device_count failed: OSError: smi gone"
    return registry.get_accelerator("npu")


@case("plugin-get-device-str-auto", None)
def _plugin_get_device_str_auto(mp: pytest.MonkeyPatch) -> object:
    nonsense = _plugin(
        register_accelerators=lambda self: [accel.AcceleratorSpec("npu", priority=99)],
        get_device=lambda self: "npu:0",
    )
    registry = isolated_registry(nonsense)
    acc = registry.get_accelerator("auto")
    assert acc.name == "cpu"  # npu ranks first, but names no device
    assert _listed(registry, "npu").reason.startswith("get_device failed: PluginError: ")
    return acc


@case("plugin-get-device-str", accel.PluginError)
def _plugin_get_device_str(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(get_device=lambda self: "npu:0")).get_accelerator("npu")


@case("plugin-get-device-missing", accel.PluginError)
def _plugin_get_device_missing(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry(_plugin(get_device=None)).get_accelerator("npu")


@case("plugin-backend-int", accel.PluginError)
def _plugin_backend_int(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry(_plugin(distributed_backend=lambda self: 3)).get_accelerator("npu")
    return acc.distributed_backend


@case("plugin-move-returns-junk", accel.PluginError)
def _plugin_move_returns_junk(mp: pytest.MonkeyPatch) -> object:
    acc = isolated_registry(_plugin(model_to_device=lambda self: "moved")).get_accelerator("npu")
    return acc.model_to_device(nn.Linear(2, 2))


@case("plugin-hook-raises-at-move", RuntimeError, needs_notes=True)
def _plugin_hook_raises_at_move(mp: pytest.MonkeyPatch) -> object:
    failing = _plugin(post_move_hook=lambda self: _raise(RuntimeError("validation failed")))
    acc = isolated_registry(failing).get_accelerator("npu")
    model = nn.Linear(2, 2)
    weight = model.weight
    try:
        return acc.model_to_device(model)
    finally:
        assert model.weight is weight  # restored: the same Parameter in its slot


@case("plugin-entry-point-broken", accel.PluginWarning)
def _plugin_entry_point_broken(mp: pytest.MonkeyPatch) -> object:
    registry = _entry_point_registry(mp, _broken_entry_point(), _fake_entry_point())
    try:
        return registry.list_accelerators()
    finally:
        assert "fake" in registry.names()  # the others still load
        info = _listed(registry, "broken")
        assert not info.available and "ModuleNotFoundError" in info.reason


def _module_entry_point(
    mp: pytest.MonkeyPatch, name: str, source: str
) -> importlib.metadata.EntryPoint:
    """An entry point loading a module of ``source``, written to a new directory on sys.path."""
    module = f"accel_errors_table_{name}"
    root = Path(tempfile.mkdtemp(prefix="accel-errors-table-"))
    (root / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    mp.syspath_prepend(str(root))
    return importlib.metadata.EntryPoint(name, module, ENTRY_POINT_GROUP)


@case("plugin-entry-point-exits", accel.PluginWarning)
def _plugin_entry_point_exits(mp: pytest.MonkeyPatch) -> object:
    exits = _module_entry_point(mp, "exits", "import sys\nsys.exit(3)\n")
    registry = _entry_point_registry(mp, exits, _fake_entry_point())
    names = registry.names()  # no SystemExit: the program goes on
    assert "fake" in names
    assert [f.error for f in registry.plugin_failures()] == ["SystemExit: 3"]
    return names


@case("plugin-entry-point-reentrant", accel.PluginWarning)
def _plugin_entry_point_reentrant(mp: pytest.MonkeyPatch) -> object:
    reentrant = _module_entry_point(
        mp,
        "reentrant",
        """
        import accel
        accel.get_accelerator("cpu")  # the registry that is loading this very plugin
        """,
    )
    registry = _entry_point_registry(mp, reentrant, _fake_entry_point())
    mp.setattr(accel, "_default_registry", registry)
    names = registry.names()
    assert {"cpu", "fake"} <= set(names)  # loaded once, whole
    (failure,) = registry.plugin_failures()
    assert failure.name == "reentrant" and "claimed twice" not in failure.error
    return names


@case("plugin-entry-point-interrupted", KeyboardInterrupt)
def _plugin_entry_point_interrupted(mp: pytest.MonkeyPatch) -> object:
    # The Ctrl-C a user presses while a plugin hangs at import.
    hangs = _module_entry_point(mp, "hangs", "raise KeyboardInterrupt\n")
    registry = _entry_point_registry(mp, hangs)
    try:
        return registry.names()
    finally:
        mp.undo()  # the next use of the registry starts afresh: no half-loaded state
        assert registry.names().count("cpu") == 1 and registry.plugin_failures() == []


@case("plugin-entry-point-alias-of-disputed", accel.PluginError)
def _plugin_entry_point_alias_of_disputed(mp: pytest.MonkeyPatch) -> object:
    group = "accel-errors-table-vendorx"
    root = Path(tempfile.mkdtemp(prefix="accel-errors-table-"))
    for letter in "ab":
        module = f"accel_errors_table_vendorx_{letter}"
        write_distribution(
            root,
            f"accel-vendorx-{letter}",
            group=group,
            entry_points={f"vendorx-{letter}": module},
            modules={
                module: textwrap.dedent(
                    """
                    import accel

                    @accel.hookimpl
                    def register_accelerators():
                        return [accel.AcceleratorSpec("vendorx", aliases=("vx",))]

                    @accel.hookimpl
                    def is_available():
                        return accel.Availability(True)
                    """
                )
            },
        )
    mp.syspath_prepend(str(root))
    registry = accel.AcceleratorRegistry(entry_points=group)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", accel.PluginWarning)  # the second one is kept out
        with pytest.raises(accel.PluginError, match="claimed by 2 installed plugins"):
            registry.get_accelerator("vendorx")
    return registry.get_accelerator("vx")


class _Distribution:
    """What accel reads of an entry point's distribution: its name and version."""

    def __init__(self, name: str) -> None:
        self.metadata = {"Name": name}
        self.version = "1.0"


def _claiming_entry_point(cls: str) -> importlib.metadata.EntryPoint:
    """An entry point for ``helpers.claiming_plugins.<cls>``, from a distribution of its own."""
    entry_point = importlib.metadata.EntryPoint(
        cls.lower(), f"helpers.claiming_plugins:{cls}", ENTRY_POINT_GROUP
    )
    vars(entry_point).update(dist=_Distribution(f"accel-{cls.lower()}"))  # as importlib does
    return entry_point


@case("plugin-entry-point-builtin-name", accel.PluginWarning)
def _plugin_entry_point_builtin_name(mp: pytest.MonkeyPatch) -> object:
    registry = _entry_point_registry(mp, _claiming_entry_point("CpuClaimer"))
    try:
        return registry.names()
    finally:
        assert registry.get_accelerator("cpu").name == "cpu"  # the built-in still works


@case("plugin-entry-point-builtin-alias", accel.PluginWarning)
def _plugin_entry_point_builtin_alias(mp: pytest.MonkeyPatch) -> object:
    registry = _entry_point_registry(mp, _claiming_entry_point("GpuAliasClaimer"))
    try:
        return registry.names()
    finally:
        assert _listed(registry, "npu").aliases == ("ascend",)


@case("plugin-entry-point-alias-disputed", accel.PluginWarning)
def _plugin_entry_point_alias_disputed(mp: pytest.MonkeyPatch) -> object:
    registry = _entry_point_registry(
        mp, _claiming_entry_point("VendorAliasA"), _claiming_entry_point("VendorAliasB")
    )
    try:
        return registry.names()
    finally:
        with pytest.raises(accel.PluginError, match="cannot select 'vx'"):
            registry.get_accelerator("vx")


@case("plugin-count-raises-auto", None)
def _plugin_count_raises_auto(mp: pytest.MonkeyPatch) -> object:
    flaky = _plugin(
        register_accelerators=lambda self: [accel.AcceleratorSpec("npu", priority=99)],
        device_count=lambda self: _raise(OSError("smi gone")),
    )
    acc = isolated_registry(flaky).get_accelerator("auto")
    assert acc.name == "cpu"  # npu ranks first, but cannot count its devices
    return acc


@case("plugin-entry-point-broken-selected", accel.AcceleratorNotFoundError)
def _plugin_entry_point_broken_selected(mp: pytest.MonkeyPatch) -> object:
    registry = _entry_point_registry(mp, _broken_entry_point())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", accel.PluginWarning)
        return registry.get_accelerator("broken")


# Value types plugins build ---------------------------------------------------------


@case("spec-bad-name", accel.AcceleratorValueError)
def _spec_bad_name(mp: pytest.MonkeyPatch) -> object:
    return accel.AcceleratorSpec("my npu")


@case("spec-name-with-index", accel.AcceleratorValueError)
def _spec_name_with_index(mp: pytest.MonkeyPatch) -> object:
    return accel.AcceleratorSpec("npu:0")


@case("spec-aliases-str", accel.AcceleratorTypeError)
def _spec_aliases_str(mp: pytest.MonkeyPatch) -> object:
    return accel.AcceleratorSpec("npu", aliases="ascend")  # type: ignore[arg-type]


@case("spec-priority", accel.AcceleratorTypeError)
def _spec_priority(mp: pytest.MonkeyPatch) -> object:
    return accel.AcceleratorSpec("npu", priority="high")  # type: ignore[arg-type]


@case("spec-unties-weights-not-bool", accel.AcceleratorTypeError)
def _spec_unties_weights_not_bool(mp: pytest.MonkeyPatch) -> object:
    return accel.AcceleratorSpec("npu", unties_weights="yes")  # type: ignore[arg-type]


@case("spec-probing-initialises-not-bool", accel.AcceleratorTypeError)
def _spec_probing_initialises_not_bool(mp: pytest.MonkeyPatch) -> object:
    return accel.AcceleratorSpec("opencl", probing_initialises=1)  # type: ignore[arg-type]


@case("spec-availability-not-bool", accel.AcceleratorTypeError)
def _spec_availability_not_bool(mp: pytest.MonkeyPatch) -> object:
    return accel.Availability(available="yes")  # type: ignore[arg-type]


@case("spec-availability-auto-not-bool", accel.AcceleratorTypeError)
def _spec_availability_auto_not_bool(mp: pytest.MonkeyPatch) -> object:
    return accel.Availability(True, auto="no")  # type: ignore[arg-type]


# Checkpoints and resume ------------------------------------------------------------


def _cpu() -> accel.Accelerator:
    return isolated_registry().get_accelerator("cpu")


def _saved(value: object) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "c.pt"
    _cpu().save(value, path)
    return path


@case("ckpt-save-missing-directory", FileNotFoundError)
def _ckpt_save_missing_directory(mp: pytest.MonkeyPatch) -> object:
    import tempfile

    return _cpu().save({"step": 1}, Path(tempfile.mkdtemp()) / "missing" / "last.pt")


@case("ckpt-save-disk-full", OSError)
def _ckpt_save_disk_full(mp: pytest.MonkeyPatch) -> object:
    import resource
    import signal

    path = _saved({"small": torch.zeros(4)})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        return _cpu().save({"big": torch.zeros(2**18)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
        assert torch.equal(torch.load(path)["small"], torch.zeros(4))


@case("ckpt-save-async-not-bool", accel.AcceleratorTypeError)
def _ckpt_save_async_not_bool(mp: pytest.MonkeyPatch) -> object:
    import tempfile

    return _cpu().save({"step": 1}, Path(tempfile.mkdtemp()) / "c.pt", asynchronous="yes")


@case("ckpt-save-async-failed", OSError, needs_notes=True)
def _ckpt_save_async_failed(mp: pytest.MonkeyPatch) -> object:
    import resource
    import signal

    path = _saved({"small": torch.zeros(4)})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        # Returns once the snapshot is taken; the write fails in the background.
        pending = _cpu().save({"big": torch.zeros(2**18)}, path, asynchronous=True)
        return pending.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
        assert torch.equal(torch.load(path)["small"], torch.zeros(4))


@case("ckpt-save-async-xla-processes", accel.AcceleratorRuntimeError)
def _ckpt_save_async_xla_processes(mp: pytest.MonkeyPatch) -> object:
    import tempfile

    from accel.plugins._xla_training import XlaTrainingHooks
    from accel.training.checkpoint import _async_save

    # A multi-process PJRT run (torch_xla.launch) without a torch.distributed group.
    runtime = types.ModuleType("torch_xla.runtime")
    runtime.world_size = lambda: 2  # type: ignore[attr-defined]
    model = types.ModuleType("torch_xla.core.xla_model")
    core = types.ModuleType("torch_xla.core")
    core.xla_model = model  # type: ignore[attr-defined]
    package = types.ModuleType("torch_xla")
    package.runtime, package.core = runtime, core  # type: ignore[attr-defined]
    for name, module in [
        ("torch_xla", package),
        ("torch_xla.core", core),
        ("torch_xla.core.xla_model", model),
        ("torch_xla.runtime", runtime),
    ]:
        mp.setitem(sys.modules, name, module)  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "c.pt"

    def write(snapshot: object) -> None:  # where acc.save(..., asynchronous=True) calls it
        XlaTrainingHooks().save(snapshot, path)

    # accel's own background writer, which the hook asks about (writing_in_background).
    with _async_save.one_save_at_a_time():
        pending = _async_save.start_background(path, write, {"step": 1})
    return pending.wait()


def _numpy_missing(self: torch.Tensor, *args: object, **kwargs: object) -> Any:
    raise RuntimeError("Numpy is not available")  # torch's own words without NumPy


@case("ckpt-save-distributed-no-numpy", accel.AcceleratorRuntimeError)
def _ckpt_save_distributed_no_numpy(mp: pytest.MonkeyPatch) -> object:
    import functools

    from accel.training.checkpoint import _main_process

    path = _saved({"step": 0})
    # Rank 0 of two (no collective is reached), where torch finds no NumPy; a fresh
    # cache for the probe, put back with the rest.
    for name, value in [
        ("is_initialized", lambda: True),
        ("get_world_size", lambda group=None: 2),
        ("get_rank", lambda group=None: 0),
        ("get_backend", lambda group=None: "gloo"),
    ]:
        mp.setattr(dist, name, value)
    mp.setattr(torch.Tensor, "numpy", _numpy_missing)
    probe = functools.cache(_main_process._numpy_works.__wrapped__)
    mp.setattr(_main_process, "_numpy_works", probe)
    try:
        return _cpu().save({"step": 1}, path)
    finally:
        assert torch.load(path) == {"step": 0}  # nothing written


@case("ckpt-save-unloadable", accel.AcceleratorTypeError)
def _ckpt_save_unloadable(mp: pytest.MonkeyPatch) -> object:
    path = _saved({"step": 0})
    try:
        return _cpu().save({"step": 1, "fn": len}, path)
    finally:
        assert _cpu().load(path) == {"step": 0}  # nothing written


@case("ckpt-save-path-int", accel.AcceleratorTypeError)
def _ckpt_save_path_int(mp: pytest.MonkeyPatch) -> object:
    return _cpu().save({}, 3)  # type: ignore[arg-type]


@case("ckpt-load-missing-file", accel.AcceleratorFileNotFoundError)
def _ckpt_load_missing_file(mp: pytest.MonkeyPatch) -> object:
    return _cpu().load(_saved(1).parent / "absent.pt")


@case("ckpt-load-not-a-checkpoint", accel.AcceleratorValueError)
def _ckpt_load_not_a_checkpoint(mp: pytest.MonkeyPatch) -> object:
    path = _saved(1)
    path.write_text("not a checkpoint")
    return _cpu().load(path)


class _Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this must never run",))


@case("ckpt-load-hostile-pickle", __import__("pickle").UnpicklingError)
def _ckpt_load_hostile_pickle(mp: pytest.MonkeyPatch) -> object:
    path = _saved(1)
    torch.save({"model": _Hostile()}, path)
    return _cpu().load(path)


@case("ckpt-load-missing-key", accel.AcceleratorKeyError)
def _ckpt_load_missing_key(mp: pytest.MonkeyPatch) -> object:
    model = TiedLM()
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters()), 1)
    return _cpu().load(_saved({"model": model}), {"model": model, "scheduler": scheduler})


@case("ckpt-load-shape-mismatch", accel.AcceleratorValueError)
def _ckpt_load_shape_mismatch(mp: pytest.MonkeyPatch) -> object:
    return _cpu().load(_saved({"model": TiedLM()}), {"model": TiedLM(vocab=20)})


@case("ckpt-load-other-keys", accel.AcceleratorValueError)
def _ckpt_load_other_keys(mp: pytest.MonkeyPatch) -> object:
    grown = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    return _cpu().load(_saved({"model": nn.Sequential(nn.Linear(2, 2))}), {"model": grown})


@case("ckpt-load-not-a-dict", accel.AcceleratorValueError)
def _ckpt_load_not_a_dict(mp: pytest.MonkeyPatch) -> object:
    return _cpu().load(_saved([1, 2]), {"model": TiedLM()})


@case("ckpt-load-state-list", accel.AcceleratorTypeError)
def _ckpt_load_state_list(mp: pytest.MonkeyPatch) -> object:
    return _cpu().load(_saved({}), [TiedLM()])  # type: ignore[arg-type]


def _linear_and_sgd() -> Path:
    saved = nn.Linear(2, 2)
    return _saved({"model": saved, "optimizer": torch.optim.SGD(saved.parameters(), lr=0.1)})


def _load_changing_nothing(path: Path, state: dict[str, Any]) -> object:
    model = state.get("model")
    before = [p.clone() for p in model.parameters()] if isinstance(model, nn.Module) else []
    try:
        return _cpu().load(path, state)
    finally:
        assert isinstance(model, nn.Module)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@case("ckpt-load-optimizer-groups", accel.AcceleratorValueError)
def _ckpt_load_optimizer_groups(mp: pytest.MonkeyPatch) -> object:
    model = nn.Linear(2, 2)
    groups = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)
    return _load_changing_nothing(_linear_and_sgd(), {"model": model, "optimizer": groups})


@case("ckpt-load-optimizer-group-size", accel.AcceleratorValueError)
def _ckpt_load_optimizer_group_size(mp: pytest.MonkeyPatch) -> object:
    model = nn.Linear(2, 2)
    one = torch.optim.SGD([model.weight], lr=0.1)
    return _load_changing_nothing(_linear_and_sgd(), {"model": model, "optimizer": one})


@case("ckpt-load-optimizer-state-shape", accel.AcceleratorValueError)
def _ckpt_load_optimizer_state_shape(mp: pytest.MonkeyPatch) -> object:
    saved = TiedLM()
    optimizer = torch.optim.AdamW(saved.parameters(), lr=0.1)
    saved(torch.tensor([[1, 2]])).sum().backward()
    optimizer.step()
    path = _saved({"optimizer": optimizer})
    return _cpu().load(path, {"optimizer": torch.optim.AdamW(TiedLM(vocab=20).parameters())})


@case("ckpt-load-not-optimizer-state", accel.AcceleratorValueError)
def _ckpt_load_not_optimizer_state(mp: pytest.MonkeyPatch) -> object:
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    return _cpu().load(_saved({"model": nn.Linear(2, 2)}), {"model": optimizer})


@case("ckpt-rng-other-device", accel.AcceleratorValueError)
def _ckpt_rng_other_device(mp: pytest.MonkeyPatch) -> object:
    acc = _cpu()
    return acc.set_rng_state({**acc.rng_state(), "device": {"type": "cuda", "states": []}})


@case("ckpt-rng-not-a-dict", accel.AcceleratorTypeError)
def _ckpt_rng_not_a_dict(mp: pytest.MonkeyPatch) -> object:
    return _cpu().set_rng_state([1, 2])  # type: ignore[arg-type]


@case("ckpt-rng-missing-key", accel.AcceleratorValueError)
def _ckpt_rng_missing_key(mp: pytest.MonkeyPatch) -> object:
    return _cpu().set_rng_state({"torch": torch.get_rng_state()})


@case("ckpt-rng-other-world-size", accel.errors.RankGeneratorsWarning)
def _ckpt_rng_other_world_size(mp: pytest.MonkeyPatch) -> object:
    path = Path(tempfile.mkdtemp()) / "c.pt"
    states = (_cpu().rng_state(), _cpu().rng_state())  # what two ranks' acc.save stores
    torch.save({"step": 1, "rng": {RECORD_KEY: states}}, path)
    return _cpu().load(path, {})


@case("ckpt-keep-zero", accel.AcceleratorValueError)
def _ckpt_keep_zero(mp: pytest.MonkeyPatch) -> object:
    from accel.training.checkpoint._retention import prune_checkpoints

    return prune_checkpoints(_saved(1).parent, keep=0)


@case("ckpt-guard-thread", accel.AcceleratorRuntimeError)
def _ckpt_guard_thread(mp: pytest.MonkeyPatch) -> object:
    import threading

    raised: list[BaseException] = []

    def enter() -> None:
        try:
            with _cpu().preemption_guard():
                pass
        except RuntimeError as exc:
            raised.append(exc)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    raise raised[0]


@case("ckpt-sharded-exists", accel.AcceleratorFileExistsError)
def _ckpt_sharded_exists(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed

    return accel.distributed.save_sharded({"model": TiedLM()}, _saved(1).parent)


@case("ckpt-sharded-async-not-bool", accel.AcceleratorTypeError)
def _ckpt_sharded_async_not_bool(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed

    path = _saved(1).parent / "sharded"
    return accel.distributed.save_sharded({"model": TiedLM()}, path, asynchronous=1)


@case("ckpt-sharded-async-spmd", accel.AcceleratorValueError)
def _ckpt_sharded_async_spmd(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed
    from accel.distributed import _checkpoint

    mp.setattr(_checkpoint, "is_spmd", lambda: True)  # as under init_spmd
    path = _saved(1).parent / "sharded"
    try:
        return accel.distributed.save_sharded({"model": TiedLM()}, path, asynchronous=True)
    finally:
        assert not path.exists()


@case("ckpt-sharded-missing", accel.AcceleratorFileNotFoundError)
def _ckpt_sharded_missing(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed

    return accel.distributed.load_sharded(_saved(1).parent, {"model": TiedLM()})


def _plain_dcp_checkpoint(model: nn.Module) -> Path:
    """``model``'s weights and a step, written by DCP without accel."""
    import torch.distributed.checkpoint as dcp

    path = _saved(1).parent / "plain-dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: no process group, so it runs without one
        dcp.save({"model": model.state_dict(), "step": 7}, checkpoint_id=str(path))
    return path


@case("ckpt-sharded-missing-entry", accel.AcceleratorKeyError)
def _ckpt_sharded_missing_entry(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed

    path = _plain_dcp_checkpoint(nn.Linear(2, 2))
    return accel.distributed.load_sharded(path, {"model": nn.Linear(2, 2), "epoch": 0})


@case("ckpt-sharded-unreadable", accel.AcceleratorValueError)
def _ckpt_sharded_unreadable(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed

    path = _plain_dcp_checkpoint(nn.Linear(2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return accel.distributed.load_sharded(path, {"model": nn.Linear(3, 2)})


@case("ckpt-sharded-two-models", accel.AcceleratorTypeError)
def _ckpt_sharded_two_models(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed

    path = _saved(1).parent / "sharded"
    return accel.distributed.save_sharded({"a": TiedLM(), "b": TiedLM()}, path)


# TPU and torch_xla -----------------------------------------------------------------


@case("tpu-xla-not-installed", accel.AcceleratorUnavailableError)
def _tpu_xla_not_installed(mp: pytest.MonkeyPatch) -> object:
    _torch_xla(mp, installed=False, pjrt="CPU")
    return isolated_registry().get_accelerator("tpu")


@case("tpu-torch-xla-mismatch", accel.AcceleratorUnavailableError)
def _tpu_torch_xla_mismatch(mp: pytest.MonkeyPatch) -> object:
    from accel.plugins import _xla_versions

    _torch_xla(mp, installed=True, pjrt="CPU")
    fake = {"torch": "2.13.0", "torch_xla": "2.9.0"}
    mp.setattr(_xla_versions, "version", lambda d: fake.get(d) or importlib.metadata.version(d))
    return isolated_registry().get_accelerator("tpu")


@case("tpu-pjrt-unset", accel.AcceleratorUnavailableError)
def _tpu_pjrt_unset(mp: pytest.MonkeyPatch) -> object:
    _torch_xla(mp, installed=True, pjrt=None)
    return isolated_registry().get_accelerator("tpu")


@case("tpu-pjrt-unknown", accel.AcceleratorUnavailableError)
def _tpu_pjrt_unknown(mp: pytest.MonkeyPatch) -> object:
    _torch_xla(mp, installed=True, pjrt="QUANTUM")
    return isolated_registry().get_accelerator("tpu")


@case("tpu-pjrt-lower-case", accel.AcceleratorUnavailableError)
def _tpu_pjrt_lower_case(mp: pytest.MonkeyPatch) -> object:
    _torch_xla(mp, installed=True, pjrt="cpu")
    return isolated_registry().get_accelerator("tpu")


@case("tpu-pjrt-cuda-no-plugin", accel.AcceleratorUnavailableError)
def _tpu_pjrt_cuda_no_plugin(mp: pytest.MonkeyPatch) -> object:
    _started_torch_xla(mp, "CUDA", RuntimeError("No PjRtPlugin registered for: CUDA. Make sure"))
    return isolated_registry().get_accelerator("tpu")


@case("tpu-pjrt-cuda-no-torch-xla", accel.AcceleratorUnavailableError)
def _tpu_pjrt_cuda_no_torch_xla(mp: pytest.MonkeyPatch) -> object:
    _torch_xla(mp, installed=False, pjrt="CUDA")
    return isolated_registry().get_accelerator("tpu")


@case("tpu-pjrt-neuron-no-sdk", accel.AcceleratorUnavailableError)
def _tpu_pjrt_neuron_no_sdk(mp: pytest.MonkeyPatch) -> object:
    _started_torch_xla(mp, "NEURON", AssertionError("the runtime must not start"))
    return isolated_registry().get_accelerator("tpu")


def _started_torch_xla(mp: pytest.MonkeyPatch, pjrt: str, start_error: Exception) -> None:
    """A torch_xla that imports, whose runtime raises ``start_error`` when started."""
    _torch_xla(mp, installed=True, pjrt=pjrt)
    runtime = types.ModuleType("torch_xla.runtime")
    runtime.device_type = lambda: pjrt  # type: ignore[attr-defined]

    def start() -> int:
        raise start_error

    runtime.addressable_runtime_device_count = start  # type: ignore[attr-defined]
    package = types.ModuleType("torch_xla")
    package.runtime = runtime  # type: ignore[attr-defined]
    mp.setitem(sys.modules, "torch_xla", package)
    mp.setitem(sys.modules, "torch_xla.runtime", runtime)
    mp.setattr(tpu, "_runtime_failures", {})


@case("tpu-pjrt-tpu-no-hardware", accel.AcceleratorUnavailableError)
def _tpu_pjrt_tpu_no_hardware(mp: pytest.MonkeyPatch) -> object:
    # Importing torch_xla would fail here; the message proves it was not tried.
    _torch_xla(mp, installed=True, pjrt="TPU")
    return isolated_registry().get_accelerator("xla")


@case("tpu-xla-import-fails", accel.AcceleratorUnavailableError)
def _tpu_xla_import_fails(mp: pytest.MonkeyPatch) -> object:
    _torch_xla(mp, installed=True, pjrt="CPU")
    return isolated_registry().get_accelerator("tpu")


@case("tpu-tie-broken-by-model", accel.WeightTyingError)
def _tpu_tie_broken_by_model(mp: pytest.MonkeyPatch) -> object:
    # The real TPU plugin's hooks, moving to `meta`, which unties exactly like XLA.
    acc = isolated_registry(MetaTpuPlugin(), builtins=False).get_accelerator("tpu")
    model = UntiesOnPurpose()
    assert isinstance(model, TiedLM) and model.head.weight is model.embed.weight
    return acc.model_to_device(model)


@case("tpu-tie-appeared-by-model", accel.TyingWarning)
def _tpu_tie_appeared_by_model(mp: pytest.MonkeyPatch) -> object:
    from helpers.models import TiesOnTieWeights

    acc = isolated_registry(MetaTpuPlugin(), builtins=False).get_accelerator("tpu")
    model = TiesOnTieWeights()
    assert model.head.weight is not model.embed.weight  # untied before the move
    moved = acc.model_to_device(model)  # tie_check="error", the default
    assert moved.head.weight is not moved.embed.weight  # kept untied: its own weight
    assert moved.head.weight.device.type == "meta"
    return moved


# The launcher's variables (accel.distributed) -------------------------------------


def _srun_task(mp: pytest.MonkeyPatch, **overrides: str) -> None:
    """This process as task 0 of a one-task srun step on localhost, with ``overrides``."""
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "3",
        "SLURM_JOB_NODELIST": "localhost",
        "MASTER_ADDR": "127.0.0.1",
        **overrides,
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "MASTER_PORT"):
        mp.delenv(name, raising=False)
    for name, value in env.items():
        if value:
            mp.setenv(name, value)
        else:
            mp.delenv(name, raising=False)


@case("spmd-not-xla", DistributedSetupError)
def _spmd_not_xla(mp: pytest.MonkeyPatch) -> object:
    return accel.distributed.init_spmd("cpu", registry=isolated_registry())


@case("registry-backends-auto", accel.AcceleratorValueError)
def _registry_backends_auto(mp: pytest.MonkeyPatch) -> object:
    return isolated_registry().distributed_backends("auto")


@case("launch-slurm-batch-shell", DistributedSetupError)
def _launch_slurm_batch_shell(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed as adist

    _srun_task(mp, SLURM_NTASKS="2", SLURM_STEP_ID="", MASTER_ADDR="")
    return adist.init_process_group("cpu", timeout=30)


@case("launch-slurm-tasks-per-node", DistributedSetupError)
def _launch_slurm_tasks_per_node(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed as adist

    _srun_task(mp, SLURM_STEP_TASKS_PER_NODE="2(x")
    return adist.init_process_group("cpu", timeout=30)


@case("launch-slurm-local-rank-beyond-node", DistributedSetupError)
def _launch_slurm_local_rank_beyond_node(mp: pytest.MonkeyPatch) -> object:
    import accel.distributed as adist

    _srun_task(
        mp,
        SLURM_NTASKS="7",
        SLURM_PROCID="6",
        SLURM_LOCALID="1",
        SLURM_NODEID="3",
        SLURM_STEP_TASKS_PER_NODE="2(x3),1",
    )
    return adist.init_process_group("cpu", timeout=30)


@case("launch-port-in-use", dist.DistNetworkError, needs_notes=True)
def _launch_port_in_use(mp: pytest.MonkeyPatch) -> object:
    import socket

    import accel.distributed as adist

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        _srun_task(mp, MASTER_PORT=str(busy.getsockname()[1]))
        try:
            return adist.init_process_group("cpu", timeout=30)
        except dist.DistNetworkError:
            assert not dist.is_initialized()
            raise
        finally:
            adist.destroy_process_group()


@case("lightning-pickle-own-registry", accel.AcceleratorTypeError)
def _lightning_pickle_own_registry(mp: pytest.MonkeyPatch) -> object:
    import pickle

    from accel.integrations.lightning import AccelAccelerator

    return pickle.dumps(AccelAccelerator("npu", registry=isolated_registry(_plugin())))


@case("lightning-single-device-several", accel.AcceleratorValueError)
def _lightning_single_device_several(mp: pytest.MonkeyPatch) -> object:
    from lightning.fabric import Fabric

    from accel.integrations.lightning import AccelFabricStrategy

    registry = isolated_registry(_plugin(device_count=lambda self: 2))
    fabric = Fabric(strategy=AccelFabricStrategy("npu", registry=registry), devices=2)
    return fabric.setup(nn.Linear(2, 2))


@case("lightning-ddp-device-mismatch", accel.distributed.DistributedSetupError)
def _lightning_ddp_device_mismatch(mp: pytest.MonkeyPatch) -> object:
    from lightning.fabric.plugins.environments import LightningEnvironment

    from accel.integrations.lightning import AccelFabricDDPStrategy

    for name in (*launchers.TORCHRUN_VARIABLES, "LOCAL_WORLD_SIZE"):
        mp.delenv(name, raising=False)
    registry = isolated_registry(
        _plugin(
            device_count=lambda self: 2,
            get_device=lambda self, index: torch.device("cpu", index or 0),
        )
    )
    strategy = AccelFabricDDPStrategy(
        "npu", registry=registry, cluster_environment=LightningEnvironment(), timeout=30
    )
    strategy.parallel_devices = [torch.device("cpu", 1)]  # Lightning's devices=[1]
    try:
        return strategy.setup_environment()
    finally:
        accel.distributed.destroy_process_group(barrier=False)


@case("lightning-checkpoint-storage-options", accel.AcceleratorTypeError)
def _lightning_checkpoint_storage_options(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.lightning import AccelCheckpointIO

    return AccelCheckpointIO().save_checkpoint({}, "unused.ckpt", storage_options={"a": 1})


@case("lightning-checkpoint-missing", accel.AcceleratorFileNotFoundError)
def _lightning_checkpoint_missing(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.lightning import AccelCheckpointIO

    return AccelCheckpointIO().load_checkpoint("missing.ckpt")


# Ray Train (accel.integrations.ray) ----------------------------------------------------
# Each case but the first imports the module inside: it imports Ray, which only the
# environments of `bash scripts/test ray` have (the cases carry the `ray` marker).


@case("ray-not-installed", ModuleNotFoundError)
def _ray_not_installed(mp: pytest.MonkeyPatch) -> object:
    mp.setitem(sys.modules, "ray", None)  # as if not installed, wherever this runs
    mp.delitem(sys.modules, "accel.integrations.ray", raising=False)
    return importlib.import_module("accel.integrations.ray")


@case("ray-accelerator-unknown", accel.AcceleratorNotFoundError, needs_ray=True)
def _ray_accelerator_unknown(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.ray import torch_config

    return torch_config("quantum", registry=isolated_registry())


@case("ray-backend-unknown-to-ray", DistributedSetupError, needs_ray=True)
def _ray_backend_unknown_to_ray(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.ray import torch_config

    registry = isolated_registry(_plugin(distributed_backend=lambda self: "vendorccl"))
    return torch_config("npu", registry=registry)


@case("ray-backend-xla", DistributedSetupError, needs_ray=True)
def _ray_backend_xla(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.ray import torch_config

    registry = isolated_registry(_plugin(distributed_backend=lambda self: "xla"))
    return torch_config("npu", registry=registry)


@case("ray-outside-train-function", RuntimeError, needs_ray=True)
def _ray_outside_train_function(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.ray import prepare_model

    return prepare_model(TiedLM(), accelerator="cpu")


def _prepare_in_a_worker_of_two(mp: pytest.MonkeyPatch, backend: str) -> object:
    """``prepare_model`` in a worker of two whose group Ray started with its default,
    gloo (here a world of one in memory), for a plugin declaring ``backend``."""
    import ray.train

    from accel.integrations.ray import prepare_model

    for name in (*launchers.TORCHRUN_VARIABLES, "LOCAL_WORLD_SIZE"):
        mp.delenv(name, raising=False)
    worker = types.SimpleNamespace(get_world_size=lambda: 2, get_world_rank=lambda: 0)
    mp.setattr(ray.train, "get_context", lambda: worker)
    registry = isolated_registry(_plugin(distributed_backend=lambda self: backend))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return prepare_model(TiedLM(), accelerator=registry.get_accelerator("npu"))
    finally:
        accel.distributed.destroy_process_group(barrier=False)


@case("ray-group-backend-mismatch", DistributedSetupError, needs_ray=True)
def _ray_group_backend_mismatch(mp: pytest.MonkeyPatch) -> object:
    return _prepare_in_a_worker_of_two(mp, "hccl")  # one Ray registers: torch_config works


@case("ray-group-backend-ray-cannot-start", DistributedSetupError, needs_ray=True)
def _ray_group_backend_ray_cannot_start(mp: pytest.MonkeyPatch) -> object:
    return _prepare_in_a_worker_of_two(mp, "vendorccl")


@case("ray-group-backend-xla", DistributedSetupError, needs_ray=True)
def _ray_group_backend_xla(mp: pytest.MonkeyPatch) -> object:
    return _prepare_in_a_worker_of_two(mp, "xla")


@case("ray-loader-not-a-dataloader", accel.AcceleratorTypeError, needs_ray=True)
def _ray_loader_not_a_dataloader(mp: pytest.MonkeyPatch) -> object:
    from accel.integrations.ray import prepare_data_loader

    return prepare_data_loader([torch.zeros(2)], accelerator="cpu")


@case("ray-loader-own-sampler", accel.AcceleratorValueError, needs_ray=True)
def _ray_loader_own_sampler(mp: pytest.MonkeyPatch) -> object:
    from torch.utils.data import DataLoader, WeightedRandomSampler

    from accel.integrations.ray import prepare_data_loader

    sampler = WeightedRandomSampler([1.0, 2.0], num_samples=2)
    return prepare_data_loader(DataLoader(range(2), sampler=sampler), accelerator="cpu")


# -- the tests -------------------------------------------------------------------------


def _params() -> list[Any]:
    params = []
    for item in CASES.values():
        marks = []
        if item.bug is not None:
            marks.append(pytest.mark.xfail(strict=True, reason=f"bug: {item.bug}"))
        if item.needs_notes:
            marks.append(
                pytest.mark.skipif(
                    sys.version_info < (3, 11), reason="exception notes need Python 3.11"
                )
            )
        if item.needs_ray:
            marks.append(pytest.mark.ray)
        params.append(pytest.param(item, id=item.id, marks=marks))
    return params


def test_the_table_and_the_cases_have_the_same_ids() -> None:
    documented = set(doc_rows())
    tested = set(CASES)
    assert documented - tested == set(), "rows in docs/errors.md without a case here"
    assert tested - documented == set(), "cases here without a row in docs/errors.md"


def test_the_table_is_well_formed() -> None:
    rows = doc_rows()
    assert len(rows) >= 30
    for row in rows.values():
        assert SLUG.match(row.id), f"ID {row.id!r} is not a short slug"
        if row.is_error:
            assert row.error_type, f"{row.id}: the Error column names no exception"
            assert row.fragments, f"{row.id}: Message says quotes nothing"
        else:
            assert row.message == NOT_AN_ERROR, f"{row.id}: not an error, so no message"


def test_the_known_gaps_are_the_expected_failures() -> None:
    assert doc_known_gaps() == {item.id for item in CASES.values() if item.bug is not None}


def _as_printed(exc: BaseException) -> str:
    """The message and the notes, as a traceback shows them."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


@pytest.mark.parametrize("item", _params())
def test_bad_input(item: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    row = doc_rows().get(item.id)
    if row is None:
        pytest.fail(f"{item.id} has no row in docs/errors.md")
    expected = item.expected
    documented = row.error_type
    assert documented == (expected.__name__ if expected else None), (
        f"{item.id}: docs/errors.md says {row.error!r}, the case expects {expected}"
    )

    if expected is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            item.trigger(monkeypatch)
        assert not [w for w in caught if issubclass(w.category, accel.PluginWarning)]
        return

    if issubclass(expected, Warning):
        with pytest.warns(expected) as record:
            item.trigger(monkeypatch)
        texts = [str(w.message) for w in record if issubclass(w.category, expected)]
        # Every warning accel gives points at the user's line: here, the trigger's.
        places = {(w.filename, w.lineno) for w in record if issubclass(w.category, expected)}
        assert {filename for filename, _ in places} == {__file__}, (
            f"{item.id}: the warning points at {sorted(places)}, not at {__file__}"
        )
        for fragment in row.fragments:
            assert any(fragment in text for text in texts), (
                f"{item.id}: no {expected.__name__} says {fragment!r}; got {texts}"
            )
        return

    with pytest.raises(expected) as info:
        item.trigger(monkeypatch)
    # The documented class exactly, not a subclass of it: the page names what is raised.
    assert type(info.value) is expected, (
        f"{item.id}: docs/errors.md says {expected.__name__}, accel raised "
        f"{type(info.value).__name__}"
    )
    printed = _as_printed(info.value)
    for fragment in row.fragments:
        assert fragment in printed, f"{item.id}: message lacks {fragment!r}:\n{printed}"
