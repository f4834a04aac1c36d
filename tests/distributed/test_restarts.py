"""A job torchrun restarted starts its group under a store prefix of its own attempt, so
that no worker reads the keys the attempt before left (gloo's addresses of dead
workers). The restart itself, a rank SIGKILLed under ``--max-restarts 1``:
tests/distributed/test_resume_ranks.py."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from accel.distributed._launchers import LaunchEnvironment
from accel.distributed._restarts import attempt_store
from helpers.distributed import free_port


def _environment(port: int) -> LaunchEnvironment:
    return LaunchEnvironment(
        rank=1, world_size=2, local_rank=1, master_addr="127.0.0.1", master_port=port
    )


def test_each_attempt_writes_under_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    timeout = datetime.timedelta(seconds=10)
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        store = attempt_store(_environment(port), timeout)
        assert store is not None
        store.set("rank_1", f"address of attempt {attempt}")
    assert agent.get("accel/attempt_0/rank_1") == b"address of attempt 0"
    assert agent.get("accel/attempt_1/rank_1") == b"address of attempt 1"
    assert not agent.check(["rank_1"])  # nothing under the bare key a restart would read


def test_without_the_agents_store_rank_0_starts_one_and_nothing_is_prefixed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert attempt_store(_environment(free_port()), None) is None
