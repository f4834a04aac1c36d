"""An FSDP2 checkpoint saved by two ranks loads onto one: DCP reshards it, through
the same accel.distributed.load_sharded call. And what a save killed midway leaves
is cleared by the next save to that path."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import accel
import accel.distributed
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    no_launcher_and_no_group,
    run_torchrun,
    worker_env,
)

SCRIPT = str(SCRIPTS / "fsdp_reshard.py")


def test_a_two_rank_fsdp_checkpoint_loads_onto_one_rank(tmp_path: Path) -> None:
    saved = run_torchrun([SCRIPT, "save", str(tmp_path)], nproc=2, env=worker_env())
    assert saved.returncode == 0, saved.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]  # each rank wrote its shards
    loaded = run_torchrun([SCRIPT, "load", str(tmp_path)], nproc=1, env=worker_env())
    assert loaded.returncode == 0, loaded.stdout

    cpu = accel.get_accelerator("cpu")
    before, after = cpu.load(tmp_path / "save.pt"), cpu.load(tmp_path / "load.pt")
    assert (before["world_size"], after["world_size"]) == (2, 1)
    assert after["step"] == 2 and after["tied"] and before["tied"]
    for group in ("parameters", "moments"):
        assert before[group].keys() == after[group].keys() and before[group]
        for name, value in before[group].items():
            assert torch.equal(after[group][name], value), (group, name)
    # The one rank is rank 0: it gets saved rank 0's generators, and says the world changed.
    saved = [_generators(tmp_path / f"save-rank{rank}.pt") for rank in (0, 1)]
    assert not torch.equal(saved[0]["torch"], saved[1]["torch"])
    [mine] = [_generators(tmp_path / "load-rank0.pt")]
    assert torch.equal(mine["torch"], saved[0]["torch"])
    assert mine["warnings"] == [
        "load: the checkpoint holds the random generators of 2 rank(s), but this job has "
        "1: rank 0 gets its own. Draws after this resume differ from an uninterrupted run "
        "of 2 rank(s)"
    ]


def test_on_more_ranks_than_saved_a_new_rank_gets_rank_0s_generators(tmp_path: Path) -> None:
    saved = run_torchrun([SCRIPT, "save", str(tmp_path)], nproc=2, env=worker_env())
    assert saved.returncode == 0, saved.stdout
    loaded = run_torchrun([SCRIPT, "load", str(tmp_path)], nproc=3, env=worker_env())
    assert loaded.returncode == 0, loaded.stdout

    before = accel.get_accelerator("cpu").load(tmp_path / "save.pt")
    after = accel.get_accelerator("cpu").load(tmp_path / "load.pt")
    assert (after["world_size"], after["step"]) == (3, 2)
    for name, value in before["parameters"].items():
        assert torch.equal(after["parameters"][name], value), name
    saved_states = [_generators(tmp_path / f"save-rank{rank}.pt")["torch"] for rank in (0, 1)]
    loaded_ranks = [_generators(tmp_path / f"load-rank{rank}.pt") for rank in (0, 1, 2)]
    assert torch.equal(loaded_ranks[0]["torch"], saved_states[0])
    assert torch.equal(loaded_ranks[1]["torch"], saved_states[1])
    assert torch.equal(loaded_ranks[2]["torch"], saved_states[0])  # the fallback
    [warning] = loaded_ranks[2]["warnings"]
    assert "holds the random generators of 2 rank(s), but this job has 3" in warning
    assert "rank 2 was not saved, so it gets rank 0's generators" in warning
    assert "acc.manual_seed(seed + rank)" in warning
    assert [len(rank["warnings"]) for rank in loaded_ranks] == [1, 1, 1]


def _generators(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def test_save_sharded_removes_the_temporary_directory_of_a_save_that_was_killed(
    tmp_path: Path,
) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(gone.stdout)
    target = tmp_path / "step-000000006.pt"
    stale = tmp_path / f".{target.name}.{socket.gethostname()}.{dead_pid}.accel-tmp"
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"torn")  # what a kill mid-save leaves
    other = tmp_path / f".step-000000003.pt.{socket.gethostname()}.{dead_pid}.accel-tmp"
    other.mkdir()  # another step's: not this save's to judge

    model = nn.Linear(2, 2)
    accel.distributed.save_sharded({"model": model, "step": 6}, target)

    assert (target / ".metadata").is_file()
    assert not stale.exists()
    assert other.exists()
    restored = nn.Linear(2, 2)
    assert accel.distributed.load_sharded(target, {"model": restored, "step": 0}) == {"step": 6}
    assert torch.equal(restored.weight, model.weight)
