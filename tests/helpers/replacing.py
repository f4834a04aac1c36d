"""A test plugin whose ``model_to_device`` returns a replacement module, not the model.

The replacement is a deep copy, moved, with the model's ties; the model given to the
move is then left with its ``head`` untied (a weight of its own). accel keeps the ties
of the module a move returns, so whoever judges the move by that module sees every tie
held, and whoever judges it by the model it gave sees a broken one: fooled.
"""

from __future__ import annotations

import copy

import torch

import accel
from helpers.fakes import FakeAccelerator


class ReplacingAccelerator(FakeAccelerator):
    """Moves a copy of the model and unties the ``head`` of the model it was given."""

    @accel.hookimpl
    def model_to_device(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        moved = copy.deepcopy(model).to(device)
        head = getattr(model, "head", None)
        if isinstance(head, torch.nn.Linear):
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
        return moved
