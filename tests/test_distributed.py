"""accel.distributed: the torchrun environment, the process group, DDP with ties.

Multi-process tests run `torchrun` in a subprocess on loopback (127.0.0.1, a port
the OS just handed out), bounded by a timeout after which the whole process group
of the launcher is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fakes import FakeAccelerator
from models import TiedLM

import accel
import accel.distributed as adist

SCRIPTS = Path(__file__).parent / "distributed_scripts"
TORCHRUN_TIMEOUT_S = 180
ALL_VARIABLES = (*adist.TORCHRUN_VARIABLES, "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def _no_launcher_and_no_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts outside torchrun with no group, and leaves none behind."""
    for name in ALL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    adist.destroy_process_group()
    yield
    adist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ALL_VARIABLES and not k.startswith("ACCEL_")
    }
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only, whatever the hostname resolves to
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_torchrun(
    args: list[str], *, nproc: int = 2, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `torchrun --nproc-per-node nproc ARGS` on loopback; kill it all on timeout.

    A port picked free can be taken before torchrun binds it, so a launch that
    failed on "address already in use" is retried once on a new port.
    """
    for _attempt in range(2):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            *args,
        ]
        process = subprocess.Popen(
            command,
            env=env or torchrun_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # one process group: the launcher and its workers
        )
        try:
            output, _ = process.communicate(timeout=TORCHRUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"torchrun did not finish in {TORCHRUN_TIMEOUT_S} s:\n{output[-4000:]}")
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if process.returncode == 0 or "address already in use" not in output.lower():
            break
    return subprocess.CompletedProcess(command, process.returncode, output, "")


def read_reports(report_dir: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((report_dir / f"rank{rank}.json").read_text()) for rank in range(world_size)]


def full_environment(**overrides: str) -> dict[str, str]:
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    env.update(overrides)
    return env


# -- the torchrun environment ------------------------------------------------------


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
    [("RANK",), ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"), ("RANK", "WORLD_SIZE", "MASTER_ADDR")],
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


# -- choosing this worker's device ---------------------------------------------------


@pytest.fixture
def two_device_registry() -> accel.AcceleratorRegistry:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(FakeAccelerator("twin", count=2))
    return registry


def worker(local_rank: int, world_size: int = 4) -> adist.TorchrunEnvironment:
    return adist.TorchrunEnvironment(
        rank=local_rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr="127.0.0.1",
        master_port=29500,
    )


def test_each_local_rank_gets_its_own_device(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    chosen = [
        adist.local_accelerator("twin", worker(rank), registry=two_device_registry).index
        for rank in (0, 1)
    ]
    assert chosen == [0, 1]


def test_single_process_keeps_an_explicit_index(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    assert adist.local_accelerator("twin:1", None, registry=two_device_registry).index == 1
    assert adist.local_accelerator("twin", None, registry=two_device_registry).index is None


def test_an_explicit_index_that_is_not_the_local_rank_is_an_error(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(
        adist.DistributedSetupError, match=r"twin:1.*LOCAL_RANK=0.*without an index"
    ):
        adist.local_accelerator("twin:1", worker(0), registry=two_device_registry)


def test_more_workers_than_devices_is_an_error(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(accel.AcceleratorUnavailableError, match="device index 2") as caught:
        adist.local_accelerator("twin", worker(2), registry=two_device_registry)
    assert any("--nproc-per-node" in note for note in getattr(caught.value, "__notes__", []))


def test_cpu_workers_share_the_one_cpu(registry: accel.AcceleratorRegistry) -> None:
    acc = adist.local_accelerator("cpu", worker(1), registry=registry)
    assert (acc.name, acc.index, acc.device) == ("cpu", None, torch.device("cpu"))


class SingleGpu(FakeAccelerator):
    """One device and the nccl backend: NCCL cannot put two ranks on one GPU."""

    @accel.hookimpl
    def distributed_backend(self) -> str:
        return "nccl"


def test_nccl_workers_never_share_a_device() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(SingleGpu("onegpu", count=1))
    assert adist.local_accelerator("onegpu", worker(0), registry=registry).index == 0
    with pytest.raises(accel.AcceleratorUnavailableError, match="device index 1"):
        adist.local_accelerator("onegpu", worker(1), registry=registry)


def test_accelerator_argument_is_type_checked() -> None:
    with pytest.raises(TypeError, match=r"accel\.Accelerator, a name"):
        adist.local_accelerator(3, None)  # type: ignore[arg-type]


# -- the process group in this process -------------------------------------------------


def test_single_process_group_without_torchrun() -> None:
    context = adist.init_process_group("cpu", timeout=30)
    assert (context.rank, context.world_size, context.local_rank) == (0, 1, 0)
    assert (context.backend, context.device, context.launched) == (
        "gloo",
        torch.device("cpu"),
        False,
    )
    assert context.is_main and context.accelerator.name == "cpu"
    assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 1
    assert adist.init_process_group("cpu") is context  # idempotent
    assert adist.current_context() is context
    assert adist.destroy_process_group() is True
    assert not dist.is_initialized() and adist.current_context() is None
    assert adist.destroy_process_group() is False  # nothing left to tear down


def test_world_of_one_from_a_full_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in full_environment(MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(name, value)
    context = adist.init_process_group(accel.get_accelerator("cpu"))
    assert context.launched and (context.rank, context.world_size) == (0, 1)
    assert dist.get_backend() == "gloo"


def test_process_group_block_tears_down() -> None:
    with adist.process_group("cpu") as context:
        assert dist.is_initialized() and adist.current_context() is context
    assert not dist.is_initialized() and adist.current_context() is None


def test_a_group_with_another_backend_must_be_torn_down_first() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(SingleGpu("onegpu", count=1))
    adist.init_process_group("cpu")
    with pytest.raises(adist.DistributedSetupError, match=r"backend 'gloo'.*needs 'nccl'"):
        adist.init_process_group("onegpu", registry=registry)
    assert dist.get_backend() == "gloo"  # the running group is left alone


def test_another_accelerator_on_the_same_backend_must_tear_down_first() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(FakeAccelerator("other", device="meta"))  # gloo by default
    adist.init_process_group("cpu")
    with pytest.raises(adist.DistributedSetupError, match="already set up for 'cpu'"):
        adist.init_process_group("other", registry=registry)


def test_a_group_started_elsewhere_is_adopted() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    context = adist.init_process_group("cpu")
    assert (context.backend, context.world_size) == ("gloo", 1)
    assert adist.init_process_group("cpu") is context
    assert adist.destroy_process_group() is True and not dist.is_initialized()


@pytest.mark.parametrize("timeout", [0, -5, "60", True])
def test_bad_timeout_is_rejected_before_starting(timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        adist.init_process_group("cpu", timeout=timeout)
    assert not dist.is_initialized()


# -- data parallel in this process ----------------------------------------------------------


def test_wrapped_model_trains_with_ties_intact() -> None:
    context = adist.init_process_group("cpu")
    model = context.accelerator.model_to_device(TiedLM())
    wrapped = adist.wrap_data_parallel(model, context)
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
    assert wrapped.module is model
    before = model.embed.weight.detach().clone()
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    wrapped(torch.tensor([[1, 2, 3]])).logsumexp(-1).mean().backward()
    optimizer.step()
    assert model.head.weight is model.embed.weight
    assert not torch.equal(before, model.embed.weight)
    assert len(list(wrapped.parameters())) == 3  # the tied weight counted once


def test_wrap_uses_the_current_context_by_default() -> None:
    adist.init_process_group("cpu")
    assert isinstance(adist.wrap_data_parallel(TiedLM()), torch.nn.parallel.DistributedDataParallel)


def test_wrap_needs_a_running_group() -> None:
    with pytest.raises(
        adist.DistributedSetupError, match=r"call accel\.distributed\.init_process_group"
    ):
        adist.wrap_data_parallel(TiedLM())


def test_wrap_refuses_a_stale_context() -> None:
    stale = adist.init_process_group("cpu")
    adist.destroy_process_group()
    adist.init_process_group("cpu")
    with pytest.raises(adist.DistributedSetupError, match="torn down"):
        adist.wrap_data_parallel(TiedLM(), stale)


def test_wrap_refuses_a_model_on_another_device() -> None:
    context = adist.init_process_group("cpu")
    with pytest.raises(ValueError, match=r"'embed.weight' is on meta.*model_to_device"):
        adist.wrap_data_parallel(TiedLM().to("meta"), context)


def test_wrap_refuses_what_is_not_a_module() -> None:
    adist.init_process_group("cpu")
    with pytest.raises(TypeError, match=r"torch\.nn\.Module, got Tensor"):
        adist.wrap_data_parallel(torch.zeros(2))  # type: ignore[arg-type]


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, accel.distributed; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


# -- several processes under torchrun ---------------------------------------------------------


def test_torchrun_two_cpu_ranks_train_tied_model_in_step(tmp_path: Path) -> None:
    result = run_torchrun([str(SCRIPTS / "train_tied.py"), "cpu", str(tmp_path), "3"])
    assert result.returncode == 0, result.stdout[-4000:]
    reports = read_reports(tmp_path, 2)
    for rank, report in enumerate(reports):
        assert report["rank"] == rank and report["local_rank"] == rank
        assert (report["world_size"], report["backend"], report["device"]) == (2, "gloo", "cpu")
        assert report["launched"] and report["idempotent"]
        # Ties hold on every rank, and DDP saw the tied weight once.
        assert report["tied"]
        assert report["unique_before"] == report["unique_after"] == report["ddp_unique"] == 3
        # all_gather of every rank's parameters: identical, and training moved them.
        assert report["gathered"] == 2 and report["own_slot_is_mine"]
        assert report["ranks_equal"] and report["trained"]
        # The control without DDP drifted apart: equality above is DDP's doing.
        assert report["plain_ranks_equal"] is False
        assert report["destroyed"]
    assert reports[1]["start_differed"]  # rank 1 began elsewhere; DDP's broadcast fixed it


def test_torchrun_worker_with_half_set_environment_fails_clearly(tmp_path: Path) -> None:
    env = torchrun_env(RANK="0", WORLD_SIZE="1")
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "train_tied.py"), "cpu", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "DistributedSetupError" in result.stderr
    assert "LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set" in result.stderr
    assert not list(tmp_path.iterdir())


# -- XLA (the XLA tier: torch_xla on XLA:CPU) ------------------------------------------------


@pytest.mark.xla
def test_xla_single_process_group_trains_tied_model() -> None:
    import torch_xla

    context = adist.init_process_group("tpu")
    assert (context.backend, context.rank, context.world_size) == ("xla", 0, 1)
    assert context.device.type == "xla" and dist.get_backend() == "xla"
    model = context.accelerator.model_to_device(TiedLM())
    wrapped = adist.wrap_data_parallel(model, context)
    assert wrapped.module is model and wrapped.gradient_as_bucket_view
    before = model.embed.weight.detach().cpu().clone()
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    for _ in range(2):
        tokens = context.accelerator.batch_to_device(torch.tensor([[1, 2, 3]]))
        optimizer.zero_grad()
        wrapped(tokens).logsumexp(-1).mean().backward()
        optimizer.step()
        torch_xla.sync()
    assert model.head.weight is model.embed.weight
    assert len(list(wrapped.parameters())) == 3
    assert not torch.equal(before, model.embed.weight.detach().cpu())


@pytest.mark.xla
def test_xla_uses_torch_xla_rendezvous_when_the_runtime_has_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As under torch_xla.launch on a TPU host, which sets no torchrun variables;
    # XLA:CPU cannot run that for real, so only the routing is checked here.
    import torch_xla.runtime as xr

    calls: list[tuple[str, object]] = []
    real_init = dist.init_process_group

    def recording_init(backend: str, **options: Any) -> None:
        calls.append((backend, options.get("init_method")))
        real_init(backend, store=dist.HashStore(), rank=0, world_size=1)

    monkeypatch.setattr(xr, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "init_process_group", recording_init)
    context = adist.init_process_group("tpu")
    assert calls == [("xla", "xla://")]
    assert context.backend == "xla" and not context.launched


@pytest.mark.xla
def test_xla_cpu_under_torchrun_refuses_ranks_that_cannot_sync(tmp_path: Path) -> None:
    # torch_xla's XLA:CPU client makes every process a world of one; without accel's
    # check each rank would train alone, never synchronised (see docs/distributed.md).
    result = run_torchrun(
        [str(SCRIPTS / "train_tied.py"), "tpu", str(tmp_path)],
        env=torchrun_env(PJRT_DEVICE="CPU"),
    )
    assert result.returncode != 0
    for rank in (0, 1):
        assert (
            f"torchrun started rank {rank} of 2 processes, but the XLA runtime sees rank 0 of 1"
        ) in result.stdout
    assert "use the 'cpu' accelerator (gloo)" in result.stdout.lower()
    assert not list(tmp_path.iterdir())
