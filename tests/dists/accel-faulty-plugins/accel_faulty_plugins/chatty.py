"""Prints to stdout at import and while probed, from Python and from the file descriptor."""

import os

import accel

print("chatty plugin: hello from import")
os.write(1, b"chatty plugin: straight to fd 1\n")


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [accel.AcceleratorSpec("chatty", description="prints a lot")]


@accel.hookimpl
def is_available() -> accel.Availability:
    print("chatty plugin: probed")
    return accel.Availability(False, reason="it only talks")
