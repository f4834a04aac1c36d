"""The rendezvous store of a job torchrun restarted: a namespace per attempt.

Under torchrun the workers join the store its agent runs (``TORCHELASTIC_USE_AGENT_STORE``),
and with the default static rendezvous the agent keeps that one store across the
restarts of ``--max-restarts``. torch once put each attempt's keys under a prefix of its
own (``/worker/attempt_N``); torch 2.9 to 2.13 no longer do ("a new TCPStore for every
retry", which the static rendezvous does not create), so a restarted worker can read
the previous attempt's keys: gloo then connects to the dead workers' ports
(``Connection refused`` until ``connectFullMesh`` times out) and NCCL reads the old
unique id (pytorch#135712, pytorch#167288). Here the group of a restarted job is
started on the agent's store under ``accel/attempt_<TORCHELASTIC_RESTART_COUNT>``, the
same for every worker of the agent.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

from accel.distributed._launchers import LaunchEnvironment

__all__ = ["attempt_store"]


def attempt_store(environment: LaunchEnvironment, timeout: datetime.timedelta | None) -> Any | None:
    """A client of torchrun's agent store whose keys live under this attempt's prefix;
    ``None`` where the workers do not share the agent's store (rank 0 then starts a
    store of its own, new at every attempt)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # torch re-exports both from its C extension without declaring them in __all__.
    store = dist.TCPStore(  # type: ignore[attr-defined]
        host_name=environment.master_addr,
        port=environment.master_port,
        world_size=environment.world_size,
        is_master=False,
        timeout=datetime.timedelta(minutes=30) if timeout is None else timeout,
    )
    return dist.PrefixStore(f"accel/attempt_{attempt}", store)  # type: ignore[attr-defined]
