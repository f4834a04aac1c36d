"""``accel conformance NAME``: the conformance kit from the command line.

It runs :func:`accel.testing.conformance.run` and prints one row per promise, then a
summary naming each declared skip. Exit status 0 when every promise that applies
holds, 1 when one failed; an unknown or unavailable accelerator is an error (2, from
the CLI's error handling). On the torch-free path: the kit is imported only when the
command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from accel.errors import AcceleratorOSError

__all__ = ["add_conformance_command"]

EXIT_OK = 0
EXIT_FAILED = 1


def add_conformance_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``conformance`` subcommand to ``accel``'s subparsers."""
    conformance = commands.add_parser(
        "conformance",
        parents=[common],
        help="check accel's promises on a plugin's device",
        epilog=(
            "exit status: 0 every promise that applies holds, 1 one failed, 2 error. The "
            "same checks as `python -m pytest --pyargs accel.testing.conformance "
            "--accelerator NAME`, which needs pytest installed in this environment (a "
            "pytest from another one does not know --accelerator); this command does not."
        ),
    )
    conformance.add_argument("name", metavar="NAME", help="the accelerator to check, e.g. npu")
    conformance.add_argument(
        "--limits",
        metavar="MODULE:OBJECT",
        default=None,
        help="the accel.testing.conformance.Limits declaring what the device cannot do",
    )
    conformance.add_argument(
        "--promise",
        action="append",
        metavar="NAME",
        default=None,
        help="check only this promise or area (moves, step, ...); repeatable",
    )
    conformance.add_argument(
        "--json", metavar="PATH", default=None, help="also write the outcomes to PATH as JSON"
    )
    conformance.set_defaults(run=run_conformance_command)


def run_conformance_command(args: argparse.Namespace) -> int:
    """Run the kit as ``args`` asks; print the rows and the summary."""
    from accel.testing.conformance import Limits, run  # imports torch
    from accel.testing.conformance._limits import load_limits

    if "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: a limits module in the current directory
    limits = load_limits(args.limits) if args.limits is not None else Limits()
    outcomes = run(args.name, limits=limits, promises=args.promise)
    widths = [max(len(getattr(o, key)) for o in outcomes) for key in ("outcome", "promise")]
    for o in outcomes:
        print(f"{o.outcome:<{widths[0]}}  {o.promise:<{widths[1]}}  {o.reason}".rstrip())
    failed = sum(o.outcome == "failed" for o in outcomes)
    skipped = [o for o in outcomes if o.outcome == "skipped"]
    passed = len(outcomes) - failed - len(skipped)
    print(f"{passed} passed, {failed} failed, {len(skipped)} skipped")
    for outcome in skipped:
        print(f"  skipped {outcome.promise}: {outcome.reason}")
    if args.json is not None:
        try:
            with open(args.json, "w", encoding="utf-8") as file:
                json.dump([asdict(outcome) for outcome in outcomes], file, indent=2)
                file.write("\n")
        except OSError as exc:
            raise AcceleratorOSError(
                exc.errno, f"cannot write --json {args.json!r}: {exc.strerror}"
            ) from exc
    return EXIT_FAILED if failed else EXIT_OK
