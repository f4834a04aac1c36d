"""The models, batches and comparisons the checks share, built in code (nothing downloaded)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "TiedModel",
    "TwinModel",
    "assert_close",
    "cpu_copy",
    "cpu_reference_step",
    "parameter_names",
    "reference_inputs",
    "reference_layer",
    "same_values",
    "sgd_for",
    "squared_error",
    "unique_parameters",
]


class TiedModel(nn.Module):
    """An embedding and an output layer sharing one weight (GPT-2's tie), a float32 body
    and an int64 buffer, so that a move shows ties, values and dtypes at once."""

    def __init__(self, vocab: int = 6, width: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.arange(3, dtype=torch.int64))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(torch.tanh(self.body(self.embed(tokens))))
        return logits


class TwinModel(nn.Module):
    """Two layers with equal values and no tie: a move must not tie them."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3, bias=False)
        self.second = nn.Linear(3, 3, bias=False)
        with torch.no_grad():
            self.second.weight.copy_(self.first.weight)


def unique_parameters(model: nn.Module) -> int:
    """Parameters counted once each, however many names they have."""
    return len({id(parameter) for parameter in model.parameters()})


def parameter_names(model: nn.Module) -> list[str]:
    """Every parameter name, the tied ones under each of their names."""
    return [name for name, _ in model.named_parameters(remove_duplicate=False)]


def cpu_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state, copied to the CPU: the values to compare with after a move."""
    return {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in model.state_dict(keep_vars=True).items()
    }


def same_values(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
    """Assert two CPU states have the same keys, dtypes and values, naming the first
    difference."""
    assert sorted(got) == sorted(expected), (
        f"{what}: keys {sorted(got)} differ from {sorted(expected)}"
    )
    for name, tensor in expected.items():
        other = got[name]
        assert other.dtype == tensor.dtype, f"{what}: {name} is {other.dtype}, was {tensor.dtype}"
        assert torch.equal(other.to("cpu"), tensor), f"{what}: {name} changed value"


def sgd_for(model: nn.Module, *, momentum: float = 0.0) -> torch.optim.SGD:
    """Plain SGD (elementwise updates only, which every device has), without foreach
    kernels a young backend may lack."""
    return torch.optim.SGD(model.parameters(), lr=0.5, momentum=momentum, foreach=False)


def reference_layer(seed: int = 0) -> nn.Linear:
    # The same layer on every run, without touching the host generator the run uses.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(4, 2)


def reference_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)


def assert_close(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str
) -> None:
    for name, tensor in expected.items():
        assert torch.allclose(got[name].float(), tensor.float(), rtol=1e-4, atol=1e-5), (
            f"{what}: {name} is {got[name].tolist()}, expected {tensor.tolist()}"
        )


def squared_error(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The checks' loss, the summed squared error, from elementwise arithmetic and one
    sum: a young backend has those long before a fused ``mse_loss`` kernel
    (torch-nntile 0.1.0 has none), and the training-step promises are about the step,
    not the loss."""
    difference = output - target
    return (difference * difference).sum()


def cpu_reference_step(inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """One SGD step of the reference layer on the CPU, by hand."""
    model = reference_layer()
    optimizer = sgd_for(model)
    squared_error(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return cpu_copy(model)
