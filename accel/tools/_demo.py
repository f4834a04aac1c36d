"""The demo: a tiny language model with a tied embedding, moved and trained.

Everything is built in code (no downloads): a next-token model over a repeating
token sequence, whose output layer shares the embedding's weight, the layout of
GPT-2 and most language models, and the one XLA moves untie. It trains with the
handle's ``device_loader`` and ``optimizer_step``, so on XLA it compiles the same
few graphs however many steps it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

import accel
from accel._util.notes import add_note
from accel.tying import count_unique_parameters, find_tied_parameters

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from torch import nn

    from accel.registry import AcceleratorRegistry
    from accel.tying import TiedGroup

__all__ = ["DemoReport", "build_tied_language_model", "report_ties", "run_demo", "tied_in"]

_UNTIMED_STEPS = 2


def build_tied_language_model(vocab_size: int = 64, width: int = 32) -> nn.Module:
    """A small next-token model whose output projection is tied to its embedding."""

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
    #: Mean wall time of a training step after the first two (which compile on XLA).
    seconds_per_step: float = 0.0


def run_demo(
    accelerator: str | None = None,
    *,
    steps: int = 20,
    registry: AcceleratorRegistry | None = None,
    echo: Callable[[str], None] = print,
) -> DemoReport:
    """Select ``accelerator``, move the tiny tied model there, train ``steps`` steps."""

    torch.manual_seed(0)
    chosen = (registry or accel.default_registry()).get_accelerator(accelerator)
    model = build_tied_language_model()
    groups = find_tied_parameters(model)
    count_before = count_unique_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    # A plugin's model_to_device may return a replacement module: judge (and train)
    # what the move returned, never the model it was given.
    model = chosen.model_to_device(model, optimizer=optimizer)
    count_after = count_unique_parameters(model)

    echo(f"accelerator: {chosen.name} ({chosen.spec.description})")
    echo(f"device: {chosen.device}")
    ties_held = report_ties(groups, count_before, model, echo)

    loader = _demo_loader()
    loss_fn = nn.CrossEntropyLoss()
    pending: list[torch.Tensor] = []
    started = time.perf_counter()
    while len(pending) < steps:  # as many passes over the data as the steps need
        for batch in chosen.device_loader(loader):
            if len(pending) == _UNTIMED_STEPS:  # the first steps compile on XLA
                started = time.perf_counter()
            logits = model(batch["inputs"])
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
            _backward(loss, chosen.name)
            chosen.optimizer_step(optimizer)  # on XLA: the step's graph ends here
            optimizer.zero_grad()
            pending.append(loss.detach())  # read after the loop: .item() here runs early on XLA
            if len(pending) == steps:
                break
    chosen.synchronize()
    timed_steps = steps - _UNTIMED_STEPS if steps > _UNTIMED_STEPS else steps
    seconds_per_step = (time.perf_counter() - started) / timed_steps
    losses = [float(loss) for loss in pending]
    for step, value in enumerate(losses, start=1):
        if step == 1 or step == steps or step % 5 == 0:
            echo(f"step {step:3d}  loss {value:.4f}")
    echo(
        f"time per step: {seconds_per_step * 1e3:.2f} ms"
        + (_untimed_note(chosen.device.type == "xla") if steps > _UNTIMED_STEPS else "")
    )
    if chosen.device.type == "xla":
        echo(f"XLA graphs compiled: {_xla_graphs_compiled()} (the same for any --steps)")
    still_tied = all(tied_in(model, group) for group in groups)
    echo(f"ties still held after training: {'yes' if still_tied else 'NO'}")
    return DemoReport(
        accelerator=chosen.name,
        device=str(chosen.device),
        count_before=count_before,
        count_after=count_after,
        tied_groups=[group.names for group in groups],
        ties_held=ties_held and still_tied,
        losses=losses,
        seconds_per_step=seconds_per_step,
    )


def report_ties(
    groups: Sequence[TiedGroup],
    count_before: int,
    moved: nn.Module,
    echo: Callable[[str], None] = print,
) -> bool:
    """Say whether each tied group and the unique-parameter count survived a move;
    return whether everything held. The demo and ``accel check`` both report this way.

    :param groups: the groups found before the move (:func:`accel.tying.find_tied_parameters`).
    :param moved: the module the move returned (a plugin may return a replacement),
        in which each group's slots are looked up by name.
    """
    count_after = count_unique_parameters(moved)
    echo(f"unique parameters: before move {count_before}, after move {count_after}")
    held = [tied_in(moved, group) for group in groups]
    for group, ok in zip(groups, held, strict=True):
        echo(f"tied group: {', '.join(group.names)}: {'held' if ok else 'BROKEN'}")
    every = all(held) and count_before == count_after
    echo(f"every tie held: {'yes' if every else 'NO'}")
    return every


def tied_in(model: nn.Module, group: TiedGroup) -> bool:
    """Whether ``group``'s slots, looked up by name in ``model``, hold one tensor:
    ``group.is_tied()`` reads the module the group was found in, which a move that
    returns a replacement leaves as it was."""
    tensors = []
    for name, (_module, _attribute, kind) in zip(group.names, group.slots, strict=True):
        path, _, attribute = name.rpartition(".")
        try:
            owner = model.get_submodule(path)
        except AttributeError:  # the replacement has no such module: not held
            return False
        slots = owner._parameters if kind == "parameter" else owner._buffers
        tensors.append(slots.get(attribute))
    first, *rest = tensors
    return first is not None and all(tensor is first for tensor in rest)


def _untimed_note(xla: bool) -> str:
    return f" (after the first {_UNTIMED_STEPS}{', where XLA compiles' if xla else ''})"


def _demo_loader() -> list[dict[str, torch.Tensor]]:
    """Next-token prediction over a repeating sequence, learnable in a few steps:
    four batches of two windows, every batch the same shape (one XLA graph)."""

    sequence = torch.arange(80) % 16
    windows = torch.stack([sequence[offset : offset + 64] for offset in range(8)])
    return [
        {"inputs": windows[i : i + 2, :-1], "targets": windows[i : i + 2, 1:]}
        for i in range(0, 8, 2)
    ]


def _backward(loss: torch.Tensor, accelerator: str) -> None:
    try:
        loss.backward()  # type: ignore[no-untyped-call]
    except RuntimeError as exc:
        if "device_ready_queues_" in str(exc):
            add_note(
                exc,
                f"accel: on {accelerator!r} this is torch_xla's known failure after a "
                f"backward() ran on the CPU before the XLA runtime started in this "
                f"process. Select the XLA accelerator (accel.get_accelerator('tpu')) "
                f"before any CPU training, or train on XLA in a process of its own.",
            )
        raise


def _xla_graphs_compiled() -> int:
    import torch_xla.debug.metrics as metrics

    data = metrics.metric_data("CompileTime")
    return int(data[0]) if data else 0
