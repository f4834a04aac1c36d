"""atomic_save from several threads at once: each save's temporary file is its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import torch

from accel._util.files import stale_temporaries
from accel.training.checkpoint._atomic import TEMPORARY_MARK, atomic_save


def test_saves_to_one_path_from_two_threads_each_leave_a_complete_checkpoint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "last.pt"
    errors: list[BaseException] = []
    torn: list[str] = []

    def save(value: float) -> None:
        state = {"w": torch.full((256, 1024), value), "value": value}
        try:
            for _ in range(5):
                atomic_save(state, path)
                # Whatever save finished last, the path holds a whole checkpoint.
                loaded = torch.load(path, weights_only=True)
                if not torch.equal(loaded["w"], torch.full((256, 1024), loaded["value"])):
                    torn.append(f"{loaded['value']}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(float(i),)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and torn == []
    assert not [name for name in os.listdir(tmp_path) if name.endswith(TEMPORARY_MARK)]


def test_a_symbolic_link_at_the_path_is_replaced_and_its_target_kept(tmp_path: Path) -> None:
    (tmp_path / "step-1.pt").write_bytes(b"the first checkpoint")
    (tmp_path / "last.pt").symlink_to("step-1.pt")
    atomic_save({"step": 2}, tmp_path / "last.pt")
    assert not (tmp_path / "last.pt").is_symlink()
    assert torch.load(tmp_path / "last.pt", weights_only=True) == {"step": 2}
    assert (tmp_path / "step-1.pt").read_bytes() == b"the first checkpoint"


def test_a_stale_temporary_is_found_whatever_its_random_part(tmp_path: Path) -> None:
    # The random part of a temporary's name is eight hex digits; about one in forty is
    # all decimal digits, which a greedy match once took for the pid (and the real pid
    # for part of the host name), so that temporary stayed forever.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = f".step.pt.{socket.gethostname()}"
    stale = [f"{prefix}.{dead.pid}.{random}.accel-tmp" for random in ("21219087", "abc0ef12")]
    alive = f"{prefix}.{os.getpid()}.21219087.accel-tmp"
    for name in [*stale, alive]:
        (tmp_path / name).write_bytes(b"")
    found = sorted(entry.name for entry in stale_temporaries(tmp_path / "step.pt"))
    assert found == sorted(stale)
