"""Reading the launch environment: torchrun, SLURM's srun, Open MPI's mpirun.

The last tests run the 2-process training worker as two plain subprocesses with
the variables srun and mpirun would set, on loopback."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

import accel
import accel.distributed as adist
import accel.distributed._launchers as launchers
from accel.distributed._launchers import tasks_per_node
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    free_port,
    full_environment,
    no_launcher_and_no_group,
    read_reports,
    run_workers,
    worker_env,
)


def test_no_variables_means_a_single_process() -> None:
    assert launchers.read_torchrun_environment({"PATH": "/bin"}) is None
    assert launchers.read_torchrun_environment({"RANK": "  "}) is None  # blank counts as unset


def test_full_environment_is_parsed() -> None:
    environment = launchers.read_torchrun_environment(
        full_environment(
            RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_PORT="1234", LOCAL_WORLD_SIZE="2"
        )
    )
    assert environment == adist.LaunchEnvironment(
        rank=3,
        world_size=4,
        local_rank=1,
        master_addr="127.0.0.1",
        master_port=1234,
        local_world_size=2,
    )


@pytest.mark.parametrize(
    "present",
    [
        ("RANK",),
        ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"),
        ("RANK", "WORLD_SIZE", "MASTER_ADDR"),
    ],
)
def test_half_set_environment_names_what_is_missing(present: tuple[str, ...]) -> None:
    env = {name: value for name, value in full_environment().items() if name in present}
    with pytest.raises(adist.DistributedSetupError) as caught:
        launchers.read_torchrun_environment(env)
    missing = tuple(name for name in launchers.TORCHRUN_VARIABLES if name not in present)
    assert caught.value.missing == missing
    message = str(caught.value)
    assert all(name in message for name in missing)
    assert f"{present[0]}=" in message  # what was found
    assert "torchrun" in message and "unset them all" in message  # what to do
    assert isinstance(caught.value, accel.AcceleratorError)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"RANK": "one"}, "RANK='one' is not an integer >= 0"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not an integer >= 0"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
        ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below"),
    ],
)
def test_unusable_values_are_rejected(overrides: dict[str, str], expected: str) -> None:
    env = full_environment(RANK="2", WORLD_SIZE="4")
    env.update(overrides)
    with pytest.raises(adist.DistributedSetupError, match=expected):
        launchers.read_torchrun_environment(env)


def test_init_refuses_a_half_set_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(adist.DistributedSetupError, match="LOCAL_RANK, MASTER_ADDR, MASTER_PORT"):
        adist.init_process_group("cpu")
    assert not dist.is_initialized()
    assert adist.current_context() is None


def test_master_variables_alone_are_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch_xla.launch sets just these two; they name no rank, so no launch.
    only_master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12355"}
    assert adist.read_launch_environment(only_master) is None
    for name, value in only_master.items():
        monkeypatch.setenv(name, value)
    context = adist.init_process_group("cpu")
    assert (context.launched, context.launcher, context.world_size) == (False, None, 1)


# -- SLURM -------------------------------------------------------------------------


def slurm(**overrides: str) -> dict[str, str]:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_ID": "0",  # srun started it: a task, not the batch shell
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NODELIST": "gpu[07-08,12]",
    }
    env.update(overrides)
    return {name: value for name, value in env.items() if value}


def test_slurm_environment_is_parsed() -> None:
    environment = adist.read_launch_environment(slurm())
    assert environment == adist.LaunchEnvironment(
        rank=5,
        world_size=8,
        local_rank=1,
        master_addr="gpu07",  # the node list's first host
        master_port=20000 + (100 * 123456 + 0) % 19997,  # the same on every task of the step
        launcher="slurm",
    )


def test_slurm_prefers_the_step_node_list_and_explicit_master_variables() -> None:
    step = adist.read_launch_environment(slurm(SLURM_STEP_NODELIST="cpu[3-4]"))
    assert step is not None and step.master_addr == "cpu3"
    explicit = adist.read_launch_environment(slurm(MASTER_ADDR="10.0.0.9", MASTER_PORT="4000"))
    assert explicit is not None
    assert (explicit.master_addr, explicit.master_port) == ("10.0.0.9", 4000)


@pytest.mark.parametrize(
    ("node_list", "first"),
    [
        ("node01", "node01"),
        ("node01,node02", "node01"),
        ("gpu[007-010]", "gpu007"),  # zero padding kept
        ("gpu[3,5-6],cpu1", "gpu3"),
        ("rack[2-3]-n[01-04]", "rack2-n01"),
        ("a[1-2]b,c", "a1b"),
    ],
)
def test_first_host_of_a_slurm_node_list(node_list: str, first: str) -> None:
    environment = adist.read_launch_environment(slurm(SLURM_JOB_NODELIST=node_list))
    assert environment is not None and environment.master_addr == first


def test_unreadable_slurm_node_list_is_an_error() -> None:
    with pytest.raises(adist.DistributedSetupError, match=r"node list 'gpu\[1-2'.*MASTER_ADDR"):
        adist.read_launch_environment(slurm(SLURM_JOB_NODELIST="gpu[1-2"))


@pytest.mark.parametrize("dropped", ["SLURM_NTASKS", "SLURM_LOCALID"])
def test_half_set_slurm_environment_names_what_is_missing(dropped: str) -> None:
    with pytest.raises(adist.DistributedSetupError, match="SLURM environment is half set") as e:
        adist.read_launch_environment(slurm(**{dropped: ""}))
    assert e.value.missing == (dropped,)
    assert "SLURM_PROCID='5'" in str(e.value) and "srun" in str(e.value)


def test_slurm_without_a_host_for_the_rendezvous_is_an_error() -> None:
    with pytest.raises(adist.DistributedSetupError, match=r"no host.*MASTER_ADDR"):
        adist.read_launch_environment(slurm(SLURM_JOB_NODELIST=""))


def test_slurm_rank_beyond_the_tasks_is_an_error() -> None:
    with pytest.raises(adist.DistributedSetupError, match="SLURM_PROCID=8 is not below"):
        adist.read_launch_environment(slurm(SLURM_PROCID="8"))


def test_torchrun_started_by_srun_is_a_torchrun_job() -> None:
    env = {**slurm(), **full_environment(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")}
    environment = adist.read_launch_environment(env)
    assert environment is not None
    assert (environment.launcher, environment.rank, environment.world_size) == ("torchrun", 1, 2)


# -- Open MPI -------------------------------------------------------------------------


def openmpi(**overrides: str) -> dict[str, str]:
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "head-node",
    }
    env.update(overrides)
    return {name: value for name, value in env.items() if value}


def test_openmpi_environment_is_parsed() -> None:
    assert adist.read_launch_environment(openmpi()) == adist.LaunchEnvironment(
        rank=3,
        world_size=4,
        local_rank=1,
        master_addr="head-node",
        master_port=launchers.DEFAULT_MASTER_PORT,
        local_world_size=2,
        launcher="openmpi",
    )


def test_openmpi_on_one_machine_needs_no_master_address() -> None:
    one_machine = openmpi(OMPI_COMM_WORLD_LOCAL_SIZE="4", MASTER_ADDR="", MASTER_PORT="4100")
    environment = adist.read_launch_environment(one_machine)
    assert environment is not None
    assert (environment.master_addr, environment.master_port) == ("127.0.0.1", 4100)


def test_openmpi_across_machines_needs_a_master_address() -> None:
    with pytest.raises(adist.DistributedSetupError, match=r"-x MASTER_ADDR=HOST") as e:
        adist.read_launch_environment(openmpi(MASTER_ADDR=""))
    assert e.value.missing == ("MASTER_ADDR",)


def test_half_set_openmpi_environment_names_what_is_missing() -> None:
    with pytest.raises(adist.DistributedSetupError, match="Open MPI environment is half set") as e:
        adist.read_launch_environment(openmpi(OMPI_COMM_WORLD_SIZE=""))
    assert e.value.missing == ("OMPI_COMM_WORLD_SIZE",)
    assert "mpirun" in str(e.value)


def test_openmpi_local_rank_beyond_local_size_is_an_error() -> None:
    with pytest.raises(adist.DistributedSetupError, match="OMPI_COMM_WORLD_LOCAL_RANK=2 is not"):
        adist.read_launch_environment(openmpi(OMPI_COMM_WORLD_LOCAL_RANK="2"))


# -- two processes under a faked launcher ------------------------------------------------


def launcher_variables(launcher: str, rank: int, port: int) -> dict[str, str]:
    if launcher == "slurm":
        return {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_NODELIST": "localhost",
            "MASTER_PORT": str(port),
        }
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_PORT": str(port),
    }


@pytest.mark.parametrize("launcher", ["slurm", "openmpi"])
def test_two_ranks_under_a_faked_launcher_train_in_step(launcher: str, tmp_path: Path) -> None:
    # What srun / mpirun do: start the script once per rank, each with its variables.
    port = free_port()
    envs = [worker_env(**launcher_variables(launcher, rank, port)) for rank in (0, 1)]
    results = run_workers([str(SCRIPTS / "train_tied.py"), "cpu", str(tmp_path), "3"], envs)
    for result in results:
        assert result.returncode == 0, result.stdout[-4000:]
    reports = read_reports(tmp_path, 2)
    for rank, report in enumerate(reports):
        assert (report["rank"], report["local_rank"], report["world_size"]) == (rank, rank, 2)
        assert (report["launcher"], report["launched"], report["backend"]) == (
            launcher,
            True,
            "gloo",
        )
        assert report["tied"] and report["unique_after"] == report["ddp_unique"] == 3
        assert report["ranks_equal"] and report["trained"]
        assert report["plain_ranks_equal"] is False  # the control drifted apart
    assert reports[1]["start_differed"]


def test_a_faked_launcher_missing_a_variable_fails_clearly(tmp_path: Path) -> None:
    env = launcher_variables("slurm", 0, free_port())
    del env["SLURM_LOCALID"]
    [result] = run_workers(
        [str(SCRIPTS / "train_tied.py"), "cpu", str(tmp_path)], [worker_env(**env)]
    )
    assert result.returncode != 0
    assert "DistributedSetupError" in result.stdout
    assert "SLURM_LOCALID is not set" in result.stdout
    assert not list(tmp_path.iterdir())


# -- regressions: what the real launchers set (issue 22) ---------------------------------
# The variables below are the ones Open MPI 4.1 and SLURM 22.05 really set; the
# launcher stage (tests/distributed/test_real_launchers.py) runs the programs themselves.


def batch_shell(**overrides: str) -> dict[str, str]:
    """What `sbatch -n2` sets in its batch shell: SLURM_PROCID=0, but no step."""
    env = {
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "3",
        "SLURM_JOB_NODELIST": "localhost",
    }
    env.update(overrides)
    return {name: value for name, value in env.items() if value}


def mpirun_rank(rank: int, job_id: str = "2128936961") -> dict[str, str]:
    """What Open MPI 4.1's `mpirun -np 2` sets for one rank on one machine."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_ess_base_jobid": job_id,
        "OMPI_MCA_orte_hnp_uri": f"{int(job_id) - 1}.0;tcp://192.0.2.2:57029",
    }


def test_mpirun_inside_an_sbatch_job_is_an_open_mpi_job() -> None:
    # Bug 1: SLURM was read first, so both ranks were rank 0 of the batch shell's job.
    environments = [
        adist.read_launch_environment({**batch_shell(), **mpirun_rank(r)}) for r in (0, 1)
    ]
    assert [(e.launcher, e.rank, e.world_size) for e in environments if e] == [
        ("openmpi", 0, 2),
        ("openmpi", 1, 2),
    ]


def test_the_batch_shell_of_several_tasks_is_refused_at_once() -> None:
    # Bug 1: it counted as task 0 and waited for its peers until the rendezvous timed out.
    with pytest.raises(adist.DistributedSetupError) as caught:
        adist.read_launch_environment(batch_shell())
    message = str(caught.value)
    assert "is the batch shell of SLURM job 3, not one of its tasks" in message
    assert "SLURM_PROCID='0' is set but SLURM_STEP_ID is not" in message  # what was found
    assert "SLURM_NTASKS=2" in message and "srun python" in message  # what to do
    assert caught.value.missing == ("SLURM_STEP_ID",)


def test_init_in_a_batch_shell_fails_before_any_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in batch_shell().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(adist.DistributedSetupError, match="batch shell"):
        adist.init_process_group("cpu", timeout=60)
    assert not dist.is_initialized()


@pytest.mark.parametrize("tasks", ["1", ""])
def test_the_batch_shell_of_one_task_runs_alone(tasks: str) -> None:
    assert adist.read_launch_environment(batch_shell(SLURM_NTASKS=tasks)) is None


def test_a_batch_shell_with_unreadable_task_count_is_an_error() -> None:
    with pytest.raises(adist.DistributedSetupError, match="SLURM_NTASKS='two' is not an integer"):
        adist.read_launch_environment(batch_shell(SLURM_NTASKS="two"))


def test_two_steps_of_one_job_get_ports_of_their_own() -> None:
    # Bug 2: the port came from SLURM_JOB_ID alone; concurrent steps got EADDRINUSE.
    ports = {}
    for step in ("0", "1", "2"):
        found = adist.read_launch_environment(slurm(SLURM_STEP_ID=step))
        assert found is not None and 20000 <= found.master_port < 40000
        assert found.master_port_source == (
            f"derived by accel from SLURM_JOB_ID=123456 and SLURM_STEP_ID={step}"
        )
        ports[step] = found.master_port
    assert len(set(ports.values())) == 3
    # Every task of a step computes the same port.
    other_task = adist.read_launch_environment(slurm(SLURM_PROCID="0", SLURM_LOCALID="0"))
    assert other_task is not None and other_task.master_port == ports["0"]


def test_derived_slurm_ports_differ_for_nearby_jobs_and_steps() -> None:
    def port(job: int, step: int) -> int:
        env = slurm(SLURM_JOB_ID=str(job), SLURM_STEP_ID=str(step))
        found = adist.read_launch_environment(env)
        assert found is not None
        return found.master_port

    # Steps 0-99 of jobs less than 200 ids apart: all distinct, as documented.
    ports = {port(job, step) for job in range(5000, 5200) for step in (0, 1, 7, 99)}
    assert len(ports) == 200 * 4


def test_open_mpi_jobs_get_ports_of_their_own() -> None:
    # Bug 3: every mpirun job used 29500, torchrun's default port too.
    first = adist.read_launch_environment(mpirun_rank(0, "2128936961"))
    other_rank = adist.read_launch_environment(mpirun_rank(1, "2128936961"))
    second = adist.read_launch_environment(mpirun_rank(0, "2128216065"))
    assert first is not None and other_rank is not None and second is not None
    assert first.master_port == other_rank.master_port == 20000 + 2128936961 % 19997
    assert second.master_port != first.master_port
    assert launchers.DEFAULT_MASTER_PORT not in {first.master_port, second.master_port}
    assert first.master_port_source == (
        "derived by accel from OMPI_MCA_ess_base_jobid=2128936961 (this mpirun job's id)"
    )


def test_open_mpi_job_ids_spread_over_many_ports() -> None:
    # Job ids differ in their upper 16 bits (the job family): a span of 20000 folded
    # them onto 625 ports; the prime span keeps them apart.
    ports = set()
    for family in range(1000, 3000):
        found = adist.read_launch_environment(mpirun_rank(0, str(family << 16 | 1)))
        assert found is not None
        ports.add(found.master_port)
    assert len(ports) == 2000


def test_open_mpi_5_namespaces_and_master_port_and_no_id() -> None:
    env = {**mpirun_rank(0), "OMPI_MCA_ess_base_jobid": ""}
    env = {name: value for name, value in env.items() if value}
    unnamed = adist.read_launch_environment(env)
    assert unnamed is not None and unnamed.master_port == launchers.DEFAULT_MASTER_PORT
    assert unnamed.master_port_source.startswith(
        "torch's default 29500 (no OMPI_MCA_ess_base_jobid"
    )
    named = adist.read_launch_environment({**env, "PMIX_NAMESPACE": "prterun-node-4242@1"})
    assert named is not None and named.master_port != launchers.DEFAULT_MASTER_PORT
    assert "PMIX_NAMESPACE='prterun-node-4242@1'" in named.master_port_source
    explicit = adist.read_launch_environment({**mpirun_rank(0), "MASTER_PORT": "4100"})
    assert explicit is not None
    assert (explicit.master_port, explicit.master_port_source) == (4100, "MASTER_PORT")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
@pytest.mark.parametrize("explicit", [True, False], ids=["master-port", "derived-port"])
def test_a_port_in_use_says_where_it_came_from(
    explicit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bug 4: torch's bare EADDRINUSE, no word of MASTER_PORT or where the port came from.
    with busy_port() as (port, job_id):
        env = slurm(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", MASTER_ADDR="127.0.0.1")
        if explicit:
            env["MASTER_PORT"] = str(port)
        else:
            env["SLURM_JOB_ID"] = str(job_id)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(dist.DistNetworkError, match="EADDRINUSE") as caught:
            adist.init_process_group("cpu", timeout=20)
    notes = "\n".join(caught.value.__notes__)
    assert f"rendezvous store on 127.0.0.1:{port}: the port is in use" in notes
    source = "MASTER_PORT" if explicit else f"derived by accel from SLURM_JOB_ID={job_id}"
    assert f"Under SLURM (srun) the port came from {source}" in notes
    assert "set MASTER_PORT to a free port for every rank: `export MASTER_PORT=PORT`" in notes
    assert not dist.is_initialized()


@contextlib.contextmanager
def busy_port() -> Iterator[tuple[int, int]]:
    """A listening port in accel's derived range, and a SLURM job id whose step 0 maps to it."""
    for candidate in range(31000, 31100):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", candidate))
        except OSError:
            sock.close()
            continue
        with sock:
            sock.listen()
            job_id = (candidate - 20000) * pow(100, -1, 19997) % 19997
            yield candidate, job_id
            return
    pytest.fail("no free port in 31000-31099")


def test_port_in_use_is_recognised_only_by_its_error() -> None:
    from accel.distributed._process_group import _port_in_use

    assert _port_in_use(RuntimeError("code: -98, name: EADDRINUSE, message: address in use"))
    assert _port_in_use(OSError("[Errno 98] Address already in use"))
    assert not _port_in_use(RuntimeError("Connection refused"))


@pytest.mark.parametrize(
    ("text", "counts"),
    [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,3(x2),2", [1, 3, 3, 2])],
)
def test_slurm_tasks_per_node_lists(text: str, counts: list[int]) -> None:
    assert tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "two", "2(x)", "2(3)", "0", "2(x0)", "2,,1"])
def test_unreadable_slurm_tasks_per_node_is_an_error(text: str) -> None:
    with pytest.raises(adist.DistributedSetupError, match="is not a SLURM list of tasks per node"):
        tasks_per_node(text)


def test_slurm_local_world_size_is_read() -> None:
    # Bug 4: it was always None under SLURM, so the local-rank check never ran there.
    step = adist.read_launch_environment(slurm(SLURM_STEP_TASKS_PER_NODE="2(x4)"))
    assert step is not None and step.local_world_size == 2
    uneven = slurm(SLURM_STEP_TASKS_PER_NODE="2(x3),1", SLURM_NODEID="3", SLURM_LOCALID="0")
    found = adist.read_launch_environment(uneven)
    assert found is not None and found.local_world_size == 1
    # The step's list wins over the job's and over the --ntasks-per-node request.
    both = slurm(SLURM_STEP_TASKS_PER_NODE="2", SLURM_TASKS_PER_NODE="4", SLURM_NTASKS_PER_NODE="4")
    preferred = adist.read_launch_environment(both)
    assert preferred is not None and preferred.local_world_size == 2
    job_only = adist.read_launch_environment(slurm(SLURM_TASKS_PER_NODE="4(x2)"))
    assert job_only is not None and job_only.local_world_size == 4
    request = adist.read_launch_environment(slurm(SLURM_NTASKS_PER_NODE="3"))
    assert request is not None and request.local_world_size == 3
    # Uneven, with no node index to pick this node's count: nothing is checked.
    unknown = adist.read_launch_environment(slurm(SLURM_STEP_TASKS_PER_NODE="2,1"))
    assert unknown is not None and unknown.local_world_size is None


def test_slurm_local_rank_beyond_this_nodes_tasks_is_an_error() -> None:
    env = slurm(SLURM_STEP_TASKS_PER_NODE="2(x3),1", SLURM_NODEID="3", SLURM_LOCALID="1")
    with pytest.raises(
        adist.DistributedSetupError,
        match=r"SLURM_LOCALID=1 is not below SLURM_STEP_TASKS_PER_NODE\[SLURM_NODEID=3\]=1",
    ):
        adist.read_launch_environment(env)


def test_a_malformed_slurm_tasks_per_node_is_an_error() -> None:
    with pytest.raises(adist.DistributedSetupError, match="SLURM_STEP_TASKS_PER_NODE='2\\(x'"):
        adist.read_launch_environment(slurm(SLURM_STEP_TASKS_PER_NODE="2(x"))
