"""Preemption signals before the guard: from a run's first call into accel (selecting
its accelerator, starting its process group) a SIGTERM or SIGUSR1 is noted, and the
guard entered later sees it at its first step, instead of the process dying of it.
Nothing happens at ``import accel``, a handler someone else set is left alone, and
``$ACCEL_EARLY_SIGNALS`` says where it applies (unset: under SLURM only).

Each case runs in a fresh interpreter: the handlers are the process's, and a signal
with its default action ends the process, which the test then sees as its status.
"""

from __future__ import annotations

import signal

import pytest

from helpers.processes import run_python

#: Not under SLURM unless a case says so (a developer's shell may be a SLURM job).
OUTSIDE_SLURM: dict[str, str | None] = {"SLURM_JOB_ID": None}

#: A start-up that selects the accelerator, gets a signal before its loop, then trains
#: under the guard; it prints the step at which the guard asked it to stop.
START_UP_THEN_LOOP = """
    import signal, sys
    import torch
    import accel

    acc = accel.get_accelerator("cpu")
    signal.raise_signal(signal.{signal})   # during start-up: after selection, before the loop
    model = acc.model_to_device(torch.nn.Linear(4, 1))   # the rest of the start-up
    with acc.preemption_guard() as guard:
        print("noted at entry:", guard.received and signal.Signals(guard.received).name)
        for step in range(1, 6):
            model(torch.randn(2, 4)).sum().backward()
            if guard.requested:
                print("saved and left at step", step)
                break
    print("handler after the guard:", signal.getsignal(signal.{signal}).__name__)
"""


@pytest.mark.parametrize(
    ("name", "env"),
    [
        ("SIGUSR1", {"SLURM_JOB_ID": "4242"}),
        ("SIGTERM", {**OUTSIDE_SLURM, "ACCEL_EARLY_SIGNALS": "1"}),
    ],
    ids=["sigusr1-under-slurm", "sigterm-opted-in"],
)
def test_a_signal_after_selection_is_seen_by_the_guard_at_its_first_step(
    name: str, env: dict[str, str | None]
) -> None:
    done = run_python(START_UP_THEN_LOOP.format(signal=name), env=env)
    # Before: the signal's default action ended the process (status -10 or -15).
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert lines[0] == f"noted at entry: {name}"
    assert lines[1] == "saved and left at step 1"
    # The guard puts the early handler back: the rest of the run is covered too.
    assert lines[2] == "handler after the guard: _note"


def test_a_signal_after_the_process_group_started_is_seen_at_the_first_step() -> None:
    code = """
        import os, signal
        import accel.distributed

        context = accel.distributed.init_process_group("cpu")   # the run's first call
        os.kill(os.getpid(), signal.SIGTERM)
        with context.accelerator.preemption_guard() as guard:
            print("first read:", guard.requested, signal.Signals(guard.received).name)
        accel.distributed.destroy_process_group()
    """
    done = run_python(code, env={**OUTSIDE_SLURM, "ACCEL_EARLY_SIGNALS": "1"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    # torch 2.9's gloo prints its own line on stdout: read only the script's.
    reads = [line for line in done.stdout.splitlines() if line.startswith("first read:")]
    assert reads == ["first read: True SIGTERM"], done.stdout


def test_import_accel_alone_installs_nothing() -> None:
    code = """
        import signal
        import accel, accel.distributed, accel.training.checkpoint
        print(all(signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGUSR1)))
    """
    done = run_python(code, env={"SLURM_JOB_ID": "4242", "ACCEL_EARLY_SIGNALS": "1"}, check=True)
    assert done.stdout.strip() == "True"


def test_an_embedding_librarys_handlers_are_left_alone() -> None:
    code = """
        import signal
        import accel

        seen = []
        def librarys_own(number, frame):
            seen.append(number)
        signal.signal(signal.SIGUSR1, librarys_own)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        acc = accel.get_accelerator("cpu")
        print(signal.getsignal(signal.SIGUSR1) is librarys_own)
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
        print(signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL)   # not a signal it notes
        signal.raise_signal(signal.SIGUSR1)
        print(seen == [signal.SIGUSR1])
        with acc.preemption_guard() as guard:
            print(guard.received, guard.requested)   # the library had it, not accel
        print(signal.getsignal(signal.SIGUSR1) is librarys_own)   # given back on exit
    """
    done = run_python(code, env={"SLURM_JOB_ID": "4242"}, check=True)
    assert done.stdout.split() == ["True", "True", "True", "True", "None", "False", "True"]


@pytest.mark.parametrize(
    "env",
    [OUTSIDE_SLURM, {"SLURM_JOB_ID": "4242", "ACCEL_EARLY_SIGNALS": "0"}],
    ids=["outside-slurm", "opted-out-under-slurm"],
)
def test_where_it_does_not_apply_a_signal_keeps_its_default_action(
    env: dict[str, str | None],
) -> None:
    code = """
        import signal
        import accel
        accel.get_accelerator("cpu")
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
        signal.raise_signal(signal.SIGTERM)
        print("survived")
    """
    done = run_python(code, env=env)
    assert done.stdout.split() == ["True"]
    assert done.returncode == -signal.SIGTERM


def test_a_first_call_from_another_thread_waits_for_the_main_threads() -> None:
    code = """
        import signal, threading
        import accel

        worker = threading.Thread(target=accel.get_accelerator, args=("cpu",))
        worker.start(); worker.join()
        print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL)   # handlers: main thread only
        acc = accel.get_accelerator("cpu")
        print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL)
    """
    done = run_python(code, env={"SLURM_JOB_ID": "4242"}, check=True)
    assert done.stdout.split() == ["True", "False"]


def test_a_signal_between_two_guards_stops_the_second_loop() -> None:
    code = """
        import signal
        import accel

        acc = accel.get_accelerator("cpu")
        with acc.preemption_guard() as first:
            print(first.requested)
        signal.raise_signal(signal.SIGUSR1)   # between the loops: noted, not fatal
        with acc.preemption_guard() as second:
            print(second.requested, signal.Signals(second.received).name)
        with acc.preemption_guard() as third:   # taken once: the next loop runs on
            print(third.requested)
    """
    done = run_python(code, env={"SLURM_JOB_ID": "4242"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["False", "True", "SIGUSR1", "False"]


def test_a_signal_the_guard_does_not_watch_still_stops_its_loop() -> None:
    # The early handler keeps SIGTERM while a guard watches SIGUSR2 only: noted, it
    # means "stop" to that guard too, where it would have killed the process before.
    code = """
        import signal
        import accel

        acc = accel.get_accelerator("cpu")
        with acc.preemption_guard(signals=(signal.SIGUSR2,)) as guard:
            print(guard.requested)
            signal.raise_signal(signal.SIGTERM)
            print(guard.requested, signal.Signals(guard.received).name)
    """
    done = run_python(code, env={"SLURM_JOB_ID": "4242"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["False", "True", "SIGTERM"]


@pytest.mark.parametrize(
    ("env", "noted"),
    [(OUTSIDE_SLURM, False), ({"SLURM_JOB_ID": "4242"}, True)],
    ids=["outside-slurm", "under-slurm"],
)
def test_an_unrecognised_value_warns_once_and_counts_as_unset(
    env: dict[str, str | None], noted: bool
) -> None:
    # A misspelt switch for signal handling must not keep a run from selecting its
    # accelerator, the CPU included: it warns, naming the variable, value and choices.
    code = """
        import signal, warnings
        import accel
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            print(accel.get_accelerator("cpu").name)
            accel.get_accelerator("cpu")   # said once, not at every selection
        print(len(caught), caught[0].category.__name__)
        print(caught[0].message)
        print("noted:", signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)
    """
    done = run_python(code, env={**env, "ACCEL_EARLY_SIGNALS": "maybe"}, check=True)
    name, count, message, state = done.stdout.strip().splitlines()[-4:]
    assert name == "cpu"
    assert count == "1 PluginWarning"
    assert message.startswith("$ACCEL_EARLY_SIGNALS='maybe' is not a value accel recognises")
    assert "read as unset" in message
    assert "one of '1', 'true', 'yes', 'on'" in message and "'0', 'false', 'no', 'off'" in message
    assert state == f"noted: {noted}"
