"""A few SGD steps on a tied model, and the plain torch loop every integration must match."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from helpers.models import TiedLM

STEPS = 3
VOCAB = 16
LR = 0.5
BATCH = 4


def dataset(samples: int = STEPS * BATCH) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (samples, 5), generator=generator)
    targets = torch.randint(0, VOCAB, (samples, 5), generator=generator)
    return TensorDataset(tokens, targets)


def loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(dataset(), batch_size=BATCH)


def batches() -> Iterator[list[torch.Tensor]]:
    """``[tokens, targets]`` pairs, on the CPU."""
    yield from loader()


def loss_of(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def initial_model() -> TiedLM:
    torch.manual_seed(0)
    return TiedLM(VOCAB)


def reference(initial: TiedLM) -> TiedLM:
    """The plain torch loop on the CPU."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for tokens, targets in batches():
        loss_of(model, tokens, targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def data_parallel_reference(initial: TiedLM, processes: int, *, shuffle: bool) -> TiedLM:
    """The plain torch loop that, each step, takes the batches of every one of
    ``processes`` DDP ranks at once (equal batches: what DDP's gradient averaging
    amounts to), with the rank's data chosen as by a ``DistributedSampler``."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = dataset(STEPS * BATCH * processes)
    orders = [
        list(DistributedSampler(data, num_replicas=processes, rank=rank, shuffle=shuffle))
        for rank in range(processes)
    ]
    for step in range(STEPS):
        chosen = [index for order in orders for index in order[step * BATCH : (step + 1) * BATCH]]
        tokens, targets = data[chosen]
        loss_of(model, tokens, targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def optimized(optimizers: Iterable[torch.optim.Optimizer]) -> set[int]:
    """The ids of every parameter the optimizers step."""
    return {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}


def assert_trained_like_torch(
    model: TiedLM, initial: TiedLM, optimizer_params: set[int], *, exact: bool = True
) -> None:
    """The tie held, ``head.weight`` was stepped, and the values match the torch loop."""
    assert model.head.weight is model.embed.weight, "the tie came apart"
    assert id(model.head.weight) in optimizer_params, "head.weight is in no optimizer"
    assert not torch.equal(model.head.weight.detach().cpu(), initial.head.weight.detach())
    tolerance = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-4, "atol": 1e-5}
    trained = model.state_dict()
    for name, value in reference(initial).state_dict().items():
        torch.testing.assert_close(trained[name].detach().cpu(), value, msg=name, **tolerance)
