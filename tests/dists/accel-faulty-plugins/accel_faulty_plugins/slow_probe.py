"""A probe that blocks until the test releases it (at most 60 s)."""

import threading

import accel

#: Set while a probe is running; the test sets ``release`` to let it finish.
probing = threading.Event()
release = threading.Event()


class SlowProbe:
    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("slow", description="a probe that takes its time")]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        probing.set()
        release.wait(timeout=60)
        return accel.Availability(False, reason="still thinking")
