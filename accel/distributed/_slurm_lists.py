"""SLURM's compressed lists, read: node lists (``gpu[07-09,12],cpu01``) and tasks per
node (``2(x3),1``), as SLURM writes them into every task's environment."""

from __future__ import annotations

import re

from accel.distributed._errors import DistributedSetupError

__all__ = ["first_host", "tasks_per_node"]


def tasks_per_node(text: str, *, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """The per-node task counts of a SLURM list: ``"2(x3),1"`` gives ``[2, 2, 2, 1]``.

    :raises DistributedSetupError: ``text`` is not such a list.
    """
    counts: list[int] = []
    for item in text.strip().split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*(?:\(x([0-9]+)\))?\s*", item)
        if match is None or int(match.group(1)) < 1 or match.group(2) == "0":
            raise DistributedSetupError(
                f"{name}={text!r} is not a SLURM list of tasks per node (such as "
                f"'2(x3),1': 2 tasks on each of 3 nodes, then 1); launch the tasks with "
                f"`srun`, which sets it"
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def first_host(node_list: str) -> str:
    """The first host of a SLURM node list: ``"gpu[07-09,12],cpu01"`` gives ``"gpu07"``.

    SLURM compresses lists as ``prefix[ranges]suffix``, possibly several bracket groups
    per name (``"rack[1-2]-n[01-04]"`` gives ``"rack1-n01"``); zero padding is kept.

    :raises DistributedSetupError: the list is empty or its brackets do not close.
    """
    text = node_list.strip()
    first = []
    depth = 0
    for char in text:
        if char == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(char, 0)
        first.append(char)
    name = "".join(first).strip()
    host = re.sub(r"\[([^\[\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], name)
    if not host or "[" in host or "]" in host or depth != 0:
        raise DistributedSetupError(
            f"cannot read the first host of the SLURM node list {node_list!r}; set "
            f"MASTER_ADDR to the rank-0 host"
        )
    return host
