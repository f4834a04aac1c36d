"""The conformance kit: accel's promises to a plugin, checked on the plugin's device.

A vendor runs it in their own CI, through pytest or the ``accel`` command::

    python -m pytest --pyargs accel.testing.conformance --accelerator npu [--accel-limits MOD:OBJ]
    accel conformance npu [--limits MOD:OBJ] [--json report.json]

The pytest form needs pytest installed in the environment that holds accel and the
plugin (a pytest from another environment does not know ``--accelerator``); the
``accel`` command needs no pytest.

or from Python:

>>> from accel.testing.conformance import run
>>> [o.outcome for o in run("cpu", promises=["moves.ties_kept_to_device"])]
['passed']

Every check goes through accel's public API only. What the device cannot do is
declared in a :class:`Limits` object; the promises that need it are skipped with the
declared reason. Everything else must hold; an unknown or unavailable accelerator is
an error, never a skip.
"""

from __future__ import annotations

from accel.testing.conformance._limits import Limits
from accel.testing.conformance._runner import Outcome, all_promises, run

__all__ = ["Limits", "Outcome", "all_promises", "run"]
