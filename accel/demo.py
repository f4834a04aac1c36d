"""The demo: a tiny language model with a tied embedding, moved and trained.

Everything is built in code (no downloads): a next-token model over a repeating
token sequence, whose output layer shares the embedding's weight, the layout of
GPT-2 and most language models, and the one XLA moves untie.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from accel.registry import AcceleratorRegistry

__all__ = ["DemoReport", "build_tied_language_model", "run_demo"]


def build_tied_language_model(vocab_size: int = 64, width: int = 32) -> nn.Module:
    """A small next-token model whose output projection is tied to its embedding."""
    import torch
    from torch import nn

    class TinyTiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, width)
            self.mix = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
            self.head = nn.Linear(width, vocab_size, bias=False)
            # Small initial weights: the tied head then starts near a uniform guess.
            nn.init.normal_(self.embed.weight, std=0.1)
            self.tie_weights()

        def tie_weights(self) -> None:
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            hidden = self.embed(tokens)
            result: torch.Tensor = self.head(hidden + self.mix(hidden))
            return result

    return TinyTiedLM()


@dataclass
class DemoReport:
    """What the demo observed."""

    accelerator: str
    device: str
    count_before: int
    count_after: int
    tied_groups: list[tuple[str, ...]]
    ties_held: bool
    losses: list[float] = field(default_factory=list)


def run_demo(
    accelerator: str | None = None,
    *,
    steps: int = 20,
    registry: AcceleratorRegistry | None = None,
    echo: Callable[[str], None] = print,
) -> DemoReport:
    """Select ``accelerator``, move the tiny tied model there, train ``steps`` steps."""
    import torch
    from torch import nn

    import accel
    from accel.tying import count_unique_parameters, find_tied_parameters

    torch.manual_seed(0)
    chosen = (registry or accel.default_registry()).get_accelerator(accelerator)
    model = build_tied_language_model()
    groups = find_tied_parameters(model)
    count_before = count_unique_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model = chosen.model_to_device(model, optimizer=optimizer)
    count_after = count_unique_parameters(model)
    ties_held = all(group.is_tied() for group in groups)

    echo(f"accelerator: {chosen.name} ({chosen.spec.description})")
    echo(f"device: {chosen.device}")
    echo(f"unique parameters: before move {count_before}, after move {count_after}")
    for group in groups:
        echo(f"tied group: {', '.join(group.names)}: {'held' if group.is_tied() else 'BROKEN'}")
    echo(f"every tie held: {'yes' if ties_held and count_before == count_after else 'NO'}")

    # Next-token prediction over a repeating sequence: learnable in a few steps.
    sequence = torch.arange(64).repeat(4) % 16
    inputs, targets = sequence[:-1].unsqueeze(0), sequence[1:].unsqueeze(0)
    batch = chosen.batch_to_device({"inputs": inputs, "targets": targets})
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        logits = model(batch["inputs"])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        if step == 1 or step == steps or step % 5 == 0:
            echo(f"step {step:3d}  loss {losses[-1]:.4f}")
    still_tied = all(group.is_tied() for group in groups)
    echo(f"ties still held after training: {'yes' if still_tied else 'NO'}")
    return DemoReport(
        accelerator=chosen.name,
        device=str(chosen.device),
        count_before=count_before,
        count_after=count_after,
        tied_groups=[group.names for group in groups],
        ties_held=ties_held and still_tied and count_before == count_after,
        losses=losses,
    )
