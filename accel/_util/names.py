"""Every rule about names: accelerator names as users write them, plugin and
distribution names as packaging spells them, the environment variables accel reads,
and the "did you mean" suggestion. Nothing else in accel parses a name.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable
from typing import Final

from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = [
    "ACCELERATOR_ENV",
    "AUTO",
    "DISABLE_AUTOLOAD_ENV",
    "EARLY_SIGNALS_ENV",
    "PLUGINS_ENV",
    "VARIABLES",
    "VISIBILITY_VARIABLES",
    "check_accelerator_name",
    "closest_name",
    "describe_difference",
    "describe_index_range",
    "misspelt_variables",
    "name_from_environment",
    "normalize_distribution_name",
    "normalize_name",
    "parse_accelerator_name",
    "visibility_hint",
]

#: Environment variable naming the accelerator ``get_accelerator()`` picks by default.
ACCELERATOR_ENV: Final = "ACCEL_ACCELERATOR"
#: Environment variable that, set to ``1``, skips entry-point plugins.
DISABLE_AUTOLOAD_ENV: Final = "ACCEL_DISABLE_PLUGIN_AUTOLOAD"
#: Environment variable with a comma-separated allow-list of entry-point plugins.
PLUGINS_ENV: Final = "ACCEL_PLUGINS"
#: Environment variable saying where preemption signals are noted before a guard.
EARLY_SIGNALS_ENV: Final = "ACCEL_EARLY_SIGNALS"
#: Every environment variable accel reads (``accel list`` checks the others' names).
VARIABLES: Final = (ACCELERATOR_ENV, DISABLE_AUTOLOAD_ENV, EARLY_SIGNALS_ENV, PLUGINS_ENV)

#: The name that means "the best available accelerator".
AUTO: Final = "auto"

# Names are used in "name:index" strings and on the command line, so keep them
# to something that survives both: lower-case letters, digits, "_" and "-".
_NAME_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_\-]*$")
# Packaging's rule (PEP 503): runs of "-", "_" and "." are one separator, case is ignored.
_DISTRIBUTION_SEPARATORS: Final = re.compile(r"[-_.]+")


def normalize_name(name: str) -> str:
    """The canonical form of an accelerator name: NFKC-normalised, stripped, lower case.

    NFKC folds compatibility forms into the letters they stand for, so a full-width
    ``ｃｐｕ`` (an IME left on) is ``cpu``. Look-alikes from other scripts (a Cyrillic
    ``р`` in ``cрu``) are different letters and stay so: :func:`describe_difference`
    points at them.
    """
    return unicodedata.normalize("NFKC", name).strip().lower()


def normalize_distribution_name(name: str) -> str:
    """A distribution or entry-point name as packaging compares them:
    ``accel_VendorX``, ``accel-vendorx`` and ``accel.vendorx`` are one name."""
    return _DISTRIBUTION_SEPARATORS.sub("-", name.strip()).lower()


def check_accelerator_name(value: object, what: str) -> str:
    """``value`` normalised, if it is a valid accelerator name or alias."""
    if not isinstance(value, str):
        raise AcceleratorTypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    name = normalize_name(value)
    if not _NAME_PATTERN.match(name):
        raise AcceleratorValueError(
            f"{what} {value!r} is not a valid accelerator name: use a letter followed by "
            "letters, digits, '_' or '-' (no ':', which separates the device index)"
        )
    return name


def parse_accelerator_name(name: object) -> tuple[str, int | None]:
    """Split ``"cuda:1"`` into ``("cuda", 1)``; normalise case and whitespace."""
    if not isinstance(name, str):
        raise AcceleratorTypeError(
            f"accelerator must be a name (a str such as 'cpu', 'cuda:1' or 'auto') or an "
            f"accel.Accelerator handle, got {type(name).__name__}: {name!r}"
        )
    text = name.strip().lower()
    if not normalize_name(text):
        raise AcceleratorValueError(
            f"accelerator name is empty ({name!r}): pass a name such as 'cpu', 'cuda' "
            f"or 'auto', or unset ${ACCELERATOR_ENV}"
        )
    base, sep, index_text = text.partition(":")
    # NFKC for the name only: the index stays ASCII digits ('²' is no 2).
    base = normalize_name(base)
    if not sep:
        return base, None
    if not base:
        # ':0' is malformed, not a name nobody registered: say what the form is.
        raise AcceleratorValueError(
            f"accelerator name {name!r} has a device index but no name before the ':': "
            f"expected 'NAME:INDEX', like 'cuda:1', or a name alone, like 'cpu'"
        )
    index_text = index_text.strip()
    # isascii(): str.isdigit() also accepts digits such as '²' that int() refuses.
    if not (index_text.isascii() and index_text.isdigit()):
        raise AcceleratorValueError(
            f"bad device index in accelerator name {name!r}: expected 'NAME:INDEX' with "
            f"a non-negative integer INDEX, like 'cuda:1'"
        )
    return base, int(index_text)


def name_from_environment(name: str | None) -> tuple[str, str]:
    """The name to select and where it came from, for messages.

    ``None`` means ``$ACCEL_ACCELERATOR`` when it is set and not blank, else
    ``"auto"``. The second item is ``""`` or ``" in $ACCEL_ACCELERATOR"``.
    """
    if name is not None:
        return name, ""
    from_env = os.environ.get(ACCELERATOR_ENV)
    if from_env is not None and from_env.strip():
        return from_env, f" in ${ACCELERATOR_ENV}"
    return AUTO, ""


# Cyrillic and Greek letters that look like Latin ones, for the "did you mean" hint:
# 'сpu' (Cyrillic es) was meant to be 'cpu', not 'tpu', though both are one letter off.
_LOOKALIKES: Final = str.maketrans("асеорхуіјѕԁԛԝοαρνκτ", "aceopxyijsdqwoapvkt")


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` was most likely meant to be, if one is close."""
    import difflib  # only when a name is wrong: keeps `accel --help` quick

    names = list(known)
    latin = name.translate(_LOOKALIKES)
    if latin != name and latin in names:
        return latin
    matches = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return matches[0] if matches else None


def describe_difference(name: str, suggestion: str) -> str:
    """Which characters of ``name`` differ from ``suggestion``, where that is not plain
    to see: a non-ASCII look-alike (``'р' (U+0440 CYRILLIC SMALL LETTER ER)``)."""
    import difflib

    shown: list[str] = []
    matcher = difflib.SequenceMatcher(a=name, b=suggestion, autojunk=False)
    for tag, start, end, other_start, other_end in matcher.get_opcodes():
        if tag == "equal":
            continue
        for offset, char in enumerate(name[start:end]):
            if char.isascii():
                continue
            theirs = suggestion[other_start + offset] if other_start + offset < other_end else ""
            where = f" where {suggestion!r} has {theirs!r}" if theirs else ""
            shown.append(f"{_describe_char(char)} at position {start + offset + 1}{where}")
    if not shown:
        return ""
    return f" {name!r} has {'; '.join(shown)}."


def _describe_char(char: str) -> str:
    return f"{char!r} (U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')})"


def misspelt_variables(environ: Iterable[str]) -> list[tuple[str, str]]:
    """``(name, meant)`` for each variable of ``environ`` that looks like a misspelling
    of one accel reads (``ACCEL_PLUGIN``, ``accel_plugins``), sorted by name."""
    import difflib

    found = []
    for name in sorted(environ):
        if name in VARIABLES or not name.upper().startswith("ACCEL_"):
            continue
        # 0.8: one or two letters off; other ACCEL_* variables (a project's own) pass.
        close = difflib.get_close_matches(name.upper(), VARIABLES, n=1, cutoff=0.8)
        if close:
            found.append((name, close[0]))
    return found


def describe_index_range(canonical: str, count: int) -> str:
    if count <= 1:
        return f"{canonical!r} or '{canonical}:0'"
    return f"'{canonical}:0' to '{canonical}:{count - 1}'"


#: The variables a launcher uses to give each worker its own devices, by device type.
VISIBILITY_VARIABLES: Final = {
    "cuda": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
}


def visibility_hint(device_type: str) -> str:
    """The device visibility settings of ``device_type`` for a message, or ``""`` where
    it has none."""
    names = VISIBILITY_VARIABLES.get(device_type)
    return f"device visibility settings such as {names[0]}" if names else ""
