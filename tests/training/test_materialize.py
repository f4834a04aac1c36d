"""acc.materialize in one process: a model built on ``meta`` allocated on the device
with its ties, then initialized (each module's ``reset_parameters()``, or ``init``) or
loaded (a state dict, an ``acc.save`` file, a DCP directory), and every refusal, each
leaving the model as it was. ``model_to_device`` of a model on ``meta`` points here.

The PrivateUse1 case runs in a child process (``scripts/materialize_privateuse1.py``):
renaming the PrivateUse1 backend lasts for the process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import accel
import accel.distributed as adist
from accel.plugins.torch_device import NO_PLUGIN
from helpers import python_device
from helpers.distributed import no_launcher_and_no_group  # noqa: F401  (an autouse fixture)
from helpers.fakes import FakeAccelerator
from helpers.models import OwnTieWeights, RotaryCache, RotaryTiedLM, ThreeWayTie, TiedLM
from helpers.processes import last_json_line, run_python
from helpers.registries import isolated_registry

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TESTS = Path(__file__).resolve().parents[1]

TIED_MODELS = [TiedLM, ThreeWayTie, OwnTieWeights]


@pytest.fixture(autouse=True)
def quiet_dcp() -> Iterator[None]:
    with warnings.catch_warnings():
        # DCP says, on every call without a process group, that it runs without one.
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*process group is not initialized.*")
        yield


def _on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def _slots(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer slot, shared ones under each of their names."""
    return {
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),
    }


def _tie_groups(model: nn.Module) -> set[frozenset[str]]:
    """The slots that hold one tensor, for each tensor held under several names."""
    names: dict[int, set[str]] = {}
    for name, tensor in _slots(model).items():
        names.setdefault(id(tensor), set()).add(name)
    return {frozenset(group) for group in names.values() if len(group) > 1}


def _devices(model: nn.Module) -> set[str]:
    return {tensor.device.type for tensor in _slots(model).values()}


def _assert_as_it_was(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    """Every slot holds the very tensor it held before, on ``meta``."""
    now = _slots(model)
    assert now.keys() == before.keys()
    assert [name for name in now if now[name] is not before[name]] == []
    assert _devices(model) == {"meta"}


def _assert_equal_values(model: nn.Module, reference: nn.Module) -> None:
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    differ = [name for name in ours if not torch.equal(ours[name].cpu(), theirs[name].cpu())]
    assert differ == []


class _Resets:
    """Counts every reset_parameters() of the module classes the tests build."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for cls in (nn.Linear, nn.Embedding):
            real = cls.reset_parameters

            def counted(module: nn.Module, _real: Any = real) -> None:
                self.calls.append(type(module).__name__)
                _real(module)

            monkeypatch.setattr(cls, "reset_parameters", counted)


# -- ties kept where to_empty unties ----------------------------------------------------


@pytest.mark.parametrize("build", TIED_MODELS, ids=lambda cls: cls.__name__)
def test_a_tied_model_built_on_meta_materializes_with_each_tie_one_parameter(
    acc: accel.Accelerator, build: Callable[[], nn.Module]
) -> None:
    model = _on_meta(build)
    groups, count = _tie_groups(model), len(list(model.parameters()))
    assert groups  # tied on meta, as built

    assert acc.materialize(model) is model

    assert _tie_groups(model) == groups
    slots = _slots(model)
    for group in groups:
        held = {id(slots[name]) for name in group}
        assert len(held) == 1 and isinstance(slots[next(iter(group))], nn.Parameter)
    assert len(list(model.parameters())) == count
    assert _devices(model) == {"cpu"}


@pytest.mark.parametrize("build", TIED_MODELS, ids=lambda cls: cls.__name__)
def test_torchs_to_empty_unties_the_same_models(build: Callable[[], nn.Module]) -> None:
    # What materialize fixes: torch's own way gives every slot a Parameter of its own.
    model = _on_meta(build)
    count = len(list(model.parameters()))
    model.to_empty(device="cpu")
    assert _tie_groups(model) == set()
    assert len(list(model.parameters())) > count


def test_the_models_own_tie_weights_is_called_after_the_allocation(
    acc: accel.Accelerator,
) -> None:
    model = _on_meta(OwnTieWeights)
    assert model.tie_weights_calls == 1  # in __init__
    acc.materialize(model)
    assert model.tie_weights_calls == 2
    assert model.decoder.weight is model.encoder.weight
    assert model.encoder.weight.device.type == "cpu"


# -- values: the default init and a given init, as an eager build ----------------------


class _Mixed(nn.Module):
    """Modules whose reset_parameters() draw in other ways, and buffers it resets."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.norm = nn.LayerNorm(6)
        self.conv = nn.Conv1d(6, 6, 3)
        self.batch_norm = nn.BatchNorm1d(6)
        self.lstm = nn.LSTM(6, 5, batch_first=True)
        self.head = nn.Linear(5, 10)


@pytest.mark.parametrize(
    "build",
    [
        *TIED_MODELS,
        _Mixed,
        pytest.param(lambda: nn.MultiheadAttention(8, 2), id="MultiheadAttention"),
    ],
    ids=lambda cls: cls.__name__.strip("_"),
)
def test_seeded_the_same_the_default_init_equals_an_eager_build(
    acc: accel.Accelerator, build: Callable[[], nn.Module]
) -> None:
    model = _on_meta(build)
    torch.manual_seed(11)
    acc.materialize(model)
    torch.manual_seed(11)
    eager = build()
    _assert_equal_values(model, eager)
    torch.manual_seed(12)
    assert not torch.equal(_first(build()), _first(eager))  # the values are the seed's


def _first(model: nn.Module) -> torch.Tensor:
    return next(iter(model.state_dict().values()))


def _small_normal(model: nn.Module) -> None:
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(parameter)
        else:
            nn.init.normal_(parameter, std=0.02)


@pytest.mark.parametrize("build", TIED_MODELS, ids=lambda cls: cls.__name__)
def test_a_given_init_runs_instead_of_reset_parameters_with_values_as_eager_plus_init(
    acc: accel.Accelerator, build: Callable[[], nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(5)
    _small_normal(eager)
    model = _on_meta(build)
    resets, seen = _Resets(monkeypatch), []

    torch.manual_seed(5)
    acc.materialize(model, init=lambda m: (seen.append(m), _small_normal(m)))

    assert seen == [model] and resets.calls == []
    _assert_equal_values(model, eager)
    assert _tie_groups(model) == _tie_groups(eager)


# -- tensors nothing wrote, or left on meta ---------------------------------------------


class _TiedWithScale(TiedLM):
    """A Parameter of a module without reset_parameters() (the root)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))


def _weights_only(model: nn.Module) -> None:
    for name, parameter in model.named_parameters():
        if not name.endswith("bias"):
            nn.init.normal_(parameter)


def _new_meta_bias(model: nn.Module) -> None:
    _small_normal(model)
    model.body.bias = nn.Parameter(torch.empty(8, device="meta"))


@pytest.mark.parametrize(
    ("build", "init", "named", "said"),
    [
        (_TiedWithScale, None, "scale", r"reset_parameters\(\) wrote no values into scale"),
        (RotaryTiedLM, None, "rotary.cos", "wrote no values into rotary.cos"),
        (TiedLM, _weights_only, "body.bias", r"init= \(_weights_only\) wrote no values"),
        (TiedLM, _new_meta_bias, "body.bias", "body.bias is still on meta after init="),
    ],
    ids=["no-reset-parameters", "rotary-cache", "init-skips-a-bias", "init-leaves-meta"],
)
def test_a_tensor_nothing_wrote_is_named_and_the_model_stays_on_meta_as_it_was(
    acc: accel.Accelerator,
    build: Callable[[], nn.Module],
    init: Callable[[nn.Module], None] | None,
    named: str,
    said: str,
) -> None:
    model = _on_meta(build)
    before, groups = _slots(model), _tie_groups(model)
    with pytest.raises(accel.AcceleratorValueError, match=said) as raised:
        acc.materialize(model, init=init)
    assert named in str(raised.value)
    assert any("restored as it was" in note for note in raised.value.__notes__)
    _assert_as_it_was(model, before)
    assert _tie_groups(model) == groups == {frozenset({"embed.weight", "head.weight"})}


def test_an_init_that_computes_the_rotary_cache_again_is_enough(acc: accel.Accelerator) -> None:
    model = _on_meta(RotaryTiedLM)

    def init(m: nn.Module) -> None:
        _small_normal(m)
        m.rotary.cos.copy_(m.rotary.table(m.rotary.cos.device))

    acc.materialize(model, init=init)
    assert torch.equal(model.rotary.cos, RotaryCache().cos)
    assert model.head.weight is model.embed.weight


def test_tensors_already_off_meta_keep_their_values(acc: accel.Accelerator) -> None:
    model = _on_meta(lambda: RotaryTiedLM(cache_device="cpu"))
    assert model.rotary.cos.device.type == "cpu" and model.embed.weight.is_meta
    with torch.no_grad():
        model.rotary.cos.mul_(3)  # values no init would compute
    cache = model.rotary.cos.clone()
    torch.manual_seed(2)
    acc.materialize(model)
    torch.manual_seed(2)
    eager = TiedLM()
    assert torch.equal(model.rotary.cos, cache)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in eager.state_dict().items())


# -- an init that unties ----------------------------------------------------------------


def _untie_the_head(model: nn.Module) -> None:
    _small_normal(model)
    model.head.weight = nn.Parameter(torch.zeros(16, 8))


def test_an_init_that_unties_is_a_weight_tying_error_and_the_model_is_restored(
    acc: accel.Accelerator,
) -> None:
    model = _on_meta(TiedLM)
    before = _slots(model)
    with pytest.raises(accel.WeightTyingError, match="tied weights came apart") as raised:
        acc.materialize(model, init=_untie_the_head)
    assert raised.value.broken_groups == [("embed.weight", "head.weight")]
    assert (raised.value.count_before, raised.value.count_after) == (3, 4)
    _assert_as_it_was(model, before)
    assert model.head.weight is model.embed.weight


def test_under_warn_an_init_that_unties_is_a_tying_warning(
    registry: accel.AcceleratorRegistry,
) -> None:
    model = _on_meta(TiedLM)
    acc = registry.get_accelerator("cpu", tie_check="warn")
    with pytest.warns(accel.TyingWarning, match="tied weights came apart") as record:
        acc.materialize(model, init=_untie_the_head)
    assert [w.filename for w in record if w.category is accel.TyingWarning] == [__file__]
    assert _devices(model) == {"cpu"}


def test_under_warn_the_ties_of_before_are_kept(registry: accel.AcceleratorRegistry) -> None:
    model = _on_meta(TiedLM)
    acc = registry.get_accelerator("cpu", tie_check="warn")
    with pytest.warns(accel.TyingWarning):
        acc.materialize(model, init=_untie_the_head)
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 3


def test_the_tying_error_of_an_init_names_the_init(acc: accel.Accelerator) -> None:
    with pytest.raises(accel.WeightTyingError) as raised:
        acc.materialize(_on_meta(TiedLM), init=_untie_the_head)
    assert "init=" in str(raised.value)
    assert "post_move_hook" not in str(raised.value)


# -- a failing init ---------------------------------------------------------------------


def test_an_init_that_raises_propagates_with_accels_note_and_the_model_back_on_meta(
    acc: accel.Accelerator,
) -> None:
    model = _on_meta(ThreeWayTie)
    before, groups = _slots(model), _tie_groups(model)
    failure = RuntimeError("init broke")

    def init(m: nn.Module) -> None:
        nn.init.zeros_(m.shared.weight)  # part written first
        raise failure

    with pytest.raises(RuntimeError) as raised:
        acc.materialize(model, init=init)
    assert raised.value is failure
    assert [n for n in failure.__notes__ if "materializing the model on cpu failed" in n]
    _assert_as_it_was(model, before)
    assert _tie_groups(model) == groups


# -- refusals ---------------------------------------------------------------------------


def test_a_model_with_nothing_on_meta_is_refused_and_left_alone(acc: accel.Accelerator) -> None:
    model = TiedLM()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(accel.AcceleratorValueError, match=r"no tensor on meta.*model_to_device"):
        acc.materialize(model)
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())


@pytest.mark.parametrize(
    ("model", "arguments", "said"),
    [
        ("a model", {}, "expects a torch.nn.Module, got str"),
        (None, {"init": _small_normal, "load": {}}, "init= and load= were both given"),
        (None, {"init": 3}, "init= must be a callable"),
        (None, {"load": 3}, "load= must be a state dict or the path"),
    ],
    ids=["not-a-module", "init-and-load", "init-not-callable", "load-of-a-number"],
)
def test_arguments_of_the_wrong_kind_are_type_errors(
    acc: accel.Accelerator, model: object, arguments: dict[str, Any], said: str
) -> None:
    target = _on_meta(TiedLM) if model is None else model
    before = _slots(target) if isinstance(target, nn.Module) else {}
    with pytest.raises(TypeError, match=said):
        acc.materialize(target, **arguments)  # type: ignore[arg-type]
    if isinstance(target, nn.Module):
        _assert_as_it_was(target, before)


def test_model_to_device_of_a_model_on_meta_names_materialize(acc: accel.Accelerator) -> None:
    model = _on_meta(TiedLM)
    before = _slots(model)
    with pytest.raises(accel.AcceleratorValueError, match=r"acc\.materialize") as raised:
        acc.model_to_device(model)
    assert "embed.weight" in str(raised.value)
    assert "to_empty() would untie it" in str(raised.value)
    _assert_as_it_was(model, before)
    assert model.head.weight is model.embed.weight


def test_a_real_model_still_moves_to_meta_and_materializes_back(acc: accel.Accelerator) -> None:
    meta = isolated_registry(FakeAccelerator("metadev", device="meta")).get_accelerator("metadev")
    model = TiedLM()
    state = acc.state_dict(model)
    moved = meta.model_to_device(model)
    assert _devices(moved) == {"meta"} and moved.head.weight is moved.embed.weight
    acc.materialize(moved, load=state)
    assert moved.head.weight is moved.embed.weight
    assert all(torch.equal(moved.state_dict()[k], v) for k, v in state.items())


# -- load: a state dict or a checkpoint, filled in place --------------------------------


@pytest.fixture
def trained(acc: accel.Accelerator) -> TiedLM:
    """A tied LM one SGD step away from its init, so loaded values are no init's."""
    torch.manual_seed(3)
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.tensor([[1, 2, 3]])).square().mean().backward()
    optimizer.step()
    return model


def _state_dict(acc: accel.Accelerator, model: nn.Module, _: Path) -> Any:
    return acc.state_dict(model)


def _accel_file(acc: accel.Accelerator, model: nn.Module, where: Path) -> Any:
    acc.save({"model": model, "step": 3}, where / "step-3.pt")
    return where / "step-3.pt"


def _bare_file(acc: accel.Accelerator, model: nn.Module, where: Path) -> Any:
    torch.save(model.state_dict(), where / "weights.pt")
    return str(where / "weights.pt")


def _dcp_directory(acc: accel.Accelerator, model: nn.Module, where: Path) -> Any:
    dcp.save(model.state_dict(), checkpoint_id=str(where / "dcp"))  # no process group
    return where / "dcp"


def _save_sharded(acc: accel.Accelerator, model: nn.Module, where: Path) -> Any:
    adist.save_sharded({"model": model, "step": 3}, where / "sharded")
    return where / "sharded"


def _save_sharded_in_a_world_of_one(acc: accel.Accelerator, model: nn.Module, where: Path) -> Any:
    context = adist.init_process_group("cpu")  # torn down by no_launcher_and_no_group
    assert context.world_size == 1
    return _save_sharded(acc, model, where)


SOURCES = {
    "state-dict": _state_dict,
    "accel-save-file": _accel_file,
    "bare-state-dict-file": _bare_file,
    "dcp-directory": _dcp_directory,
    "save-sharded": _save_sharded,
    "save-sharded-world-of-one": _save_sharded_in_a_world_of_one,
}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_load_fills_the_model_with_the_sources_values_and_initializes_nothing(
    acc: accel.Accelerator,
    trained: TiedLM,
    source: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load = source(acc, trained, tmp_path)
    model = _on_meta(TiedLM)
    resets = _Resets(monkeypatch)
    generator = torch.get_rng_state()

    assert acc.materialize(model, load=load) is model

    assert resets.calls == [] and torch.equal(torch.get_rng_state(), generator)
    _assert_equal_values(model, trained)
    assert model.head.weight is model.embed.weight and len(list(model.parameters())) == 3
    assert _devices(model) == {"cpu"}


def test_a_state_dict_is_copied_into_the_models_own_tensors(
    acc: accel.Accelerator, trained: TiedLM
) -> None:
    state = acc.state_dict(trained)  # of a CPU model: its own tensors
    values = {name: tensor.clone() for name, tensor in state.items()}
    model = acc.materialize(_on_meta(TiedLM), load=state)
    with torch.no_grad():
        for tensor in state.values():
            tensor.add_(1.0)
    # The model holds tensors of its own, not the source's.
    assert all(torch.equal(model.state_dict()[k], v) for k, v in values.items())


@pytest.mark.parametrize("kept", ["embed.weight", "head.weight"])
@pytest.mark.parametrize("form", ["state-dict", "dcp-directory"])
def test_a_checkpoint_holding_one_of_the_tied_names_is_enough(
    acc: accel.Accelerator, trained: TiedLM, kept: str, form: str, tmp_path: Path
) -> None:
    dropped = ({"embed.weight", "head.weight"} - {kept}).pop()
    state = {k: v for k, v in acc.state_dict(trained).items() if k != dropped}
    load: Any = state
    if form == "dcp-directory":
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
        load = tmp_path / "dcp"
    model = acc.materialize(_on_meta(TiedLM), load=load)
    assert model.head.weight is model.embed.weight
    _assert_equal_values(model, trained)


@pytest.mark.parametrize("form", ["state-dict", "dcp-directory"])
def test_a_checkpoint_missing_a_tensor_is_a_key_error_naming_it_and_nothing_changes(
    acc: accel.Accelerator, trained: TiedLM, form: str, tmp_path: Path
) -> None:
    state = {k: v for k, v in acc.state_dict(trained).items() if k != "body.bias"}
    load: Any = state
    if form == "dcp-directory":
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
        load = tmp_path / "dcp"
    model = _on_meta(TiedLM)
    before = _slots(model)
    with pytest.raises(KeyError, match=r"no entry for body\.bias; nothing was loaded"):
        acc.materialize(model, load=load)
    _assert_as_it_was(model, before)
    assert model.head.weight is model.embed.weight


@pytest.mark.parametrize("what", ["nothing", "a directory without .metadata"])
def test_load_of_a_path_that_holds_no_checkpoint_is_file_not_found(
    acc: accel.Accelerator, what: str, tmp_path: Path
) -> None:
    path = tmp_path / "missing.pt"
    if what != "nothing":
        path = tmp_path / "empty"
        path.mkdir()
    model = _on_meta(TiedLM)
    before = _slots(model)
    with pytest.raises(FileNotFoundError, match="materialize: load= names") as raised:
        acc.materialize(model, load=path)
    assert str(path) in str(raised.value)
    _assert_as_it_was(model, before)


def test_load_of_a_file_holding_no_state_dict_is_a_type_error(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    torch.save([torch.zeros(2)], tmp_path / "a-list.pt")
    model = _on_meta(TiedLM)
    before = _slots(model)
    with pytest.raises(TypeError, match="holds a list, not a state dict"):
        acc.materialize(model, load=tmp_path / "a-list.pt")
    _assert_as_it_was(model, before)


@pytest.mark.parametrize("form", ["state-dict", "dcp-directory"])
def test_a_tensor_of_another_shape_is_a_typed_error_naming_it_and_nothing_changes(
    acc: accel.Accelerator, trained: TiedLM, form: str, tmp_path: Path
) -> None:
    state = {**acc.state_dict(trained), "body.bias": torch.ones(1)}
    load: Any = state
    if form == "dcp-directory":
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
        load = tmp_path / "dcp"
    model = _on_meta(TiedLM)
    before = _slots(model)
    with pytest.raises(BaseException, match=r"body\.bias") as raised:
        acc.materialize(model, load=load)
    assert isinstance(raised.value, Exception)  # one that except Exception catches
    _assert_as_it_was(model, before)


def test_a_file_is_loaded_memory_mapped_once(
    acc: accel.Accelerator, trained: TiedLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How the file is opened, not memory measured (benchmarks/ measures): torch.load with
    # mmap=True maps the file and reads each tensor's pages as it is copied in.
    path = _accel_file(acc, trained, tmp_path)
    calls: list[dict[str, Any]] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    model = acc.materialize(_on_meta(TiedLM), load=path)
    assert len(calls) == 1
    assert calls[0]["mmap"] is True and calls[0]["weights_only"] is True
    _assert_equal_values(model, trained)


# -- a PrivateUse1 backend, through the accelerator of a device without a plugin --------


@pytest.mark.skipif(
    not python_device.supported(),
    reason=(
        f"torch {torch.__version__} cannot register a PrivateUse1 backend from Python "
        f"(no _setup_privateuseone_for_python_backend; torch 2.10+ can)"
    ),
)
def test_on_a_privateuse1_backend_materialize_keeps_ties_and_values(tmp_path: Path) -> None:
    done = run_python(
        [SCRIPTS / "materialize_privateuse1.py", "npu", tmp_path],
        env={"PYTHONPATH": str(TESTS)},
        timeout=300,
    )
    result = last_json_line(done)

    assert result["accelerator"] == {"provider": NO_PLUGIN, "device": "npu:0"}
    assert result["to_empty"] == {"tied": False, "parameters": 4}  # torch's way unties
    for case in ("default", "init", "load"):
        assert result[case]["devices"] == ["npu"], case
        assert result[case]["tied"] is True and result[case]["parameters"] == 3, case
    assert result["three_way"] == {
        "devices": ["npu"],
        "slots_of_the_shared_weight": 3,
        "parameters": 2,
    }
    assert result["default"]["equal_to_eager_on_the_device"] is True
    assert result["default"]["equal_to_eager_on_cpu"] is True
    assert result["default"]["same_output_as_eager_on_cpu"] is True
    assert result["init"]["equal_to_eager_plus_init"] is True
    assert result["load"]["equal_to_source"] is True
    assert result["unwritten"]["error"] == "AcceleratorValueError"
    assert "rotary.cos" in result["unwritten"]["message"]
    assert result["unwritten"]["restored"] == {"same_tensors": True, "devices": ["meta"]}
