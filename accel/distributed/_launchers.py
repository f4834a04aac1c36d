"""Where this process stands in the job, read from what its launcher set.

Three launchers are recognised, in this order:

- ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
  (``srun torchrun ...`` is torchrun's job);
- Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``. Before SLURM: ``mpirun`` inside an ``sbatch`` job
  starts ranks that inherit the batch shell's ``SLURM_PROCID=0``;
- SLURM's ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, and the
  first host of the step's node list as the rendezvous host. Only a process ``srun``
  started (``SLURM_STEP_ID`` set) is a task: ``sbatch`` sets ``SLURM_PROCID=0`` in its
  batch shell too, which is no task.

A launcher counts as present once its rank variables appear; then all of them must
be there, or the job would silently run as several worlds of one. ``MASTER_ADDR`` and
``MASTER_PORT`` alone (``torch_xla.launch`` sets just those) name no rank: a process
with only them runs alone.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from accel.distributed._errors import DistributedSetupError
from accel.distributed._slurm_lists import first_host, tasks_per_node

__all__ = [
    "DEFAULT_MASTER_PORT",
    "OPENMPI_VARIABLES",
    "SLURM_VARIABLES",
    "TORCHRUN_VARIABLES",
    "LaunchEnvironment",
    "read_launch_environment",
    "read_torchrun_environment",
]

#: The variables ``torchrun`` sets for every worker; accel needs all of them or none
#: of the first three (``MASTER_ADDR`` and ``MASTER_PORT`` alone are no launch).
TORCHRUN_VARIABLES: Final = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: What ``srun`` sets for every task that accel needs (plus a node list, or ``MASTER_ADDR``).
SLURM_VARIABLES: Final = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
#: What Open MPI's ``mpirun`` sets for every rank that accel needs.
OPENMPI_VARIABLES: Final = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
)
#: The rendezvous port when a launcher names none and gives no job id to derive one from
#: (torch's own default).
DEFAULT_MASTER_PORT: Final = 29500
#: Derived ports are ``_PORT_BASE + n mod _PORT_SPAN``, 20000 to 39996: clear of the
#: well-known ports, the range SLURM's port formula always used. The span is prime, so
#: ids that differ by a multiple of a power of two (Open MPI's job ids differ in their
#: upper 16 bits) do not fold onto a few ports, as they would modulo 20000.
_PORT_BASE: Final = 20000
_PORT_SPAN: Final = 19997
#: Steps of one SLURM job below this many get ports of their own.
_SLURM_STEPS_PER_JOB: Final = 100

_SLURM_NODE_LISTS: Final = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_SLURM_TASKS_PER_NODE: Final = (
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
)
_HINTS: Final = {
    "torchrun": "launch with `torchrun --nproc-per-node N script.py` (it sets all of them), "
    "set every one yourself, or unset them all to run as a single process (world size 1)",
    "slurm": "launch the tasks with `srun` (it sets all of them), or unset SLURM_PROCID "
    "and SLURM_STEP_ID to run as a single process",
    "openmpi": "launch with `mpirun -np N` (Open MPI sets all of them), or unset "
    "OMPI_COMM_WORLD_RANK to run as a single process",
}


@dataclass(frozen=True)
class LaunchEnvironment:
    """What the launcher told this process, validated (see :func:`read_launch_environment`)."""

    #: Global rank of this process, ``0 <= rank < world_size``.
    rank: int
    #: Number of processes in the job.
    world_size: int
    #: Rank of this process on its machine; selects the device (``cuda:LOCAL_RANK``).
    local_rank: int
    #: Address of the rank-0 host.
    master_addr: str
    #: Port of the rendezvous store on the rank-0 host.
    master_port: int
    #: Processes on this machine, ``None`` when the launcher did not say.
    local_world_size: int | None = None
    #: Who started the process: ``"torchrun"``, ``"slurm"`` or ``"openmpi"``.
    launcher: str = "torchrun"
    #: Where :attr:`master_port` came from, for error messages: ``"MASTER_PORT"``, or the
    #: variables it was derived from. Not part of equality: it describes, it decides nothing.
    master_port_source: str = field(default="MASTER_PORT", compare=False)


def read_launch_environment(
    environ: Mapping[str, str] | None = None,
) -> LaunchEnvironment | None:
    """Read and check the variables of whichever launcher started this process.

    torchrun's are read first (``srun torchrun`` is a torchrun job), then Open MPI's
    (``mpirun`` in an ``sbatch`` job: its ranks inherit ``SLURM_PROCID``), then SLURM's.

    :param environ: where to read them; ``None`` means :data:`os.environ`.
    :returns: the environment, or ``None`` when no launcher's rank variables are set
        (a process started on its own).
    :raises DistributedSetupError: a launcher's variables are partly set, a value is
        not usable (not an integer, rank beyond the world size, port out of range), or
        this is the batch shell of a SLURM job of several tasks (not started by ``srun``).
    """
    env = os.environ if environ is None else environ
    for reader in (_read_torchrun, _read_openmpi, _read_slurm):
        found = reader(env)
        if found is not None:
            return found
    return None


def read_torchrun_environment(
    environ: Mapping[str, str] | None = None,
) -> LaunchEnvironment | None:
    """Read and check torchrun's variables (:data:`TORCHRUN_VARIABLES`) only.

    :returns: the environment, or ``None`` when none of ``RANK``, ``WORLD_SIZE`` and
        ``LOCAL_RANK`` is set.
    :raises DistributedSetupError: as :func:`read_launch_environment`.
    """
    return _read_torchrun(os.environ if environ is None else environ)


def _present(env: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {name: env[name] for name in names if env.get(name, "").strip()}


def _require(
    launcher: str, what: str, env: Mapping[str, str], names: tuple[str, ...]
) -> dict[str, str]:
    present = _present(env, names)
    missing = tuple(name for name in names if name not in present)
    if missing:
        found = ", ".join(f"{name}={value!r}" for name, value in present.items())
        raise DistributedSetupError(
            f"the {what} environment is half set: found {found} but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; "
            f"{_HINTS[launcher]}",
            missing=missing,
        )
    return present


def _read_torchrun(env: Mapping[str, str]) -> LaunchEnvironment | None:
    if not _present(env, TORCHRUN_VARIABLES[:3]):
        return None
    values = _require("torchrun", "torchrun", env, TORCHRUN_VARIABLES)
    local_world_size = None
    if env.get("LOCAL_WORLD_SIZE", "").strip():
        local_world_size = _integer("torchrun", env, "LOCAL_WORLD_SIZE", minimum=1)
    return _checked(
        "torchrun",
        rank=_integer("torchrun", values, "RANK", minimum=0),
        world_size=_integer("torchrun", values, "WORLD_SIZE", minimum=1),
        local_rank=_integer("torchrun", values, "LOCAL_RANK", minimum=0),
        local_world_size=local_world_size,
        master_addr=values["MASTER_ADDR"].strip(),
        master_port=_integer("torchrun", values, "MASTER_PORT", minimum=1),
        names=("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    )


def _read_slurm(env: Mapping[str, str]) -> LaunchEnvironment | None:
    if not _present(env, ("SLURM_PROCID",)):
        return None
    if not _present(env, ("SLURM_STEP_ID",)):
        # sbatch's batch shell: SLURM_PROCID=0 without a step, no task of its own.
        _refuse_batch_shell(env)
        return None
    values = _require("slurm", "SLURM", env, SLURM_VARIABLES)
    master_addr = env.get("MASTER_ADDR", "").strip()
    if not master_addr:
        node_list = next((env[n] for n in _SLURM_NODE_LISTS if env.get(n, "").strip()), None)
        if node_list is None:
            raise DistributedSetupError(
                f"the SLURM environment names no host for the rendezvous: none of "
                f"{', '.join(_SLURM_NODE_LISTS)} nor MASTER_ADDR is set; "
                f"{_HINTS['slurm']}, or set MASTER_ADDR to the rank-0 host",
                missing=("SLURM_JOB_NODELIST",),
            )
        master_addr = first_host(node_list)
    local_world_size, local_size_name = _slurm_local_world_size(env)
    port, source = _slurm_port(env)
    return _checked(
        "slurm",
        rank=_integer("slurm", values, "SLURM_PROCID", minimum=0),
        world_size=_integer("slurm", values, "SLURM_NTASKS", minimum=1),
        local_rank=_integer("slurm", values, "SLURM_LOCALID", minimum=0),
        local_world_size=local_world_size,
        master_addr=master_addr,
        master_port=port,
        master_port_source=source,
        names=(*SLURM_VARIABLES, local_size_name),
    )


def _refuse_batch_shell(env: Mapping[str, str]) -> None:
    """A batch shell of a job of several tasks would wait for peers until the timeout;
    one of a single task is that task, and runs alone."""
    if not env.get("SLURM_NTASKS", "").strip():
        return
    tasks = _integer("slurm", env, "SLURM_NTASKS", minimum=1)
    if tasks > 1:
        job = env.get("SLURM_JOB_ID", "").strip() or "?"
        raise DistributedSetupError(
            f"this process is the batch shell of SLURM job {job}, not one of its tasks: "
            f"SLURM_PROCID={env['SLURM_PROCID'].strip()!r} is set but SLURM_STEP_ID is not "
            f"(sbatch started it, not srun), and the job has SLURM_NTASKS={tasks} tasks, "
            f"whose peers would never come; start the tasks with `srun python ...` in the "
            f"batch script (or `mpirun`), or allocate one task (`sbatch -n 1`) to run a "
            f"single process",
            missing=("SLURM_STEP_ID",),
        )


def _slurm_local_world_size(env: Mapping[str, str]) -> tuple[int | None, str]:
    """This node's task count and the variable it came from: the step's own list first
    (what srun started), then the job's, then the ``--ntasks-per-node`` request."""
    for name in _SLURM_TASKS_PER_NODE:
        text = env.get(name, "").strip()
        if not text:
            continue
        counts = tasks_per_node(text, name=name)
        if len(set(counts)) == 1:
            return counts[0], name
        node = env.get("SLURM_NODEID", "").strip()  # the node's index in the step
        if re.fullmatch(r"[0-9]+", node) and int(node) < len(counts):
            return counts[int(node)], f"{name}[SLURM_NODEID={node}]"
        return None, name  # uneven and no usable node index: cannot tell, check nothing
    return None, "SLURM_STEP_TASKS_PER_NODE"


def _slurm_port(env: Mapping[str, str]) -> tuple[int, str]:
    """``MASTER_PORT``, else one derived from the job and step ids: every task of a step
    computes the same port, and two steps of a job, or two jobs on a node, rarely share
    one (steps 0 to 99 of jobs less than 200 ids apart never do)."""
    if env.get("MASTER_PORT", "").strip():
        return _integer("slurm", env, "MASTER_PORT", minimum=1), "MASTER_PORT"
    job = env.get("SLURM_JOB_ID", "").strip()
    step = env.get("SLURM_STEP_ID", "").strip()
    if not re.fullmatch(r"[0-9]+", job):
        return DEFAULT_MASTER_PORT, f"torch's default {DEFAULT_MASTER_PORT} (no SLURM_JOB_ID)"
    step_number = int(step) if re.fullmatch(r"[0-9]+", step) else 0
    number = _SLURM_STEPS_PER_JOB * int(job) + step_number
    return (
        _PORT_BASE + number % _PORT_SPAN,
        f"derived by accel from SLURM_JOB_ID={job} and SLURM_STEP_ID={step or '?'}",
    )


def _read_openmpi(env: Mapping[str, str]) -> LaunchEnvironment | None:
    if not _present(env, ("OMPI_COMM_WORLD_RANK",)):
        return None
    values = _require("openmpi", "Open MPI", env, OPENMPI_VARIABLES)
    world_size = _integer("openmpi", values, "OMPI_COMM_WORLD_SIZE", minimum=1)
    local_world_size = None
    if env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "").strip():
        local_world_size = _integer("openmpi", env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
    master_addr = env.get("MASTER_ADDR", "").strip()
    if not master_addr:
        if local_world_size != world_size:
            raise DistributedSetupError(
                "Open MPI does not tell its ranks where rank 0 runs, and this job may span "
                f"machines (OMPI_COMM_WORLD_LOCAL_SIZE={local_world_size} of "
                f"OMPI_COMM_WORLD_SIZE={world_size}); pass the rank-0 host with "
                "`mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT ...`",
                missing=("MASTER_ADDR",),
            )
        master_addr = "127.0.0.1"  # every rank is on this machine
    port, source = _openmpi_port(env)
    return _checked(
        "openmpi",
        rank=_integer("openmpi", values, "OMPI_COMM_WORLD_RANK", minimum=0),
        world_size=world_size,
        local_rank=_integer("openmpi", values, "OMPI_COMM_WORLD_LOCAL_RANK", minimum=0),
        local_world_size=local_world_size,
        master_addr=master_addr,
        master_port=port,
        master_port_source=source,
        names=(*OPENMPI_VARIABLES, "OMPI_COMM_WORLD_LOCAL_SIZE"),
    )


def _openmpi_port(env: Mapping[str, str]) -> tuple[int, str]:
    """``MASTER_PORT``, else one derived from the id Open MPI gives every ``mpirun``
    job: the same on every rank, and another for a concurrent ``mpirun``."""
    if env.get("MASTER_PORT", "").strip():
        return _integer("openmpi", env, "MASTER_PORT", minimum=1), "MASTER_PORT"
    job_id = env.get("OMPI_MCA_ess_base_jobid", "").strip()  # Open MPI 4: a 32-bit number
    if re.fullmatch(r"[0-9]+", job_id):
        return (
            _PORT_BASE + int(job_id) % _PORT_SPAN,
            f"derived by accel from OMPI_MCA_ess_base_jobid={job_id} (this mpirun job's id)",
        )
    namespace = env.get("PMIX_NAMESPACE", "").strip()  # Open MPI 5 (PRRTE) names its jobs
    if namespace:
        return (
            _PORT_BASE + zlib.crc32(namespace.encode()) % _PORT_SPAN,
            f"derived by accel from PMIX_NAMESPACE={namespace!r} (this mpirun job's name)",
        )
    return (
        DEFAULT_MASTER_PORT,
        f"torch's default {DEFAULT_MASTER_PORT} (no OMPI_MCA_ess_base_jobid or "
        f"PMIX_NAMESPACE to derive one from)",
    )


def _checked(
    launcher: str,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int | None,
    master_addr: str,
    master_port: int,
    names: tuple[str, str, str, str],
    master_port_source: str = "MASTER_PORT",
) -> LaunchEnvironment:
    rank_name, size_name, local_name, local_size_name = names
    hint = _HINTS[launcher]
    if rank >= world_size:
        raise DistributedSetupError(
            f"{rank_name}={rank} is not below {size_name}={world_size}: ranks run from 0 to "
            f"{world_size - 1}; {hint}"
        )
    if local_world_size is not None and local_rank >= local_world_size:
        raise DistributedSetupError(
            f"{local_name}={local_rank} is not below {local_size_name}={local_world_size}; {hint}"
        )
    if master_port > 65535:
        raise DistributedSetupError(
            f"MASTER_PORT={master_port} is not a TCP port (1 to 65535); pick a free port"
        )
    return LaunchEnvironment(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr=master_addr,
        master_port=master_port,
        local_world_size=local_world_size,
        launcher=launcher,
        master_port_source=master_port_source,
    )


def _integer(launcher: str, env: Mapping[str, str], name: str, *, minimum: int) -> int:
    text = env[name].strip()
    value = int(text) if re.fullmatch(r"[+-]?\d+", text) else minimum - 1
    if value < minimum:
        raise DistributedSetupError(
            f"{name}={env[name]!r} is not an integer >= {minimum}; {_HINTS[launcher]}"
        )
    return value
