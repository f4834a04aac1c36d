"""Promises of the training step: optimizer_step (with and without a closure),
clip_grad_norm_, accumulation and no_sync, the grad scaler and its options, autocast and
the dtype it was asked for, and compile."""

from __future__ import annotations

import torch

from accel.errors import AcceleratorValueError
from accel.testing.conformance._catalog import Subject, promise
from accel.testing.conformance._models import (
    assert_close,
    cpu_copy,
    cpu_reference_step,
    reference_inputs,
    reference_layer,
    sgd_for,
    squared_error,
)

__all__ = ["PROMISES"]


@promise(
    "step.optimizer_step",
    "optimizer_step steps the optimizer: SGD moves each parameter by -lr * grad",
)
def optimizer_step(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    before = cpu_copy(model)
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)  # no forward pass: any device can
    acc.optimizer_step(optimizer)
    assert_close(cpu_copy(model), {k: v - 0.5 for k, v in before.items()}, "after one step")


@promise(
    "step.optimizer_step_closure",
    "optimizer_step(optimizer, closure) steps with the closure and returns the loss it returned",
)
def optimizer_step_closure(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    before = cpu_copy(model)
    calls: list[int] = []

    def closure() -> torch.Tensor:
        calls.append(1)
        for parameter in model.parameters():
            parameter.grad = torch.ones_like(parameter)  # no forward pass: any device can
        return torch.tensor(5.0)

    result = acc.optimizer_step(optimizer, closure)
    assert calls, "optimizer_step(optimizer, closure) never called the closure"
    returned = float(result) if isinstance(result, torch.Tensor) else result
    assert returned == 5.0, (
        f"optimizer_step(optimizer, closure) returned {result!r}, not the closure's loss 5.0"
    )
    assert_close(cpu_copy(model), {k: v - 0.5 for k, v in before.items()}, "after one step")


@promise(
    "step.clip_grad_norm_",
    "clip_grad_norm_ returns the total norm and scales the gradients as torch does",
    needs=("reductions",),
)
def clip_grad_norm(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(reference_layer())
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 3.0)
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=1.0)
    assert isinstance(norm, torch.Tensor), f"clip_grad_norm_ returned {type(norm).__name__}"
    count = sum(p.numel() for p in model.parameters())
    expected = 3.0 * count**0.5
    assert abs(float(norm.to("cpu")) - expected) < 1e-3, f"norm {float(norm)}, not {expected}"
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None
        got = parameter.grad.to("cpu")
        assert torch.allclose(got, torch.full_like(got, 3.0 / expected), atol=1e-5), (
            f"{name}.grad is {got.tolist()} after clipping to norm 1"
        )


@promise(
    "step.accumulation_and_no_sync",
    "gradients of two micro-batches under no_sync add up to the whole batch's, and the "
    "step equals one step on the CPU",
    needs=("forward",),
)
def accumulation_and_no_sync(subject: Subject) -> None:
    acc = subject.accelerator
    inputs, targets = reference_inputs()
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    halves = list(zip(inputs.chunk(2), targets.chunk(2), strict=True))
    for index, (x, y) in enumerate(halves):
        with acc.no_sync(model, enabled=index < len(halves) - 1):
            x, y = acc.batch_to_device((x, y))
            squared_error(model(x), y).backward()  # type: ignore[no-untyped-call]
    acc.optimizer_step(optimizer)
    assert_close(cpu_copy(model), cpu_reference_step(inputs, targets), "accumulated step")


@promise(
    "step.grad_scaler",
    "grad_scaler gives a scaler exactly for float16 (None for bfloat16 and float32), and "
    "a scaled step equals the unscaled one",
    needs=("forward",),
)
def grad_scaler(subject: Subject) -> None:
    acc = subject.accelerator
    assert acc.grad_scaler(torch.float32) is None, "a float32 run was given a grad scaler"
    try:
        scaler = acc.grad_scaler(torch.float16, init_scale=1024.0)
    except AcceleratorValueError:
        return  # no float16 on this device: nothing to scale, as the error says
    assert isinstance(scaler, torch.amp.GradScaler), f"float16 gave {type(scaler).__name__}"
    inputs, targets = reference_inputs()
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    x, y = acc.batch_to_device((inputs, targets))
    loss = squared_error(model(x), y)
    scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
    acc.optimizer_step(optimizer, scaler=scaler)
    assert_close(cpu_copy(model), cpu_reference_step(inputs, targets), "scaled step")


@promise(
    "step.grad_scaler_options",
    "grad_scaler(float16, **options) builds the scaler with the options passed "
    "(init_scale, growth_interval)",
    needs=("autocast",),
)
def grad_scaler_options(subject: Subject) -> None:
    try:
        scaler = subject.accelerator.grad_scaler(
            torch.float16, init_scale=1024.0, growth_interval=7
        )
    except ValueError:  # the autocast hook's refusal, as the hook must refuse
        return  # no float16 on this device: nothing to scale, as the error says
    assert scaler is not None, "float16 was given no grad scaler"
    scale, interval = scaler.get_scale(), scaler.get_growth_interval()
    assert (scale, interval) == (1024.0, 7), (
        f"grad_scaler(float16, init_scale=1024.0, growth_interval=7) gave a scaler with "
        f"scale {scale} and growth interval {interval}: the options were not passed on"
    )


@promise(
    "step.autocast",
    "autocast runs its block in a lower precision than float32, and enabled=False in full "
    "precision",
    needs=("forward", "autocast"),
)
def autocast(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(reference_layer())
    (x,) = acc.batch_to_device((reference_inputs()[0],))
    with acc.autocast():
        fast = model(x)
        with acc.autocast(enabled=False):
            full = model(x)
    assert fast.dtype in (torch.bfloat16, torch.float16), f"autocast computed in {fast.dtype}"
    assert full.dtype == torch.float32, f"autocast(enabled=False) computed in {full.dtype}"
    assert model(x).dtype == torch.float32, "autocast leaked out of its block"


@promise(
    "step.autocast_dtype",
    "autocast(dtype=...) computes in the dtype asked for (float16, bfloat16), or refuses "
    "it with a ValueError; dtype=float32 is full precision",
    needs=("forward", "autocast"),
)
def autocast_dtype(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(reference_layer())
    (x,) = acc.batch_to_device((reference_inputs()[0],))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        try:
            context = acc.autocast(dtype=dtype)
        except ValueError:
            continue  # the device cannot autocast to it, and says so as the hook must
        with context:
            got = model(x).dtype
        assert got == dtype, f"autocast(dtype={dtype}) computed in {got}"


@promise(
    "step.compile",
    "compile with the accelerator's backend computes what the model does, shares its "
    "parameters, and state_dict of it has the model's keys",
    needs=("forward", "compile"),
)
def compile_model(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(reference_layer())
    compiled = acc.compile(model)
    (x,) = acc.batch_to_device((reference_inputs()[0],))
    expected = model(x).detach().to("cpu")
    got = compiled(x).detach().to("cpu")
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), "compiled output differs"
    assert {id(p) for p in compiled.parameters()} == {id(p) for p in model.parameters()}, (
        "the compiled model does not share the model's parameters"
    )
    keys = sorted(acc.state_dict(compiled))
    assert keys == sorted(model.state_dict()), f"state_dict of the compiled model: {keys}"


PROMISES = (
    optimizer_step,
    optimizer_step_closure,
    clip_grad_norm,
    accumulation_and_no_sync,
    grad_scaler,
    grad_scaler_options,
    autocast,
    autocast_dtype,
    compile_model,
)
