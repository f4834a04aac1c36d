"""Accelerator names as users write them, and the environment variables accel reads."""

from __future__ import annotations

from typing import Final

from accel.types import normalize_name

__all__ = [
    "ACCELERATOR_ENV",
    "AUTO",
    "DISABLE_AUTOLOAD_ENV",
    "PLUGINS_ENV",
    "describe_index_range",
    "parse_accelerator_name",
]

#: Environment variable naming the accelerator ``get_accelerator()`` picks by default.
ACCELERATOR_ENV: Final = "ACCEL_ACCELERATOR"
#: Environment variable that, set to ``1``, skips entry-point plugins.
DISABLE_AUTOLOAD_ENV: Final = "ACCEL_DISABLE_PLUGIN_AUTOLOAD"
#: Environment variable with a comma-separated allow-list of entry-point plugins.
PLUGINS_ENV: Final = "ACCEL_PLUGINS"

#: The name that means "the best available accelerator".
AUTO: Final = "auto"


def parse_accelerator_name(name: object) -> tuple[str, int | None]:
    """Split ``"cuda:1"`` into ``("cuda", 1)``; normalise case and whitespace."""
    if not isinstance(name, str):
        raise TypeError(
            f"accelerator name must be a str such as 'cpu', 'cuda:1' or 'auto', "
            f"got {type(name).__name__}: {name!r}"
        )
    text = normalize_name(name)
    if not text:
        raise ValueError(
            f"accelerator name is empty ({name!r}): pass a name such as 'cpu', 'cuda' "
            f"or 'auto', or unset ${ACCELERATOR_ENV}"
        )
    base, sep, index_text = text.partition(":")
    base = base.strip()
    if not sep:
        return base, None
    index_text = index_text.strip()
    # isascii(): str.isdigit() also accepts digits such as '²' that int() refuses.
    if not (index_text.isascii() and index_text.isdigit()):
        raise ValueError(
            f"bad device index in accelerator name {name!r}: expected 'NAME:INDEX' with "
            f"a non-negative integer INDEX, like 'cuda:1'"
        )
    return base, int(index_text)


def describe_index_range(canonical: str, count: int) -> str:
    if count <= 1:
        return f"{canonical!r} or '{canonical}:0'"
    return f"'{canonical}:0' to '{canonical}:{count - 1}'"
