"""The `autopar` command line: a thin face over the Python API (DESIGN.md §6).

Every sub-command is a module under `autopar/commands/` with `register(subparsers)` and `run(args) -> int`; this
file only builds the parser from the fixed tuple of command modules and maps errors to exit codes:

    0    success
    1    no feasible plan / the plan does not fit (`autopar.errors.Infeasible`, or a command's own verdict)
    2    bad input: one line `autopar: error: <input>: <what is wrong and the fix>` on stderr, never a traceback
    130  interrupted (Ctrl-C)

Start-up stays fast: nothing heavy (transformers, ortools, torch, rich, numpy) is imported here or at the top of a
command module; each command imports what it needs inside `run`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, Sequence

from costmodels.errors import InputError

PROG = "autopar"

COMMANDS: tuple[str, ...] = ("solve", "estimate", "explain", "models", "gpus", "calibrate", "profile")
"""Sub-command modules under autopar/commands/, in the order `autopar --help` lists them."""

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class ArgumentParser(argparse.ArgumentParser):
    """argparse with autopar's bad-input format: one error line that ends with where the options are; exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{PROG}: error: {message} (run '{self.prog} --help' for the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Lay a large model out on a GPU cluster: every parallel layout that fits in memory, the "
                    "Pareto-optimal ones, and what each costs.",
        epilog="exit codes: 0 success, 1 nothing fits / the plan does not fit, 2 bad input, 130 interrupted",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name in COMMANDS:
        module = importlib.import_module(f"autopar.commands.{name}")
        module.register(subparsers)
    return parser


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for (importlib.metadata is slow to import)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        from importlib import metadata

        try:
            version = metadata.version("autopar")
        except metadata.PackageNotFoundError:
            version = "unknown"
        print(f"{PROG} {version}")
        parser.exit(0)


def _print_error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `autopar` with `argv` (default: sys.argv[1:]) and return the exit code."""
    from autopar.errors import Infeasible

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args.run(args))
    except InputError as exc:
        _print_error(f"{exc.field}: {exc.message}")
        return EXIT_BAD_INPUT
    except Infeasible as exc:
        print(f"{PROG}: infeasible: {exc.message}", file=sys.stderr)
        if exc.rules:
            print(f"  conflicting rules: {', '.join(exc.rules)}", file=sys.stderr)
        for line in exc.details:
            print(f"  {line}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `autopar ... | head`: the reader left; not an error worth a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
