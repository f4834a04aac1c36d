"""A tied model built on ``meta``, materialized on XLA and trained, under SPMD over
every device or on one device; under SPMD also torch_xla's own sharding of the tie.

Usage: PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python large_model_xla_spmd.py REPORT [STEPS]

accel.distributed.init_spmd, then ``context.accelerator.materialize`` of a model
built on meta, ``xs.mark_sharding`` on both tied slots (one tensor: marked
twice), and training on batches through ``shard_batch``. Then, on fresh models, what
torch_xla does with two different partition specs on the two slots, and what its
FSDPv2 wrapper (``SpmdFullyShardedDataParallel``) does with the tie: given a model
off XLA, one accel moved, one with an auto-wrap policy that wraps the embedding and
the head apart, and one on meta; then accel's FSDPv2 entry, and what accel's
process-group entry points say under SPMD. The report holds the initial weights, so
the test trains the same model on the same batches on the CPU to compare.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel
import accel.distributed
from helpers.models import TiedLM

SEED = 0


def on_meta() -> TiedLM:
    with torch.device("meta"):
        return TiedLM()


def unique(model: nn.Module) -> int:
    return len({id(p) for p in model.parameters()})


def train(model: nn.Module, acc: accel.Accelerator, steps: int) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 16, (4, 5), generator=generator)
        loss = model(accel.distributed.shard_batch(tokens)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        acc.optimizer_step(optimizer)  # marks the step
        losses.append(loss.item())
    return losses


def values(model: nn.Module) -> dict[str, list[float]]:
    return {name: p.detach().cpu().reshape(-1).tolist() for name, p in model.named_parameters()}


def spmd(report: dict[str, Any], steps: int) -> None:
    import torch_xla
    import torch_xla.distributed.spmd as xs

    def spec(tensor: torch.Tensor) -> str:
        return str(torch_xla._XLAC._get_xla_sharding_spec(tensor))

    context = accel.distributed.init_spmd("tpu")  # before any tensor is on XLA
    acc, mesh = context.accelerator, context.mesh
    report["num_devices"] = context.num_devices
    acc.manual_seed(SEED)
    model = acc.materialize(on_meta())
    report["tied_after_materialize"] = model.head.weight is model.embed.weight
    report["initial"] = values(model)
    # The vocabulary dimension over the mesh; the head's slot names the same tensor.
    xs.mark_sharding(model.embed.weight, mesh, ("data", None))
    xs.mark_sharding(model.head.weight, mesh, ("data", None))
    report["specs_marked"] = [spec(model.embed.weight), spec(model.head.weight)]
    report["tied_after_marking"] = model.head.weight is model.embed.weight
    report["losses"] = train(model, acc, steps)
    report["tied"] = model.head.weight is model.embed.weight
    report["unique_parameters"] = unique(model)
    report["specs_trained"] = [spec(model.embed.weight), spec(model.head.weight)]
    report["parameters"] = values(model)

    # Two different specs on the two slots: torch_xla re-shards the one tensor.
    other = acc.materialize(on_meta())
    before = other.embed.weight.detach().cpu().clone()
    xs.mark_sharding(other.embed.weight, mesh, ("data", None))
    first = spec(other.head.weight)
    xs.mark_sharding(other.head.weight, mesh, (None, "data"))
    report["respec"] = {
        "head_after_embed_marked": first,
        "after_head_marked": [spec(other.embed.weight), spec(other.head.weight)],
        "tied": other.head.weight is other.embed.weight,
        "values_kept": torch.equal(before, other.embed.weight.detach().cpu()),
    }
    fsdpv2(report, context, steps)
    report["refusals"] = refusals(model)


def refusals(model: nn.Module) -> dict[str, str]:
    """What accel's process-group entry points say under SPMD, where there is none."""
    said = {}
    for name, call in (
        ("fully_shard_tied", accel.distributed.fully_shard_tied),
        ("parallelize_tied", lambda m: accel.distributed.parallelize_tied(m, {})),
        ("wrap_data_parallel", accel.distributed.wrap_data_parallel),
        ("init_process_group", lambda m: accel.distributed.init_process_group("tpu")),
    ):
        try:
            call(model)
        except accel.distributed.DistributedSetupError as exc:
            said[name] = str(exc)
    return said


def fsdpv2(report: dict[str, Any], context: Any, steps: int) -> None:
    import numpy as np
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    acc = context.accelerator
    # FSDPv2 shards over a mesh axis named "fsdp" (init_spmd's is "data").
    mesh = xs.Mesh(np.arange(context.num_devices), (context.num_devices,), ("fsdp",))
    found: dict[str, Any] = {}

    def measure(case: str, model: nn.Module, **options: Any) -> nn.Module:
        before = unique(model)
        wrapped = FSDPv2(model, mesh=mesh, **options)
        inner = wrapped.module
        embed, head = inner.embed, inner.head
        embed, head = getattr(embed, "module", embed), getattr(head, "module", head)
        found[case] = {
            "before": before,
            "after": unique(wrapped),
            "tied": head.weight is embed.weight,
        }
        return wrapped

    torch.manual_seed(SEED)
    measure("cpu_model", TiedLM())  # FSDPv2 moves it itself: module.to("xla")
    acc.manual_seed(SEED)
    moved = measure("materialized", acc.materialize(on_meta()))
    policy = functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={nn.Embedding, nn.Linear}
    )
    measure("auto_wrapped", acc.model_to_device(TiedLM()), auto_wrap_policy=policy)
    try:
        FSDPv2(on_meta(), mesh=mesh)
    except Exception as exc:  # torch's own refusal, pointing at to_empty
        found["meta"] = f"{type(exc).__name__}: {exc}"
    found["initial"] = values(moved.module)
    found["losses"] = train(moved, acc, steps)
    inner = moved.module
    found["tied_after_training"] = inner.head.weight is inner.embed.weight
    found["parameters"] = values(moved.module)
    report["fsdpv2"] = found
    report["accel_fsdpv2"] = accel_fsdpv2(context, mesh, policy)


def accel_fsdpv2(context: Any, mesh: Any, policy: Any) -> dict[str, Any]:
    """accel's FSDPv2 entry point: the tie of a model off XLA kept, a model on meta
    and a tie undone inside FSDPv2 refused, each in a typed error."""
    import torch_xla
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    from accel.distributed import spmd_fully_shard_tied

    found: dict[str, Any] = {}
    model = TiedLM()  # on the CPU: FSDPv2 alone unties it
    wrapped = spmd_fully_shard_tied(model)  # the default mesh: every device on "fsdp"
    found["cpu_model"] = {
        "module_is_model": wrapped.module is model,
        "tied": model.head.weight is model.embed.weight,
        "after": unique(wrapped),
        "spec": str(torch_xla._XLAC._get_xla_sharding_spec(model.embed.weight)),
    }
    try:
        spmd_fully_shard_tied(on_meta())
    except accel.AcceleratorValueError as exc:
        found["meta"] = str(exc)

    def moves_first(module: nn.Module, **options: Any) -> nn.Module:
        module.to("cpu")  # a wrapper that moves a module alone: its tie comes apart
        return FSDPv2(module, **options)

    try:
        spmd_fully_shard_tied(
            TiedLM(), mesh=mesh, auto_wrap_policy=policy, auto_wrapper_callable=moves_first
        )
    except accel.WeightTyingError as exc:
        found["untied_inside"] = {
            "message": str(exc),
            "counts": [exc.count_before, exc.count_after],
            "broken": exc.broken_groups,
        }
    return found


def main() -> None:
    report_path = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    report: dict[str, Any] = {}
    spmd(report, steps)
    report_path.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
