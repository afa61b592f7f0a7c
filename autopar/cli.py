"""The `autopar` command line: a thin face over the Python API (DESIGN.md §6).

Every sub-command is a module under `autopar/commands/` with `register(subparsers)` and `run(args) -> int`; this
file only builds the parser from the fixed tuple of command modules and maps errors to exit codes:

    0    success
    1    no feasible plan / the plan does not fit (`autopar.errors.Infeasible`, or a command's own verdict)
    2    bad input: one line `autopar: error: <input>: <what is wrong and the fix>` on stderr, never a traceback
    130  interrupted (Ctrl-C)
    141  stdout closed by its reader (`autopar ... | head -1`), as a Unix tool killed by SIGPIPE reports it

The parser refuses what argparse alone lets through: an option given twice (argparse keeps the last silently), and
reads a value that starts with a dash and a digit (`--layout -1,9,12,12`) as a value, never as an unknown option.
On a terminal or pipe whose encoding is not UTF-8 (`LC_ALL=C`, `PYTHONIOENCODING=ascii` or latin-1) the output is
ASCII, with `×` written `x` and `→` written `->`, rather than failing on the first such character.

Start-up stays fast: nothing heavy (transformers, ortools, torch, rich, numpy) is imported here or at the top of a
command module; each command imports what it needs inside `run`.
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import os
import re
import signal
import sys
import unicodedata
from typing import Any, NoReturn, Sequence

from costmodels.errors import InputError

PROG = "autopar"

COMMANDS: tuple[str, ...] = ("solve", "estimate", "explain", "models", "gpus", "calibrate", "profile")
"""Sub-command modules under autopar/commands/, in the order `autopar --help` lists them."""

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE
"""141: the reader of stdout went away (`| head -1`): neither success nor "nothing fits"."""

_GIVEN = "_autopar_options_given"
"""Namespace attribute (removed once parsing ends) recording which single-value options were typed, and how."""
_DASH_DIGIT = re.compile(r"^-\d")
"""A value such as `-1,9,12,12` or `-3`: autopar has no option that starts with a digit."""


class _StoreOnce(argparse._StoreAction):
    """argparse's `store`, refusing an option given twice (`--gpus 8 --gpus 16`, or `--gpus` then `--num-gpus`)
    instead of keeping the last value silently, and an empty value (`--gpu ''` is not the default GPU)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.option_strings and isinstance(values, str) and not values.strip():
            parser.error(f"argument {option_string}: the value is empty (an unset shell variable?); give one or "
                         f"leave {option_string} out for its default")
        if self.option_strings:
            given = namespace.__dict__.setdefault(_GIVEN, {})
            if self.dest in given:
                parser.error(f"argument {option_string}: given twice ({given[self.dest]}, then {option_string} "
                             f"{_shortened(values)}); give it once")
            given[self.dest] = f"{option_string} {_shortened(values)}"
        super().__call__(parser, namespace, values, option_string)


def _shortened(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit - 10]}…({len(text):,} characters)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with autopar's bad-input format: one error line that ends with where the options are; exit 2.
    Options are given at most once (_StoreOnce), and a dash followed by a digit is a value (_DASH_DIGIT)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)        # argument groups share this registry
        self.register("action", "store", _StoreOnce)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{PROG}: error: {message} (run '{self.prog} --help' for the options)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_GIVEN, None)
        return parsed, extras

    def _parse_optional(self, arg_string: str) -> Any:
        if _DASH_DIGIT.match(arg_string):      # `--layout -1,9,12,12`: the option's value, checked by its reader
            return None
        return super()._parse_optional(arg_string)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Lay a large model out on a GPU cluster: every parallel layout that fits in memory, the "
                    "Pareto-optimal ones, and what each costs.",
        epilog="exit codes: 0 success, 1 nothing fits / the plan does not fit, 2 bad input, 130 interrupted, "
               "141 stdout closed by its reader (| head)",
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


# ---- output on a stream that is not UTF-8 ----------------------------------------------------------------------

ASCII_ERRORS = "autopar-ascii"
"""The codec error handler that `main` sets on stdout and stderr when their encoding is not UTF-8."""
ASCII_SPELLINGS = {"·": "*", "×": "x", "§": "S", "−": "-", "→": "->", "←": "<-", "µ": "u", "²": "^2", "—": "--",
                   "–": "-", "Σ": "sum ", "…": "...", "ᵀ": "^T", "≥": ">=", "≤": "<=", "≠": "!=", "∞": "inf",
                   "±": "+/-", "⌈": "ceil(", "⌉": ")", "⌊": "floor(", "⌋": ")", "≈": "~", "•": "*", "✓": "yes",
                   "✗": "no", "‘": "'", "’": "'", "“": '"', "”": '"'}
"""ASCII for the characters autopar's own text uses; anything else (a model name, a path) is decomposed
(`é` as `e`) or shown as `?`."""


def ascii_spelling(char: str) -> str:
    """`char` in ASCII: ASCII_SPELLINGS, rich's box-drawing characters as `-`, `|` or `+`, a letter without its
    accent, else `?`."""
    if char in ASCII_SPELLINGS:
        return ASCII_SPELLINGS[char]
    name = unicodedata.name(char, "")
    if name.startswith("BOX DRAWINGS"):       # a line across, a line down, or a corner / junction
        across = any(word in name for word in ("HORIZONTAL", "LEFT", "RIGHT"))
        down = any(word in name for word in ("VERTICAL", "UP", "DOWN"))
        return "+" if across and down else "-" if across else "|"
    plain = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode("ascii")
    return plain or "?"


def _ascii_errors(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start:error.end]
    return "".join(ascii_spelling(char) for char in text), error.end


def use_ascii_where_not_utf8(*streams: Any) -> None:
    """Let each text stream whose encoding is not UTF-8 write ASCII, spelling what ASCII lacks (ascii_spelling)
    instead of raising UnicodeEncodeError; rich then also draws its tables with ASCII borders (it reads the
    stream's encoding). Streams that cannot be reconfigured (a test's capture buffer) are left alone."""
    try:
        codecs.lookup_error(ASCII_ERRORS)
    except LookupError:
        codecs.register_error(ASCII_ERRORS, _ascii_errors)
    for stream in streams:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            is_utf = codecs.lookup(encoding).name.startswith("utf")
        except LookupError:
            is_utf = False
        if not is_utf and hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="ascii", errors=ASCII_ERRORS)   # latin-1 too: one plain form everywhere


def _stdout_closed() -> int:
    """The reader of stdout left (`autopar ... | head -1`): point stdout at /dev/null so the interpreter's last
    flush does not fail again, and exit as a Unix tool killed by SIGPIPE does (141), never 1 ("nothing fits")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED


def main(argv: Sequence[str] | None = None) -> int:
    """Run `autopar` with `argv` (default: sys.argv[1:]) and return the exit code."""
    from autopar.errors import Infeasible

    use_ascii_where_not_utf8(sys.stdout, sys.stderr)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        code = int(args.run(args))
        sys.stdout.flush()          # a reader that left shows here, not in the interpreter's final flush
        return code
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
        return _stdout_closed()
    except SystemExit as exc:
        # rich's Console.on_broken_pipe (rich >= 13.4) answers the same BrokenPipeError with SystemExit(1)
        if isinstance(exc.__context__, BrokenPipeError):
            return _stdout_closed()
        raise
    except MemoryError:
        _print_error("memory: autopar ran out of memory; raise the process's memory limit (ulimit -v), narrow the "
                     "search (--fix, --max, fewer GPUs) or search in one process (--jobs 1: each process holds a "
                     "batch of plans)")
        return EXIT_BAD_INPUT
    except ImportError as exc:   # a library that cannot load (a low `ulimit -v` stops ortools' shared objects)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        _print_error(f"{exc.name or 'import'}: a library autopar needs could not be loaded ({_shortened(reason, 160)}); "
                     "raise the process's memory limit (ulimit -v) if it is set, or reinstall autopar "
                     "(pip install -e .)")
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
