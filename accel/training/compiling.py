"""``torch.compile`` with the accelerator's backend, and checkpoints of compiled models.

Each device compiles with its own backend: inductor on the CPU and CUDA, ``openxla``
on XLA, a vendor's own for a third-party accelerator; the ``compile_backend`` hook
names it. A compiled module (torch's ``OptimizedModule``) holds the model as
``_orig_mod``, so its ``state_dict()`` prefixes every key with ``_orig_mod.`` and the
checkpoint no longer loads into the plain model; :func:`unwrap_compiled` undoes that.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["unwrap_compiled"]


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (through any number of compilations), or
    ``model`` itself when it is not a compiled module."""
    # Only torch._dynamo makes compiled modules: without it imported there is none.
    if "torch._dynamo" not in sys.modules:
        return model
    from torch._dynamo.eval_frame import OptimizedModule

    while isinstance(model, OptimizedModule):
        model = model._orig_mod
    return model
