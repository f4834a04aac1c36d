"""Model factories for `accel check MODULE:FACTORY` in tests/tools/test_cli*.py.

Imported by the CLI as ``tests.helpers.cli_factories`` (run from the repository root) or as
``helpers.cli_factories`` (with tests/ on the path), so it imports only torch and the test models.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.models import OwnTieWeights, TiedLM, UntiesOnPurpose


def tied_model() -> nn.Module:
    """Embedding and head share one weight: one tied group."""
    return TiedLM()


def own_tie_weights() -> nn.Module:
    """Ties through its own tie_weights(), as Hugging Face models do."""
    return OwnTieWeights()


def untying_model() -> nn.Module:
    """Tied at first, but its tie_weights() gives the head a weight of its own."""
    return UntiesOnPurpose()


def untied_model() -> nn.Module:
    """No ties at all: nothing to break."""
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def not_a_module() -> object:
    """Returns something that is not a torch.nn.Module."""
    return {"weights": [1, 2, 3]}


def raising() -> nn.Module:
    """The factory itself fails."""
    raise RuntimeError("cannot build the model: config.json missing")


#: Not callable: `accel check tests.helpers.cli_factories:NOT_CALLABLE` is an error.
NOT_CALLABLE = 42


class Factories:
    """A nested attribute: `accel check tests.helpers.cli_factories:Factories.tied`."""

    tied = staticmethod(tied_model)
