"""Every module's parameter, buffer and submodule slots at one moment: what tie keeping
and a failed move's undo both put back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel._util.walk import each_module

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["SlotContents"]


_Slots = tuple[
    "nn.Module",
    dict[str, "torch.Tensor | None"],
    dict[str, "torch.Tensor | None"],
    dict[str, "nn.Module | None"],
]


class SlotContents:
    """Every module's parameter, buffer and submodule slots at one moment.

    Holds references, never copies of tensors: :meth:`restore` puts the very same
    objects back, so whatever was in a slot keeps its values.
    """

    __slots__ = ("_saved",)

    def __init__(self, model: nn.Module) -> None:
        self._saved: list[_Slots] = [
            (module, dict(module._parameters), dict(module._buffers), dict(module._modules))
            for module in each_module(model)
        ]

    def modules(self) -> list[_Slots]:
        """``(module, parameters, buffers, submodules)`` of each module, as captured."""
        return self._saved

    def restore(self) -> bool:
        """Put every captured slot's object back (slots added since are dropped).

        Returns whether any slot had changed.
        """
        changed = False
        for module, parameters, buffers, submodules in self._saved:
            for live, saved in (
                (module._parameters, parameters),
                (module._buffers, buffers),
                (module._modules, submodules),
            ):
                # Compared with `is`: `==` would call tensors' elementwise __eq__.
                if len(live) != len(saved) or any(
                    live.get(name) is not value for name, value in saved.items()
                ):
                    changed = True
                    live.clear()
                    live.update(saved)  # type: ignore[arg-type]
        return changed
