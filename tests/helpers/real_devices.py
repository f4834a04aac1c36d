"""What the `devices` stage's tests share: a tied model every real backend runs, and the
checks of a model's ties and its optimizer (tests/devices, marked ``devices``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 6
WIDTH = 4
#: A fixed batch, so two runs see the same data without drawing it.
TOKENS = torch.tensor([[1, 2, 3], [4, 5, 0]])
TARGETS = torch.tensor([[2, 3, 4], [5, 0, 1]])


class TiedReluLM(nn.Module):
    """An embedding and an output layer sharing one weight, with a body between: three
    parameters under four names. ReLU, not tanh: the ops torch-nntile has."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.body(self.emb(tokens))))


def tied_model(seed: int = 0) -> TiedReluLM:
    torch.manual_seed(seed)
    return TiedReluLM()


def assert_tied_and_followed(model: TiedReluLM, optimizer: torch.optim.Optimizer) -> None:
    """The tie is one Parameter, the model has its three, and the optimizer holds exactly
    those three (the embedding's too, so it keeps training)."""
    assert model.head.weight is model.emb.weight, "the head and the embedding came apart"
    unique = {id(parameter): parameter for parameter in model.parameters()}
    assert len(unique) == 3, f"{len(unique)} parameters, not 3"
    held = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    assert len(held) == 3, f"the optimizer holds {len(held)} parameters, not 3"
    assert {id(parameter) for parameter in held} == set(unique), (
        "the optimizer holds parameters the model does not have"
    )


def assert_same_values(expected: nn.Module, actual: nn.Module) -> None:
    """Every state entry equal, bit for bit (``actual`` may be on a device)."""
    want = expected.state_dict()
    got = actual.state_dict()
    assert list(want) == list(got)
    for name, tensor in want.items():
        other = got[name].to("cpu")
        assert torch.equal(tensor, other), f"{name} differs by {(tensor - other).abs().max()}"


def fixed_gradients(model: nn.Module, step: int) -> None:
    """Gradients set by hand, the same for every run: for a device with no forward pass."""
    for index, parameter in enumerate(model.parameters()):
        grad = torch.full(parameter.shape, 0.25 * (index + 1) + 0.125 * step)
        parameter.grad = grad.to(parameter.device)
