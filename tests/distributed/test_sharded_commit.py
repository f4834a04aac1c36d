"""save_sharded's commit over two gloo ranks: when rank 0 cannot give the complete
directory its name, every rank raises an OSError with rank 0's errno and the path (in
both modes), rather than waiting at a barrier until the group times out."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    no_launcher_and_no_group,
    read_reports,
    run_torchrun,
    worker_env,
)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rank_0s_failed_rename_is_an_os_error_on_every_rank(tmp_path: Path, mode: str) -> None:
    done = run_torchrun(
        [str(SCRIPTS / "sharded_commit_ranks.py"), mode, str(tmp_path)], env=worker_env()
    )
    assert done.returncode == 0, done.stdout
    rank0, rank1 = read_reports(tmp_path, 2)
    assert rank0.get("error") == "PermissionError"  # rank 0's own
    assert rank1.get("error") == "AcceleratorOSError"  # its word, heard over the group
    for report in (rank0, rank1):
        assert report["errno"] == errno.EACCES
        assert report["filename"] == str(tmp_path / "ckpt")
        assert report["target_exists"] is False
        assert report["leftovers"] == []  # rank 0 removed the temporary directory
