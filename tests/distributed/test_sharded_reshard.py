"""An FSDP2 checkpoint saved by two ranks loads onto one: DCP reshards it, through
the same accel.distributed.load_sharded call."""

from __future__ import annotations

from pathlib import Path

import torch

import accel
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
