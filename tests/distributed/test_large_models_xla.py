"""A tied model built on ``meta``, materialized and sharded under XLA SPMD: torch_xla's
``mark_sharding`` on both tied slots, and its FSDPv2 wrapper.

The SPMD run needs two XLA:CPU devices, which torch_xla reads once per process
(CPU_NUM_DEVICES), so it is a fresh interpreter of scripts/large_model_xla_spmd.py;
one run reports every case, and the tests below share it. The reference is the same
model, from the weights the run started from, trained on the same batches on the CPU
here."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import accel
import accel.distributed as adist
from helpers.distributed import SCRIPTS, no_launcher_and_no_group  # noqa: F401
from helpers.models import TiedLM
from helpers.processes import run_python

STEPS = 3


@pytest.fixture(scope="module")
def spmd(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    report = tmp_path_factory.mktemp("large_model_xla") / "spmd.json"
    result = run_python(
        [SCRIPTS / "large_model_xla_spmd.py", str(report), str(STEPS)],
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


def on_the_cpu(initial: dict[str, list[float]]) -> dict[str, Any]:
    """The script's training, on the CPU, from ``initial``: losses and weights."""
    model = TiedLM()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(initial[name]).reshape(p.shape))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(STEPS):
        tokens = torch.randint(0, 16, (4, 5), generator=generator)
        loss = model(tokens).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters()}
    return {"losses": losses, "parameters": weights}


def assert_close(got: dict[str, list[float]], want: dict[str, list[float]]) -> None:
    assert got.keys() == want.keys()
    for name, values in got.items():
        assert values == pytest.approx(want[name], abs=1e-5), name


SHARDED_ROWS = "{devices=[2,1]0,1}"  # dimension 0 split over both devices
SHARDED_COLUMNS = "{devices=[1,2]0,1}"


@pytest.mark.xla
def test_materialized_under_spmd_and_marked_on_both_slots_the_tie_stays_one(
    spmd: dict[str, Any], registry: accel.AcceleratorRegistry
) -> None:
    assert spmd["num_devices"] == 2
    assert spmd["tied_after_materialize"] and spmd["tied_after_marking"]
    # One tensor under two names: both report the vocabulary split over the devices.
    assert spmd["specs_marked"] == [SHARDED_ROWS, SHARDED_ROWS]
    assert spmd["specs_trained"] == [SHARDED_ROWS, SHARDED_ROWS]
    assert spmd["tied"] and spmd["unique_parameters"] == 3
    # Seeded through the handle, the SPMD device draws what one XLA device draws here.
    tpu = registry.get_accelerator("tpu")
    tpu.manual_seed(0)
    with torch.device("meta"):
        model = TiedLM()
    one_device = {
        name: p.detach().cpu().reshape(-1).tolist()
        for name, p in tpu.materialize(model).named_parameters()
    }
    assert_close(spmd["initial"], one_device)
    # The gradient of the tie summed over both uses and both devices, as on the CPU.
    reference = on_the_cpu(spmd["initial"])
    assert spmd["losses"] == pytest.approx(reference["losses"], abs=1e-5)
    assert spmd["losses"][0] != pytest.approx(spmd["losses"][-1])  # it trained
    assert_close(spmd["parameters"], reference["parameters"])


@pytest.mark.xla
def test_two_specs_on_the_two_tied_slots_reshard_the_one_tensor(
    spmd: dict[str, Any],
) -> None:
    respec = spmd["respec"]
    assert respec["head_after_embed_marked"] == SHARDED_ROWS  # marking one slot marks both
    # torch_xla raises nothing: the second mark re-shards the one tensor, for both names.
    assert respec["after_head_marked"] == [SHARDED_COLUMNS, SHARDED_COLUMNS]
    assert respec["tied"] and respec["values_kept"]


@pytest.mark.xla
def test_fsdpv2_keeps_a_tie_only_of_a_model_already_on_xla(
    spmd: dict[str, Any],
) -> None:
    found = spmd["fsdpv2"]
    # Handed a CPU model, FSDPv2 moves it with module.to("xla"): 3 parameters become 4.
    assert found["cpu_model"] == {"before": 3, "after": 4, "tied": False}
    # Materialized by accel first, or moved by accel and wrapped module by module
    # (embedding and head in wrappers of their own), the tie is one Parameter.
    assert found["materialized"] == {"before": 3, "after": 3, "tied": True}
    assert found["auto_wrapped"] == {"before": 3, "after": 3, "tied": True}
    # On meta, torch's error points at to_empty(), which unties it.
    assert found["meta"].startswith("NotImplementedError: Cannot copy out of meta tensor")
    assert "to_empty()" in found["meta"]
    # The tie held through training, which equals the CPU's.
    assert found["tied_after_training"]
    reference = on_the_cpu(found["initial"])
    assert found["losses"] == pytest.approx(reference["losses"], abs=1e-5)
    assert_close(found["parameters"], reference["parameters"])


@pytest.mark.xla
def test_accels_fsdpv2_entry_keeps_the_tie_or_says_why_not(
    spmd: dict[str, Any],
) -> None:
    found = spmd["accel_fsdpv2"]
    # The CPU model FSDPv2 alone unties: moved by accel first, one Parameter.
    assert found["cpu_model"] == {
        "module_is_model": True,
        "tied": True,
        "after": 3,
        "spec": SHARDED_ROWS,
    }
    assert "holds 3 tensors on meta" in found["meta"] and "acc.materialize" in found["meta"]
    untied = found["untied_inside"]
    assert untied["counts"] == [3, 4] and untied["broken"] == [["embed.weight", "head.weight"]]
    assert "came apart under FSDPv2 (embed.weight = head.weight)" in untied["message"]


def test_accels_fsdpv2_entry_needs_init_spmd() -> None:
    from accel.distributed import spmd_fully_shard_tied

    model = TiedLM()
    with pytest.raises(adist.DistributedSetupError, match=r"init_spmd\(\); call it first"):
        spmd_fully_shard_tied(model)
    assert model.head.weight is model.embed.weight
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}


@pytest.mark.xla
def test_under_spmd_init_process_group_is_pointed_at_init_spmd(
    spmd: dict[str, Any],
) -> None:
    said = spmd["refusals"]["init_process_group"]
    assert "SPMD mode" in said and "init_spmd()" in said and "shard_batch()" in said


@pytest.mark.xla
@pytest.mark.parametrize("entry", ["fully_shard_tied", "parallelize_tied", "wrap_data_parallel"])
def test_under_spmd_the_process_group_entries_say_what_shards_there(
    spmd: dict[str, Any], entry: str
) -> None:
    said = spmd["refusals"][entry]
    assert "init_process_group() first" not in said
    assert "init_spmd()" in said and "mark_sharding" in said
