"""A tied model built on ``meta`` and materialized on XLA (XLA:CPU): one Parameter
for the tie, the values of an eager build, loads in place, and training with the tie
held; ``to_empty``, torch's own way, unties it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import accel
from helpers.models import TiedLM

pytestmark = pytest.mark.xla


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def on_meta() -> TiedLM:
    with torch.device("meta"):
        return TiedLM()


def on_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu() for name, t in model.state_dict().items()}


def unique_parameters(model: torch.nn.Module) -> int:
    return len({id(p) for p in model.parameters()})


def test_torch_xla_allocates_the_like_of_a_meta_tensor() -> None:
    # What materialize's allocation asks of torch_xla: torch.empty_like(meta, device=xla).
    import torch_xla

    device = torch_xla.device()
    for dtype in (torch.float32, torch.bfloat16):
        meta = torch.empty(16, 8, dtype=dtype, device="meta")
        like = torch.empty_like(meta, device=device)
        assert (like.device.type, like.shape, like.dtype) == ("xla", meta.shape, dtype)
        assert like._version == 0  # what the never-written check starts from


def test_to_empty_on_xla_unties_where_materialize_keeps_one_parameter(
    tpu: accel.Accelerator,
) -> None:
    untied = on_meta().to_empty(device=tpu.device)  # torch's way: a Parameter per slot
    assert untied.head.weight is not untied.embed.weight
    assert unique_parameters(untied) == 4

    model = tpu.materialize(on_meta())
    assert model.head.weight is model.embed.weight
    assert unique_parameters(model) == 3
    assert {p.device.type for p in model.parameters()} == {"xla"}


def test_materialize_on_xla_equals_an_eager_build_on_xla_seeded_the_same(
    tpu: accel.Accelerator,
) -> None:
    tpu.manual_seed(0)
    materialized = on_cpu(tpu.materialize(on_meta()))
    tpu.manual_seed(0)
    with torch.device(tpu.device):
        eager = on_cpu(TiedLM())
    assert materialized.keys() == eager.keys()
    for name, values in materialized.items():
        assert torch.equal(values, eager[name]), name
    # reset_parameters draws on the device, and XLA's generator is its own: the values
    # are not those of a CPU build seeded the same (load= a CPU build's state for that).
    torch.manual_seed(0)
    assert not torch.equal(materialized["body.weight"], TiedLM().body.weight.detach())


@pytest.mark.parametrize("source", ["state_dict", "acc.save file"])
def test_materialize_on_xla_loads_and_trains_with_the_tie_held_as_on_the_cpu(
    tpu: accel.Accelerator, source: str, tmp_path: Path
) -> None:
    torch.manual_seed(3)
    reference = TiedLM()  # trained on the CPU alongside
    state = {name: t.clone() for name, t in reference.state_dict().items()}
    load: dict[str, torch.Tensor] | Path = state
    if source != "state_dict":
        load = tmp_path / "model.pt"
        accel.get_accelerator("cpu").save(state, load)
    model = tpu.materialize(on_meta(), load=load)
    assert model.head.weight is model.embed.weight
    for name, values in on_cpu(model).items():
        assert torch.equal(values, state[name]), name

    cpu = accel.get_accelerator("cpu")
    runs = {}
    for acc, trained in ((tpu, model), (cpu, reference)):
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
        generator = torch.Generator().manual_seed(7)
        losses = []
        for _ in range(2):
            tokens = acc.batch_to_device(torch.randint(0, 16, (4, 5), generator=generator))
            loss = trained(tokens).logsumexp(-1).mean()
            optimizer.zero_grad()
            loss.backward()
            acc.optimizer_step(optimizer)
            losses.append(loss.item())
        runs[acc.name] = losses
    assert model.head.weight is model.embed.weight  # the tie held through the steps
    assert unique_parameters(model) == 3
    assert runs["tpu"] == pytest.approx(runs["cpu"], abs=1e-5)
    assert not torch.equal(on_cpu(model)["embed.weight"], state["embed.weight"])  # it trained
    # The tied weight got the gradient of both uses, as on the CPU.
    for name, values in on_cpu(model).items():
        assert values == pytest.approx(reference.state_dict()[name], abs=1e-5), name


class WithCache(TiedLM):
    """A non-persistent buffer no reset_parameters() writes (a rotary cache's kind)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.arange(4.0), persistent=False)


def test_materialize_on_xla_names_a_tensor_nothing_wrote(tpu: accel.Accelerator) -> None:
    with torch.device("meta"):
        model = WithCache()
    with pytest.raises(accel.AcceleratorValueError, match=r"wrote no values into cache\b"):
        tpu.materialize(model)
    assert model.cache.device.type == "meta"  # rolled back, the tie as it was
    assert model.head.weight is model.embed.weight
