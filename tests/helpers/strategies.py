"""Hypothesis strategies for random module trees with ties, and the checks on them.

`module_trees()` builds small `nn.Module` trees (plain modules, ModuleList,
ModuleDict, Sequential; Linear, Embedding, LayerNorm and raw parameter/buffer
holders as leaves), then ties some parameter slots to another slot's Parameter,
shares some buffer tensors between slots, registers a submodule a second time
(an alias, not a tie), freezes some parameters, gives some a `.grad`, and picks
a dtype per tensor. Every tensor has at most a handful of elements, so a move is
cheap. Values come from a seeded generator: an example replays exactly.

`ModelState.capture()` records what a move may change, by reference (which object
sits in which slot) and by value (clones), so a test can say "identical to
before" (`assert_restored`) or "the same model, moved" (`assert_moved`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn

import accel
from accel.tying import count_unique_parameters, empty_duplicate_slots, find_tied_parameters
from helpers.registries import isolated_registry

ALL_PARAM_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INT_BUFFER_DTYPE = torch.int64


class RandomRoot(nn.Module):
    """The root of a generated tree; children are registered as attributes."""


class RawHolder(nn.Module):
    """A leaf holding parameters and buffers registered by hand."""


@dataclass
class _Builder:
    draw: Callable[[st.SearchStrategy[Any]], Any]
    generator: torch.Generator
    param_dtypes: tuple[torch.dtype, ...]
    max_depth: int

    def __post_init__(self) -> None:
        self.modules: list[nn.Module] = []

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if dtype.is_floating_point:
            values = torch.randn(shape, generator=self.generator, dtype=torch.float64)
            return values.to(dtype)
        return torch.randint(-50, 50, shape, generator=self.generator, dtype=dtype)

    def shape(self) -> tuple[int, ...]:
        return tuple(self.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))

    def size(self) -> int:
        return self.draw(st.integers(1, 3))

    def raw_holder(self) -> nn.Module:
        holder = RawHolder()
        for index in range(self.draw(st.integers(0, 3))):
            dtype = self.draw(st.sampled_from(self.param_dtypes))
            value = self.tensor(self.shape(), dtype)
            parameter = None if self.draw(st.integers(0, 7)) == 0 else nn.Parameter(value)
            holder.register_parameter(f"p{index}", parameter)
        for index in range(self.draw(st.integers(0, 2))):
            dtype = self.draw(st.sampled_from((*self.param_dtypes, INT_BUFFER_DTYPE)))
            holder.register_buffer(
                f"b{index}",
                self.tensor(self.shape(), dtype),
                persistent=self.draw(st.booleans()),
            )
        return holder

    def leaf(self) -> nn.Module:
        kind = self.draw(st.sampled_from(("linear", "embedding", "layernorm", "raw")))
        if kind == "raw":
            return self.raw_holder()
        if kind == "linear":
            module: nn.Module = nn.Linear(self.size(), self.size(), bias=self.draw(st.booleans()))
        elif kind == "embedding":
            module = nn.Embedding(self.size(), self.size())
        else:
            module = nn.LayerNorm(self.size(), elementwise_affine=self.draw(st.booleans()))
        # Replace torch's random init with values from our seeded generator.
        dtype = self.draw(st.sampled_from(self.param_dtypes))
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                module._parameters[name] = nn.Parameter(self.tensor(tuple(parameter.shape), dtype))
        return module

    def node(self, depth: int) -> nn.Module:
        kinds = ["leaf"]
        if depth < self.max_depth:
            kinds += ["plain", "list", "dict", "sequential"]
        kind = self.draw(st.sampled_from(kinds))
        module: nn.Module
        if kind == "leaf":
            module = self.leaf()
        else:
            children = [self.node(depth + 1) for _ in range(self.draw(st.integers(1, 3)))]
            if kind == "plain":
                module = nn.Module()
                for index, child in enumerate(children):
                    module.add_module(f"c{index}", child)
            elif kind == "list":
                module = nn.ModuleList(children)
            elif kind == "dict":
                module = nn.ModuleDict({f"k{i}": child for i, child in enumerate(children)})
            else:
                module = nn.Sequential(*children)
        self.modules.append(module)
        return module


def _slots(model: nn.Module, kind: str) -> list[tuple[nn.Module, str]]:
    found = []
    for module in model.modules():
        registry = module._parameters if kind == "parameter" else module._buffers
        found.extend((module, name) for name, value in registry.items() if value is not None)
    return found


@st.composite
def module_trees(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    *,
    param_dtypes: tuple[torch.dtype, ...] = ALL_PARAM_DTYPES,
    max_depth: int = 3,
    parameter_as_buffer: bool = False,
) -> RandomRoot:
    """A random, tiny module tree with random ties, frozen weights, grads and dtypes.

    :param parameter_as_buffer: also register one Parameter as a buffer of another
        module (one object in a parameter slot and a buffer slot).
    """
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    builder = _Builder(draw, generator, param_dtypes, max_depth)
    root = RandomRoot()
    for index in range(draw(st.integers(1, 3))):
        root.add_module(f"m{index}", builder.node(1))

    # Ties: a parameter slot takes another slot's Parameter object (shapes may
    # differ: nothing runs forward, and a tie is about object identity).
    parameter_slots = _slots(root, "parameter")
    if len(parameter_slots) >= 2:
        for _ in range(draw(st.integers(0, 3))):
            (src_module, src_name), (dst_module, dst_name) = draw(
                st.lists(st.sampled_from(parameter_slots), min_size=2, max_size=2, unique=True)
            )
            dst_module._parameters[dst_name] = src_module._parameters[src_name]
    buffer_slots = _slots(root, "buffer")
    if len(buffer_slots) >= 2:
        for _ in range(draw(st.integers(0, 2))):
            (src_module, src_name), (dst_module, dst_name) = draw(
                st.lists(st.sampled_from(buffer_slots), min_size=2, max_size=2, unique=True)
            )
            dst_module._buffers[dst_name] = src_module._buffers[src_name]

    if parameter_as_buffer:
        if not parameter_slots:
            root.register_parameter("shared", nn.Parameter(builder.tensor((2,), torch.float32)))
            parameter_slots = _slots(root, "parameter")
        module, name = draw(st.sampled_from(parameter_slots))
        holder = draw(st.sampled_from([root, *builder.modules]))
        holder.register_buffer("parameter_as_buffer", module._parameters[name])

    # A whole submodule registered under a second name: an alias, not a tie. The
    # new parent is outside the alias's own subtree, so the tree stays acyclic.
    if builder.modules and draw(st.integers(0, 3)) == 0:
        alias = draw(st.sampled_from(builder.modules))
        inside = {id(module) for module in alias.modules()}
        parents = [root, *(m for m in builder.modules if id(m) not in inside)]
        parent = draw(st.sampled_from(parents))
        if not isinstance(parent, (nn.ModuleList, nn.Sequential)):
            parent.add_module("alias", alias)

    for parameter in {id(p): p for p in root.parameters()}.values():
        if draw(st.integers(0, 3)) == 0:
            parameter.requires_grad_(False)
        if draw(st.integers(0, 2)) == 0:
            parameter.grad = builder.tensor(tuple(parameter.shape), parameter.dtype)
    return root


# -- observing a model --------------------------------------------------------------


def qualified_slots(model: nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    """Every non-empty parameter and buffer slot by qualified name, duplicates included."""
    found: dict[str, tuple[str, torch.Tensor]] = {}
    for prefix, module in model.named_modules():
        for kind, registry in (("parameter", module._parameters), ("buffer", module._buffers)):
            for name, tensor in registry.items():
                if tensor is not None:
                    found[f"{prefix}.{name}" if prefix else name] = (kind, tensor)
    return found


def full_partition(model: nn.Module) -> frozenset[tuple[str, tuple[str, ...]]]:
    """Slot names grouped by the object they hold, singletons included."""
    groups: dict[int, tuple[str, list[str]]] = {}
    for name, (kind, tensor) in qualified_slots(model).items():
        groups.setdefault(id(tensor), (kind, []))[1].append(name)
    return frozenset((kind, tuple(names)) for kind, names in groups.values())


def tied_groups(model: nn.Module) -> set[tuple[str, tuple[str, ...]]]:
    return {(group.kind, group.names) for group in find_tied_parameters(model)}


def _clone_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


@dataclass
class _TensorRecord:
    kind: str
    obj: torch.Tensor
    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]
    requires_grad: bool
    values: torch.Tensor | None
    data_ptr: int
    grad: torch.Tensor | None
    grad_values: torch.Tensor | None
    grad_data_ptr: int | None


@dataclass
class ModelState:
    """What a model looked like: slot objects by reference, tensors by value."""

    #: (module, its _parameters, _buffers and _modules items) for every module.
    modules: list[tuple[nn.Module, list[tuple[str, Any]], list[tuple[str, Any]], list[Any]]]
    tensors: dict[str, _TensorRecord]
    partition: frozenset[tuple[str, tuple[str, ...]]]
    tied: set[tuple[str, tuple[str, ...]]]
    unique_parameters: int

    @classmethod
    def capture(cls, model: nn.Module, *, values: bool = True) -> ModelState:
        modules = [
            (
                module,
                list(module._parameters.items()),
                list(module._buffers.items()),
                list(module._modules.items()),
            )
            for module in model.modules()
        ]
        tensors = {}
        for name, (kind, tensor) in qualified_slots(model).items():
            grad = tensor.grad if kind == "parameter" else None
            comparable = values and tensor.device.type != "meta"
            tensors[name] = _TensorRecord(
                kind=kind,
                obj=tensor,
                device=tensor.device,
                dtype=tensor.dtype,
                shape=tuple(tensor.shape),
                requires_grad=tensor.requires_grad,
                values=_clone_cpu(tensor) if comparable else None,
                data_ptr=tensor.data_ptr() if tensor.device.type == "cpu" else 0,
                grad=grad,
                grad_values=None if grad is None or not comparable else _clone_cpu(grad),
                grad_data_ptr=None
                if grad is None or grad.device.type != "cpu"
                else grad.data_ptr(),
            )
        return cls(
            modules,
            tensors,
            full_partition(model),
            tied_groups(model),
            count_unique_parameters(model),
        )


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_clone_cpu(a), b)


def assert_restored(model: nn.Module, before: ModelState) -> None:
    """`model` is exactly as captured: the same objects in every slot, same tensors."""
    modules_now = list(model.modules())
    assert len(modules_now) == len(before.modules)
    for now, (module, parameters, buffers, submodules) in zip(
        modules_now, before.modules, strict=True
    ):
        assert now is module
        for saved, current in (
            (parameters, module._parameters),
            (buffers, module._buffers),
            (submodules, module._modules),
        ):
            assert [name for name, _ in saved] == list(current)
            for name, obj in saved:
                assert current[name] is obj, f"{type(module).__name__}.{name} was replaced"
    assert full_partition(model) == before.partition
    assert tied_groups(model) == before.tied
    assert count_unique_parameters(model) == before.unique_parameters
    slots = qualified_slots(model)
    assert set(slots) == set(before.tensors)
    for name, record in before.tensors.items():
        kind, tensor = slots[name]
        assert tensor is record.obj, name
        assert (tensor.device, tensor.dtype, tuple(tensor.shape)) == (
            record.device,
            record.dtype,
            record.shape,
        ), name
        assert tensor.requires_grad == record.requires_grad, name
        if record.device.type == "cpu":
            assert tensor.data_ptr() == record.data_ptr, f"{name}: storage not put back"
        if record.values is not None:
            assert _same_values(tensor, record.values), f"{name}: values changed"
        if kind == "parameter":
            assert tensor.grad is record.grad, f"{name}: .grad object replaced"
            if record.grad is not None:
                grad = record.grad
                assert grad.device == record.device and grad.dtype == record.dtype, name
                if record.grad_data_ptr is not None:
                    assert grad.data_ptr() == record.grad_data_ptr, f"{name}.grad storage"
                if record.grad_values is not None:
                    assert _same_values(grad, record.grad_values), f"{name}.grad values"


def assert_moved(
    model: nn.Module, before: ModelState, device: torch.device, *, values: bool
) -> None:
    """`model` is the captured model on `device`: same names, ties, counts, dtypes, values."""
    assert full_partition(model) == before.partition
    assert tied_groups(model) == before.tied
    assert count_unique_parameters(model) == before.unique_parameters
    for group in find_tied_parameters(model):
        first, *rest = group.tensors()
        assert all(tensor is first for tensor in rest), group.names
    slots = qualified_slots(model)
    assert set(slots) == set(before.tensors)
    for name, record in before.tensors.items():
        kind, tensor = slots[name]
        assert kind == record.kind, name
        assert tensor.device.type == device.type, f"{name} stayed on {tensor.device}"
        assert (tensor.dtype, tuple(tensor.shape)) == (record.dtype, record.shape), name
        assert tensor.requires_grad == record.requires_grad, name
        if kind == "parameter":
            assert isinstance(tensor, nn.Parameter), name
            assert (tensor.grad is None) == (record.grad is None), f"{name}.grad"
            if tensor.grad is not None:
                assert tensor.grad.device.type == device.type, f"{name}.grad device"
                assert tensor.grad.dtype == record.dtype, f"{name}.grad dtype"
        if values:
            assert record.values is not None
            assert _same_values(tensor, record.values), f"{name}: values changed"
            if record.grad_values is not None:
                assert tensor.grad is not None
                assert _same_values(tensor.grad, record.grad_values), f"{name}.grad values"


# -- injecting faults ------------------------------------------------------------------


class InjectedFault(RuntimeError):
    """The failure a property test injects into a move."""


def count_tensor_copies(model: nn.Module, *, tied_once: bool = False) -> int:
    """How many `Tensor.to` calls `model.to(...)` makes: one per slot, plus one per grad.

    Mirrors `Module._apply`: it recurses into each parent's children (so a module
    registered under two parents is converted twice) and visits every slot (so a
    tied Parameter is converted once per slot). With `tied_once`, as the TPU plugin
    moves: every slot of a tied group but one is emptied first, so each tied tensor
    is converted once.
    """
    if tied_once:
        groups = find_tied_parameters(model)
        saved = [(dict(m._parameters), dict(m._buffers), m) for m in model.modules()]
        empty_duplicate_slots(groups)
        try:
            return count_tensor_copies(model)
        finally:
            for parameters, buffers, module in saved:
                module._parameters.update(parameters)
                module._buffers.update(buffers)
    calls = sum(count_tensor_copies(child) for child in model.children())
    for parameter in model._parameters.values():
        if parameter is not None:
            calls += 1 + (parameter.grad is not None)
    return calls + sum(buffer is not None for buffer in model._buffers.values())


@contextlib.contextmanager
def failing_tensor_copy(fail_at: int) -> Iterator[list[int]]:
    """Make the `fail_at`-th call of `Tensor.to` (1-based) raise :class:`InjectedFault`."""
    original = torch.Tensor.to
    calls = [0]

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == fail_at:
            raise InjectedFault(f"injected failure in tensor copy #{fail_at}")
        return original(self, *args, **kwargs)

    torch.Tensor.to = to  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        torch.Tensor.to = original  # type: ignore[method-assign]


class FaultPlugin:
    """A cross-cutting plugin (no accelerator of its own) failing at one point of a move."""

    def __init__(self, where: str) -> None:
        self.where = where

    @accel.hookimpl
    def pre_move_hook(self) -> None:
        if self.where == "pre_move_hook":
            raise InjectedFault("injected failure in pre_move_hook")

    @accel.hookimpl(wrapper=True)
    def model_to_device(self) -> Any:
        moved = yield
        if self.where == "model_to_device wrapper":
            raise InjectedFault("injected failure after the move, in a wrapper")
        return moved

    @accel.hookimpl(tryfirst=True)
    def post_move_hook(self) -> None:
        if self.where == "post_move_hook (first)":
            raise InjectedFault("injected failure in post_move_hook, before the TPU plugin's")

    @accel.hookimpl(trylast=True, specname="post_move_hook")
    def post_move_hook_last(self, model: nn.Module) -> None:
        if self.where == "post_move_hook (last)":
            raise InjectedFault("injected failure in post_move_hook, after the TPU plugin's")
        if self.where == "post_move_hook (mutates, then fails)":
            # Change everything a restore has to put back, then fail.
            for parameter in model.parameters():
                parameter.requires_grad_(not parameter.requires_grad)
                parameter.grad = None
            for module in model.modules():
                module._buffers.clear()
            model.add_module("intruder", nn.Linear(1, 1))
            raise InjectedFault("injected failure after mutating the moved model")


HOOK_FAULTS = (
    "pre_move_hook",
    "model_to_device wrapper",
    "post_move_hook (first)",
    "post_move_hook (last)",
    "post_move_hook (mutates, then fails)",
)


def make_accelerator(plugin: object, name: str = "tpu", *extra: object) -> accel.Accelerator:
    return isolated_registry(plugin, *extra, builtins=False).get_accelerator(name)


def assert_noted_restored(exc: BaseException) -> None:
    notes = getattr(exc, "__notes__", [])
    assert any("restored" in note for note in notes), notes


def untie_on_tie_weights(model: nn.Module) -> None:
    """Give `model` a `tie_weights()` that breaks tying validation on purpose.

    It unties the first tied parameter group if there is one; otherwise it adds a
    new Parameter, which changes the unique-parameter count.
    """

    def tie_weights() -> None:
        groups = [g for g in find_tied_parameters(model) if g.kind == "parameter"]
        if groups:
            module, name, _ = groups[0].slots[-1]
            module._parameters[name] = nn.Parameter(module._parameters[name].detach().clone())
        else:
            model.register_parameter("added_by_tie_weights", nn.Parameter(torch.zeros(1)))

    # An instance attribute: nn.Module stores plain callables in __dict__.
    model.tie_weights = tie_weights


@contextlib.contextmanager
def torch_future_flag(name: str, value: bool) -> Iterator[None]:
    """Set a `torch.__future__` flag (e.g. "overwrite_module_params_on_conversion")."""
    getter = getattr(torch.__future__, f"get_{name}")
    setter = getattr(torch.__future__, f"set_{name}")
    before = getter()
    setter(value)
    try:
        yield
    finally:
        setter(before)
