"""A test plugin whose ``model_to_device`` returns a replacement module, not the model.

The replacement is a deep copy, moved, whose ``head`` gets a weight of its own: a
vendor's move that unties. The model given to the move is left as it was (still
tied), so whoever judges the move by the model it gave, not the one returned, is fooled.
"""

from __future__ import annotations

import copy

import torch

import accel
from helpers.fakes import FakeAccelerator


class ReplacingAccelerator(FakeAccelerator):
    """Moves a copy of the model to the CPU and unties its ``head`` from the rest."""

    @accel.hookimpl
    def model_to_device(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        moved = copy.deepcopy(model).to(device)
        head = getattr(moved, "head", None)
        if isinstance(head, torch.nn.Linear):
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
        return moved
