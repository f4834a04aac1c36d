"""docs/large-models.md's recipe, run as the page says: the script it includes, under
torchrun on four gloo processes (a 2x2 mesh), against the same steps in one process."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from helpers.distributed import run_torchrun, worker_env

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "large-models.md"
SCRIPT = "examples/large_models/train_2d.py"
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.MULTILINE)


def _commands() -> list[list[str]]:
    """The commands of the page's bash block that runs the recipe."""
    block = re.search(r"```bash\n(torchrun [^`]*?)```", PAGE.read_text())
    assert block is not None, "docs/large-models.md has no bash block starting with torchrun"
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]


def _losses(output: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in LOSS.findall(output)}


def test_the_page_includes_the_recipe_script_it_runs() -> None:
    assert f'--8<-- "{SCRIPT}"' in PAGE.read_text()
    assert all(SCRIPT in command for command in _commands())


def test_the_recipe_on_a_2x2_mesh_trains_as_one_process() -> None:
    sharded, eager = _commands()
    assert sharded[:3] == ["torchrun", "--nproc-per-node", "4"], sharded
    assert eager[0] == "python", eager
    launched = run_torchrun(
        [str(REPO / part) if part == SCRIPT else part for part in sharded[3:]], nproc=4
    )
    assert launched.returncode == 0, launched.stdout[-4000:]
    alone = subprocess.run(
        [sys.executable, *(str(REPO / part) if part == SCRIPT else part for part in eager[1:])],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    on_the_mesh, in_one_process = _losses(launched.stdout), _losses(alone.stdout)
    assert sorted(on_the_mesh) == sorted(in_one_process) == [0, 1, 2, 3]
    for step, loss in in_one_process.items():
        assert abs(on_the_mesh[step] - loss) <= 1e-5, (step, on_the_mesh[step], loss)
