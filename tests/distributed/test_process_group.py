"""accel.distributed: the process group and DDP with ties, in this process and
under torchrun on loopback (see distributed_helpers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import accel
import accel.distributed as adist
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    SingleGpu,
    free_port,
    full_environment,
    no_launcher_and_no_group,
    read_reports,
    run_torchrun,
    torchrun_env,
    worker_overrides,
)
from helpers.fakes import FakeAccelerator
from helpers.models import TiedLM
from helpers.processes import run_python
from helpers.registries import isolated_registry

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
    registry = isolated_registry(SingleGpu("onegpu", count=1))
    adist.init_process_group("cpu")
    with pytest.raises(adist.DistributedSetupError, match=r"backend 'gloo'.*needs 'nccl'"):
        adist.init_process_group("onegpu", registry=registry)
    assert dist.get_backend() == "gloo"  # the running group is left alone


def test_another_accelerator_on_the_same_backend_must_tear_down_first() -> None:
    registry = isolated_registry(FakeAccelerator("other", device="meta"))  # gloo by default
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
    with pytest.raises(ValueError, match=r"'embed.weight' is on meta.*accelerator.materialize"):
        adist.wrap_data_parallel(TiedLM().to("meta"), context)


def test_wrap_refuses_what_is_not_a_module() -> None:
    adist.init_process_group("cpu")
    with pytest.raises(TypeError, match=r"torch\.nn\.Module, got Tensor"):
        adist.wrap_data_parallel(torch.zeros(2))  # type: ignore[arg-type]


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, accel.distributed; print('torch' in sys.modules)"
    result = run_python(code, timeout=60, check=True)
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
    result = run_python(
        [SCRIPTS / "train_tied.py", "cpu", str(tmp_path)],
        env=worker_overrides(RANK="0", WORLD_SIZE="1"),
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
    # The first rank to refuse makes torchrun stop the other, which may not get as far
    # as its own check: at least one says why, and no rank trained alone.
    refusals = [
        rank
        for rank in (0, 1)
        if f"torchrun started rank {rank} of 2 processes, but the XLA runtime sees rank 0 of 1"
        in result.stdout
    ]
    assert refusals, result.stdout[-4000:]
    assert "accel.distributed.DistributedSetupError: " in result.stdout  # the public name
    assert list(tmp_path.glob("rank*.json")) == []
    assert "use the 'cpu' accelerator (gloo)" in result.stdout.lower()
    assert not list(tmp_path.iterdir())
