"""Reading the launch environment: torchrun, SLURM's srun, Open MPI's mpirun.

The last tests run the 2-process training worker as two plain subprocesses with
the variables srun and mpirun would set, on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from distributed_helpers import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    free_port,
    full_environment,
    no_launcher_and_no_group,
    read_reports,
    run_workers,
    worker_env,
)

import accel
import accel.distributed as adist


def test_no_variables_means_a_single_process() -> None:
    assert adist.read_torchrun_environment({"PATH": "/bin"}) is None
    assert adist.read_torchrun_environment({"RANK": "  "}) is None  # blank counts as unset


def test_full_environment_is_parsed() -> None:
    environment = adist.read_torchrun_environment(
        full_environment(
            RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_PORT="1234", LOCAL_WORLD_SIZE="2"
        )
    )
    assert environment == adist.TorchrunEnvironment(
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
        adist.read_torchrun_environment(env)
    missing = tuple(name for name in adist.TORCHRUN_VARIABLES if name not in present)
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
        adist.read_torchrun_environment(env)


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
        master_port=adist.DEFAULT_MASTER_PORT,
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
