"""fully_shard_tied: FSDP2 that shards the modules of a tie together, then the root.

Planning is checked in this process; training runs under torchrun with two gloo
processes on loopback against a single-process run, on every torch the test command
uses (2.13 in the main tier, 2.9.1 in its second run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

import accel
import accel.distributed as adist
from accel.distributed._fsdp import plan_shard_units
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    no_launcher_and_no_group,
    read_reports,
    run_torchrun,
)
from helpers.models import ThreeWayTie, TiedLM

LAYOUTS = ("root", "separate", "body")


def names(model: nn.Module, units: list[list[nn.Module]]) -> list[list[str]]:
    path = {id(module): name for name, module in model.named_modules()}
    return [[path[id(module)] for module in unit] for unit in units]


def test_tied_modules_are_planned_as_one_unit() -> None:
    model = TiedLM()
    units = plan_shard_units(model, [model.embed, model.body, model.head])
    assert sorted(names(model, units)) == [["body"], ["embed", "head"]]


def test_untied_modules_keep_their_own_units_and_the_root_keeps_the_rest() -> None:
    model = TiedLM()
    assert names(model, plan_shard_units(model, [model.body])) == [["body"]]
    assert plan_shard_units(model, []) == []
    # The head alone would take the tied weight from the root's embed: left to the root.
    assert names(model, plan_shard_units(model, [model.head, model.body])) == [["body"]]


def test_a_tie_across_units_joins_them_and_innermost_units_go_first() -> None:
    model = ThreeWayTie()  # shared.weight = blocks.1.weight = heads.out.weight
    units = plan_shard_units(
        model, [model.blocks, model.blocks[1], model.heads["out"], model.shared]
    )
    # blocks.1 is sharded (with its tie) before blocks, which contains it.
    assert names(model, units) == [["blocks.1", "heads.out", "shared"], ["blocks"]]


def test_a_tie_within_an_outer_unit_stays_there() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)), nn.Linear(3, 1))
    model[0][1].weight = model[0][0].weight
    # The inner unit 0.0 would take the weight from 0.1, which 0 holds: 0 keeps both.
    assert names(model, plan_shard_units(model, [model[0], model[0][0], model[1]])) == [
        ["0"],
        ["1"],
    ]


def test_modules_outside_the_model_are_refused() -> None:
    model = TiedLM()
    with pytest.raises(ValueError, match="Linear passed is not a submodule"):
        plan_shard_units(model, [nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="TiedLM passed is the model itself"):
        plan_shard_units(model, [model])


def test_shard_in_a_world_of_one_keeps_the_tie() -> None:
    context = adist.init_process_group("cpu")
    model = context.accelerator.model_to_device(TiedLM())
    assert adist.fully_shard_tied(model, [model.embed, model.body, model.head]) is model
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 3


def test_a_tie_that_came_apart_all_the_same_is_reported_and_undone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A torch whose fully_shard unties even within one call: the check must notice.
    import torch.distributed.fsdp as fsdp
    from torch.distributed import _composable_state

    real_fully_shard = fsdp.fully_shard

    def untying_fully_shard(module: nn.Module, **options: object) -> nn.Module:
        sharded = real_fully_shard(module, **options)  # type: ignore[arg-type]
        if isinstance(module, TiedLM):
            module.head.weight = nn.Parameter(module.embed.weight.detach().clone())
        return sharded

    monkeypatch.setattr(fsdp, "fully_shard", untying_fully_shard)
    context = adist.init_process_group("cpu")
    model = context.accelerator.model_to_device(TiedLM())
    parameters = list(model.parameters())
    with pytest.raises(accel.WeightTyingError, match=r"embed\.weight = head\.weight") as caught:
        adist.fully_shard_tied(model)
    assert caught.value.broken_groups == [("embed.weight", "head.weight")]
    assert (caught.value.count_before, caught.value.count_after) == (3, 4)
    # Rolled back whole: FSDP2's class, state and hooks gone, the parameters of before.
    assert type(model) is TiedLM and not isinstance(model, fsdp.FSDPModule)
    assert _composable_state._get_module_state(model) is None  # FSDP2 refuses it twice
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert list(model.parameters()) == parameters and model.head.weight is model.embed.weight
    assert "no FSDP2 state or hook" in "\n".join(caught.value.__notes__)
    monkeypatch.undo()  # torch's own fully_shard: the same model shards, tied
    adist.fully_shard_tied(model)
    assert isinstance(model, fsdp.FSDPModule) and model.head.weight is model.embed.weight


def test_a_tie_that_is_also_a_buffer_is_judged_on_its_parameters() -> None:
    # One tensor in two parameter slots and a buffer slot: FSDP2 keeps the parameters
    # one, and shards no buffer, so the buffer's slot is not its to keep.
    context = adist.init_process_group("cpu")
    model = context.accelerator.model_to_device(TiedLM())
    model.body.register_buffer("shared", model.embed.weight)
    assert adist.fully_shard_tied(model, [model.embed, model.head]) is model
    assert model.head.weight is model.embed.weight


def test_shard_needs_a_running_group() -> None:
    with pytest.raises(adist.DistributedSetupError, match="fully_shard_tied needs a running"):
        adist.fully_shard_tied(TiedLM())


def test_two_ranks_match_one_process_in_every_layout(tmp_path: Path) -> None:
    layouts = ",".join([*LAYOUTS, "unhelped"])
    result = run_torchrun([str(SCRIPTS / "fsdp_tied.py"), layouts, str(tmp_path), "3"])
    assert result.returncode == 0, result.stdout[-4000:]
    for report in read_reports(tmp_path, 2):
        for layout in LAYOUTS:
            outcome = report[layout]
            assert "error" not in outcome, (layout, outcome)
            assert outcome["tied"] and outcome["still_tied"], layout
            assert outcome["parameters"] == 3, layout
            assert outcome["names"] == ["body.bias", "body.weight", "embed.weight"]
            assert outcome["trained"], layout
            assert outcome["loss_diff"] < 1e-5 and outcome["param_diff"] < 1e-5, (layout, outcome)
        # The control: torch's own fully_shard(embed), fully_shard(head) unties
        # silently (torch 2.9) or refuses (later torch). Either way, not the reference.
        unhelped = report["unhelped"]
        if "error" in unhelped:
            assert "shared" in unhelped["error"] or "tied" in unhelped["error"]
        else:
            assert unhelped["parameters"] == 4 and not unhelped["tied"]
            assert unhelped["param_diff"] > 1e-3
