"""Registries isolated from whatever is pip-installed in the test environment.

A test that builds ``accel.AcceleratorRegistry()`` sees every installed plugin (the
example plugin, and anything a developer has in their environment), so its result
would depend on the machine. ``isolated_registry`` reads no entry points: a test
sees exactly the built-ins (unless ``builtins=False``) and the plugins it names.
"""

from __future__ import annotations

import accel


def isolated_registry(*plugins: object, builtins: bool = True) -> accel.AcceleratorRegistry:
    """A registry without entry points: the built-ins, then ``plugins`` in order.

    They are registered one by one as given, since the order decides which hooks
    pluggy calls first and which of two equal priorities wins `auto`. A plugin that
    needs ``name=`` or ``override=True`` is registered by the caller.
    """
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=builtins)
    for plugin in plugins:
        registry.register(plugin)
    return registry
