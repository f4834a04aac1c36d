"""FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) that keeps tied weights tied.

FSDP2 turns every parameter a ``fully_shard`` call manages into one sharded
parameter, and sets it into every module of that call that held it. A tie across two
calls (``fully_shard(embed)``, then ``fully_shard(head)``) therefore becomes two
parameters: torch 2.9 trains them apart without a word, later releases refuse. A tie
within one call (``fully_shard([embed, head])``) stays one parameter. So the helper
here shards the modules of each tie group together, then the root, and checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch.distributed import fsdp
from torch.distributed.device_mesh import init_device_mesh

from accel.distributed._data_parallel import check_model_on_device, running_context
from accel.distributed._errors import DistributedSetupError
from accel.distributed._structure import ModuleStructure, changed_in_place
from accel.errors import AcceleratorValueError, WeightTyingError
from accel.tying import TiedGroup, TieReport, TyingSnapshot, find_tied_parameters
from accel.tying._capture import RestorePoint, transact

if TYPE_CHECKING:
    from torch import nn

    from accel.distributed._process_group import DistributedContext

__all__ = ["fully_shard_tied", "plan_shard_units"]


def fully_shard_tied(
    model: nn.Module,
    modules: Iterable[nn.Module] = (),
    *,
    context: DistributedContext | None = None,
    mesh: Any = None,
    **options: Any,
) -> nn.Module:
    """Shard ``model`` with FSDP2, each of ``modules`` its own unit, ties kept.

    Every submodule in ``modules`` (say, each transformer block) gets its own
    ``fully_shard`` call, except that modules holding the same tied parameter are
    sharded together in one call (``fully_shard([embed, head])``), and a listed module
    tied to a parameter only the root holds is left to the root. The root is sharded
    last. Afterwards every tie of the model must still be one parameter.

    Move the model first with ``context.accelerator.model_to_device(model)``, or
    build it on ``meta`` and materialize it after sharding
    (``context.accelerator.materialize(model)``); build the optimizer on the sharded
    parameters.

    :param modules: submodules of ``model`` to shard as units of their own; none
        means the whole model is one unit.
    :param context: from :func:`init_process_group`; ``None`` means the current one.
    :param mesh: the :class:`~torch.distributed.device_mesh.DeviceMesh` to shard
        over; ``None`` means a 1-D mesh of every rank on ``context.device``'s type.
    :param options: passed on to every ``fully_shard`` call (``reshard_after_forward``,
        ``mp_policy``, ...).
    :returns: ``model``, now sharded (FSDP2 changes its class in place).
    :raises DistributedSetupError: no running process group, or an XLA one (shard
        with :func:`init_spmd` there).
    :raises ValueError: a module in ``modules`` is not a submodule of ``model``, or a
        parameter is off ``context.device`` (and not on ``meta``).
    :raises accel.WeightTyingError: a tie came apart all the same (a module was
        sharded before); the model is left as it was, as on any failure here.
    """

    context = running_context(model, context, "fully_shard_tied")
    if context.backend == "xla":
        raise DistributedSetupError(
            "fully_shard_tied shards with torch's FSDP2, which torch_xla does not run; on "
            "XLA devices use accel.distributed.init_spmd() (SPMD) instead"
        )
    check_model_on_device(model, context, meta=True)
    units = plan_shard_units(model, list(modules))
    if mesh is None:
        mesh = init_device_mesh(context.device.type, (context.world_size,))

    def shard() -> tuple[nn.Module, str]:
        for unit in units:
            fsdp.fully_shard(unit if len(unit) > 1 else unit[0], mesh=mesh, **options)
        fsdp.fully_shard(model, mesh=mesh, **options)  # the same module, its class changed
        return model, ""

    def run(capture: RestorePoint) -> nn.Module:
        # Checked, never re-tied: FSDP2 sets each of its parameters into the slots it
        # manages at every unshard and reshard, so a tie re-tied here would come apart
        # at the next forward.
        return TyingSnapshot.keep_through(
            model, capture.slots(), shard, _Refuser(), hollow=False, retie=False
        )

    structure = ModuleStructure(model)  # FSDP2's classes, states and hooks
    return transact(model, run, _failed_note, undo=structure.restore)


class _Refuser:
    """Refuses a tie FSDP2 did not keep (see :class:`accel.tying.TieKeeper`)."""

    settle = None  # nothing runs after the sharding: its check is the one check

    def moved(self, snapshot: TyingSnapshot, moved: nn.Module, report: TieReport, _: str) -> None:
        # FSDP2 shards no buffer: only the parameter slots of a tie are its to keep.
        broken = [apart for group in report.broken if (apart := _parameters_apart(group))]
        if broken:
            names = "; ".join(" = ".join(apart) for apart in broken)
            raise WeightTyingError(
                f"fully_shard_tied: tied parameters came apart under FSDP2 ({names}); "
                f"{report.count_before} unique parameters before, {report.count_after} "
                f"after. Check that no module of the model was sharded with fully_shard "
                f"before this call",
                count_before=report.count_before,
                count_after=report.count_after,
                broken_groups=broken,
            )

    def settled(self, snapshot: TyingSnapshot, moved: nn.Module, report: TieReport) -> None:
        self.moved(snapshot, moved, report, "")  # never called: settle is None


def _parameters_apart(group: TiedGroup) -> tuple[str, ...]:
    """The names of ``group``'s parameter slots if they no longer hold one object, else
    nothing."""
    slots = [
        (name, tensor)
        for name, (_, _, kind), tensor in zip(
            group.names, group.slots, group.tensors(), strict=True
        )
        if kind == "parameter"
    ]
    first = slots[0][1] if slots else None
    return () if all(tensor is first for _, tensor in slots) else tuple(n for n, _ in slots)


def _failed_note(unrestored: list[str]) -> str:
    return (
        "accel: fully_shard_tied failed; the model is as it was before: every module's "
        "class, parameter and buffer slot, and no FSDP2 state or hook"
    ) + changed_in_place(unrestored)


def plan_shard_units(model: nn.Module, modules: list[nn.Module]) -> list[list[nn.Module]]:
    """The ``fully_shard`` calls before the root's: ``modules`` grouped so that every
    tie lies within one call or within the root, innermost calls first.

    :raises ValueError: a module is not a submodule of ``model`` (or is ``model``).
    """
    paths = {id(module): name for name, module in model.named_modules()}
    listed: dict[str, nn.Module] = {}
    for module in modules:
        path = paths.get(id(module))
        if path is None or module is model:
            what = "the model itself" if module is model else "not a submodule of the model"
            raise AcceleratorValueError(
                f"fully_shard_tied: modules must be submodules of the model, but a "
                f"{type(module).__name__} passed is {what}; the root is always sharded last"
            )
        listed[path] = module
    groups = find_tied_parameters(model, buffers=False)
    # A module dropped from the plan hands its parameters to the next listed module
    # around it, which may join it to another tie: repeat until nothing is dropped.
    while True:
        units, dropped = _merge_ties(groups, paths, listed)
        if not dropped:
            break
        for path in dropped:
            del listed[path]
    # Innermost first: fully_shard wants a module's sharded children before it.
    units.sort(key=lambda unit: -max(path.count(".") for path in unit))
    return [[listed[path] for path in unit] for unit in units]


def _merge_ties(
    groups: list[TiedGroup], paths: dict[int, str], listed: dict[str, nn.Module]
) -> tuple[list[list[str]], list[str]]:
    """Union the listed modules that hold one tie. Returns the units (outermost
    members only) and the listed modules to drop: those a tie joins to the root,
    and those inside another member of their unit."""
    parent = {path: path for path in [*listed, ""]}

    def find(path: str) -> str:
        while parent[path] != path:
            parent[path] = parent[parent[path]]
            path = parent[path]
        return path

    for group in groups:
        owners = {_owner(paths[id(module)], listed) for module, _name, _kind in group.slots}
        first, *rest = sorted(owners)  # "" sorts first: the root stays the representative
        for other in rest:
            parent[find(other)] = find(first)
    members: dict[str, list[str]] = {}
    for path in listed:
        members.setdefault(find(path), []).append(path)
    units: list[list[str]] = []
    dropped: list[str] = []
    for representative, unit_paths in members.items():
        if representative == "":
            dropped.extend(unit_paths)  # tied to what the root holds: the root takes them
            continue
        inner = [p for p in unit_paths if any(_inside(p, q) for q in unit_paths)]
        dropped.extend(inner)
        units.append(sorted(p for p in unit_paths if p not in inner))
    return units, dropped


def _owner(path: str, listed: dict[str, nn.Module]) -> str:
    """The innermost listed module containing ``path``, or ``""`` (the root)."""
    owners = [q for q in listed if path == q or _inside(path, q)]
    return max(owners, key=len, default="")


def _inside(path: str, ancestor: str) -> bool:
    return path.startswith(ancestor + ".")
