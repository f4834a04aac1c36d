"""The ``accel`` command: see what this machine offers, run the demo, check a model.

Only the subcommand that runs imports torch, so ``accel --help`` stays fast.
Errors print one line and exit with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from accel._util.names import ACCELERATOR_ENV as _ACCELERATOR_ENV
from accel._util.names import EARLY_SIGNALS_ENV
from accel.tools._conformance import add_conformance_command

__all__ = ["main"]

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
#: 128 + SIGPIPE, as a shell reports a command whose reader went away.
EXIT_BROKEN_PIPE = 141


#: What an omitted accelerator name means: what accel.get_accelerator() does.
_DEFAULT_NAME_HELP = f"name (default: ${_ACCELERATOR_ENV}, else auto)"


class CliError(Exception):
    """A user error the CLI reports in one line."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel",
        description="Accelerator plugins for PyTorch: list, inspect, demo, check, conformance.",
        epilog="exit status: 0 ok, 1 ties came apart, 2 error, 130 interrupted",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    # accel.__version__ is a plain string: printing it imports no torch.
    parser.add_argument(
        "--version",
        action="version",
        version=f"accel {_version()}",
        help="print accel's version and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # `--debug` is also accepted after the subcommand (`accel info tpu --debug`);
    # SUPPRESS keeps a subcommand from resetting a `--debug` given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )

    listing = commands.add_parser(
        "list", parents=[common], help="list every accelerator and whether it is usable"
    )
    listing.add_argument("--json", action="store_true", help="print JSON for machines")
    listing.set_defaults(run=_cmd_list)

    info = commands.add_parser(
        "info", parents=[common], help="details of one accelerator, for bug reports"
    )
    info.add_argument("name", metavar="NAME", nargs="?", default=None, help=_DEFAULT_NAME_HELP)
    info.add_argument("--json", action="store_true", help="print JSON for machines")
    info.set_defaults(run=_cmd_info)

    demo = commands.add_parser(
        "demo", parents=[common], help="move a tiny tied language model and train it"
    )
    demo.add_argument("--accelerator", "-a", metavar="NAME", default=None, help=_DEFAULT_NAME_HELP)
    demo.add_argument("--steps", type=_positive_int, default=20, help="training steps (20)")
    demo.set_defaults(run=_cmd_demo)

    check = commands.add_parser(
        "check", parents=[common], help="move a model of yours and check its ties"
    )
    check.add_argument("factory", metavar="MODULE:FACTORY", help="callable that builds the model")
    check.add_argument("--accelerator", "-a", metavar="NAME", default=None, help=_DEFAULT_NAME_HELP)
    check.set_defaults(run=_cmd_check)

    add_conformance_command(commands, common)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _version() -> str:
    import accel

    return accel.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with warnings.catch_warnings():  # restores showwarning when main() returns
            warnings.showwarning = _show_warning
            # torch warns at import when numpy is missing; accel's commands never need it.
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            return run(args)
    except KeyboardInterrupt as exc:
        if args.debug:
            raise
        # Interrupted while a plugin was loading, the message names that plugin.
        detail = f" {_one_line(exc).removeprefix('KeyboardInterrupt: ')}" if str(exc) else ""
        print(f"accel: interrupted{detail}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `accel info | head -1`: the reader left. Say nothing, and keep Python's
        # final flush of stdout from failing again at exit.
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if args.debug:
            raise
        print(f"accel: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _one_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    message = lines[0] if lines else ""
    if isinstance(exc, CliError):
        return message
    name = _public_type_name(type(exc))
    return f"{name}: {message}" if message else name


def _public_type_name(cls: type) -> str:
    """The name of the nearest public class: users can catch that one, never ``_Private``."""
    for klass in cls.__mro__:
        if not klass.__name__.startswith("_"):
            return klass.__name__
    return cls.__name__  # unreachable: object is public


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """Warnings (a plugin that failed to load, say) as one line, without source."""
    name = _public_type_name(category)
    text = str(message).splitlines()[0] if str(message) else name
    print(f"accel: warning: {name}: {text}", file=file or sys.stderr)


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


@contextlib.contextmanager
def _stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """Send what is written to stdout inside to stderr, so that JSON output stays JSON
    when a plugin prints while it loads or probes. Moves file descriptor 1 as well
    where stdout is the process's own, for output from C code and subprocesses."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved: int | None = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if sys.stdout.fileno() == 1 and sys.stderr.fileno() == 2:
            saved = os.dup(1)
            os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            # What a plugin wrote straight to sys.__stdout__ still belongs on stderr.
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.__stdout__.flush()  # type: ignore[union-attr]
            os.dup2(saved, 1)
            os.close(saved)


def _cmd_list(args: argparse.Namespace) -> int:
    import accel
    from accel.tools._variables import warn_about_the_variables

    with _stdout_to_stderr(args.json), warnings.catch_warnings():
        # Said once, below, with the other variables' problems.
        warnings.filterwarnings("ignore", message=rf"\${EARLY_SIGNALS_ENV}=")
        # "auto" first: what it passes over while selecting (a plugin whose get_device
        # fails) is then listed with the reason. This process ends after the listing,
        # so the device auto's pick hands out (XLA's) is no side effect for anyone.
        with contextlib.suppress(accel.AcceleratorError):
            accel.get_accelerator("auto")
        infos = accel.list_accelerators()
        warn_about_the_variables(_one_line)
    if args.json:
        print(json.dumps([asdict(info) for info in infos], indent=2))
        return EXIT_OK
    rows = [["NAME", "ALIASES", "AVAILABLE", "DEVICES", "PRIORITY", "PROVIDER", "NOTES"]]
    # Rows come in "auto" order, so auto's pick is the first it may choose.
    pick = next((info.name for info in infos if info.available and info.auto), None)
    for info in infos:
        note = "chosen by auto" if info.name == pick else info.reason
        if info.available and not info.auto:
            note = "not chosen by auto" + (f" ({info.reason})" if info.reason else "")
        if info.remedy:
            note += f"; to enable: {info.remedy}"
        rows.append(
            [
                info.name,
                ",".join(info.aliases) or "-",
                "yes" if info.available else "no",
                str(info.device_count),
                str(info.priority),
                info.provider,
                note,
            ]
        )
    _print_table(rows)
    print(
        "\nauto picks the available accelerator with the highest priority, ties broken by "
        "name (never by install order)"
        + (f": here {pick!r}." if pick else "; none is available here.")
    )
    return EXIT_OK


def _versions() -> dict[str, str]:
    import accel
    from accel.plugins._xla_versions import installed_version

    # accel's own version is the running code's: the distribution (accel-torch) may be
    # absent, as when running from a source checkout.
    found = {"python": sys.version.split()[0], "accel": accel.__version__}
    for package in ("torch", "torch_xla", "pluggy"):
        found[package] = installed_version(package) or "not installed"
    return found


def _cmd_info(args: argparse.Namespace) -> int:
    with _stdout_to_stderr(args.json):
        report = _info_report(args.name)
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    for key, value in report.items():
        if key == "problems":
            for problem in value:
                print(f"problem: {problem}")
        elif isinstance(value, dict):
            print(f"{key}:")
            for sub_key, sub_value in value.items():
                print(f"  {sub_key}: {sub_value}")
        else:
            print(f"{key}: {value if value not in (None, '') else '-'}")
    return EXIT_OK


def _info_report(name: str | None) -> dict[str, Any]:
    import accel

    acc = accel.get_accelerator(name)
    # Who shipped the plugin, for a bug report: the distribution and its version.
    provider = next(
        (info.provider for info in accel.list_accelerators() if info.name == acc.name), None
    )
    report: dict[str, Any] = {
        "accelerator": acc.name,
        "provider": provider,
        "description": acc.spec.description,
        "device": str(acc.device),
        "device_count": acc.device_count(),
        "distributed_backend": acc.distributed_backend,
    }
    try:
        # The accelerator's own memory_stats hook: a plugin's figures show here too.
        report["memory"] = dict(acc.memory_stats())
    except Exception as exc:  # memory figures are a nicety, never a failure
        report["memory"] = f"not reported ({_one_line(exc)})"
    report["versions"] = _versions()
    report["problems"] = _problems()
    return report


def _problems() -> list[str]:
    """What in this installation keeps an accelerator from working, with the fix."""
    from accel.plugins._xla_versions import find_torch_xla_mismatch

    mismatch = find_torch_xla_mismatch()
    if mismatch is None:
        return []
    return [f"{mismatch.reason}; to fix: {mismatch.remedy}"]


def _cmd_demo(args: argparse.Namespace) -> int:
    import accel
    from accel.tools._demo import run_demo

    try:
        report = run_demo(args.accelerator, steps=args.steps)
    except accel.WeightTyingError as exc:
        print(f"validation FAILED:\n{exc}")
        return EXIT_CHECK_FAILED
    return EXIT_OK if report.ties_held else EXIT_CHECK_FAILED


def _load_factory(spec: str) -> Callable[[], Any]:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"expected MODULE:FACTORY such as 'mypkg.models:build', got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import module {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise CliError(f"{spec!r} is not callable (found {type(target).__name__})")
    factory: Callable[[], Any] = target
    return factory


def _cmd_check(args: argparse.Namespace) -> int:
    import accel
    from accel.tools._demo import report_ties
    from accel.tying import count_unique_parameters, find_tied_parameters

    if "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: modules in the current directory
    from torch import nn

    factory = _load_factory(args.factory)
    try:
        model = factory()
    except Exception as exc:
        raise CliError(f"{args.factory}() raised {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise CliError(f"{args.factory} returned {type(model).__name__}, not a torch.nn.Module")
    acc = accel.get_accelerator(args.accelerator)
    groups = find_tied_parameters(model)
    before = count_unique_parameters(model)
    print(f"model: {type(model).__name__}, {before} unique parameters")
    print(f"tied groups: {len(groups)}")
    for group in groups:
        print(f"  {group.kind}s: {', '.join(group.names)}")
    print(f"moving to {acc.device} ({acc.name})")
    try:
        # A plugin's model_to_device may return a replacement module: judge that one.
        moved = acc.model_to_device(model)
    except accel.WeightTyingError as exc:
        print(f"validation FAILED:\n{exc}")
        return EXIT_CHECK_FAILED
    passed = report_ties(groups, before, moved)
    return EXIT_OK if passed else EXIT_CHECK_FAILED
