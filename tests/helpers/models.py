"""Tiny models with every kind of tie the tests need, built in code."""

from __future__ import annotations

import torch
from torch import nn


class TiedLM(nn.Module):
    """Embedding and output projection share one weight (GPT-2 style)."""

    def __init__(self, vocab: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(tokens))))


class ThreeWayTie(nn.Module):
    """One weight in a ModuleList, a ModuleDict and a plain attribute (T5 style)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4, bias=False)
        self.blocks = nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range(2)])
        self.heads = nn.ModuleDict({"out": nn.Linear(4, 4, bias=False)})
        self.blocks[1].weight = self.shared.weight
        self.heads["out"].weight = self.shared.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.heads["out"](self.shared(x))


class FrozenTie(TiedLM):
    """The tied weight does not train."""

    def __init__(self) -> None:
        super().__init__()
        self.embed.weight.requires_grad_(False)


class OwnTieWeights(nn.Module):
    """Ties through its own tie_weights(), as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(10, 6)
        self.decoder = nn.Linear(6, 10, bias=False)
        self.tie_weights_calls = 0
        self.tie_weights()

    def tie_weights(self) -> None:
        self.tie_weights_calls += 1
        self.decoder.weight = self.encoder.weight


class UntiesOnPurpose(TiedLM):
    """A tie_weights() that gives the head a weight of its own."""

    def tie_weights(self) -> None:
        self.head.weight = nn.Parameter(self.embed.weight.detach().clone())


class TiesOnTieWeights(nn.Module):
    """Untied, but its tie_weights() ties the head to the embedding: a Hugging Face
    checkpoint saved untied and loaded with a config that ties."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)

    def tie_weights(self) -> None:
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class SwapsTies(ThreeWayTie):
    """A tie_weights() that unties one group and makes another: both kinds at once."""

    def tie_weights(self) -> None:
        self.heads["out"].weight = nn.Parameter(self.shared.weight.detach().clone())
        self.blocks[0].weight = self.heads["out"].weight


class SharedBuffer(nn.Module):
    """Two submodules register one buffer tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        table = torch.arange(6.0)
        self.a.register_buffer("table", table)
        self.b.register_buffer("table", table)


class SharedSubmodule(nn.Module):
    """One whole block registered under two names: not a tie, survives by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.again = self.block
        self.other = nn.Linear(4, 2)


class NoParameters(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()


class RotaryCache(nn.Module):
    """A non-persistent rotary table computed in ``__init__`` (Llama's cos cache): in no
    state dict, and no ``reset_parameters()`` computes it again. Built on ``meta`` it
    holds no values; ``device`` builds it elsewhere (off ``meta`` while the rest is on
    it)."""

    def __init__(
        self, width: int = 8, positions: int = 6, *, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.width, self.positions = width, positions
        self.register_buffer("cos", self.table(device), persistent=False)

    def table(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The cache's values, computed again (on ``device``)."""
        steps = torch.arange(0, self.width, 2, device=device, dtype=torch.float32)
        positions = torch.arange(self.positions, device=device, dtype=torch.float32)
        return torch.outer(positions, 1.0 / 10000 ** (steps / self.width)).cos()


class RotaryTiedLM(TiedLM):
    """A tied LM with a rotary cache, built where ``cache_device`` says."""

    def __init__(self, *, cache_device: torch.device | str | None = None) -> None:
        super().__init__()
        self.rotary = RotaryCache(device=cache_device)


ALL_MODELS = {
    "tied_lm": TiedLM,
    "three_way": ThreeWayTie,
    "frozen_tie": FrozenTie,
    "own_tie_weights": OwnTieWeights,
    "shared_buffer": SharedBuffer,
    "shared_submodule": SharedSubmodule,
    "no_parameters": NoParameters,
}
