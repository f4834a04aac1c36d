"""A test plugin whose ``model_to_device`` returns a replacement module, not the model.

The replacement is a deep copy, moved, with the model's ties; the model given to the
move then gets a new ``head`` module with a weight of its own. accel keeps the ties of
the module a move returns (and puts back the slots of the given model's modules the
replacement does not hold, the old ``head`` among them), so whoever judges the move by
that module sees every tie held, and whoever judges it by the model it gave sees a
broken one: fooled.
"""

from __future__ import annotations

import copy

import torch

import accel
from helpers.fakes import FakeAccelerator


class ReplacingAccelerator(FakeAccelerator):
    """Moves a copy of the model and gives the model it was given an untied ``head``."""

    @accel.hookimpl
    def model_to_device(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        moved = copy.deepcopy(model).to(device)
        head = getattr(model, "head", None)
        if isinstance(head, torch.nn.Linear):
            model.head = copy.deepcopy(head)  # a module, and a weight, of its own
        return moved
