"""Run the real CLI over a grid of ordinary inputs and report any that escape its two error channels.

Every `autopar` run ends in exit 0 (success), 1 (nothing fits, with the reason) or 2 (bad input, one line naming it);
a traceback, or any other exit code, is a defect. This sweep finds such defects where no test thought to look:

- `solve` for every bundled preset on four GPUs;
- `solve`, `estimate --json` and `explain --json` under every framework (`--framework`), for dense and MoE models;
- `solve ... --emit FW` for every framework the exports target;
- every report format (`--out` .json, .md, .csv, .html) under every framework.

It found, in stop 52, that `--emit deepspeed` could choose a layout plan DeepSpeed cannot run and exit 2, and that a
MoE front under DeepSpeed crashed its JSON report. It runs `autopar.cli.main` in this process (minutes, not a test:
tests/test_hostile_input.py holds the hostile inputs CI runs).

    python benchmarks/cli_sweep.py            # the whole grid (several minutes)
    python benchmarks/cli_sweep.py --quick    # one GPU, two models a framework

Prints one line per defect and ends with `cli-sweep: runs=N defects=D exit_codes=0:a,1:b,2:c`; exits 1 when D > 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autopar.cli import main  # noqa: E402
from autopar.export.names import FRAMEWORKS  # noqa: E402

PRESETS_DIR = Path(__file__).resolve().parent.parent / "autopar" / "presets"
GPUS = ("h100", "b200", "a100-40gb", "gb200")
ENGINE_FRAMEWORKS = (*FRAMEWORKS, "pytorch", "llmc")
"""Every --framework: the exported ones and those priced only."""
SWEEP_MODELS = ("llama-3.2-1b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite", "gpt-oss-20b")
ALLOWED_EXIT_CODES = (0, 1, 2)


def presets() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.json"))


def runs(quick: bool, folder: Path) -> list[list[str]]:
    """The command lines of the sweep."""
    gpus = GPUS[:1] if quick else GPUS
    models = SWEEP_MODELS[:2] if quick else SWEEP_MODELS
    batch = ["--seq-len", "2048", "--global-batch", "32"]
    commands = [["solve", model, "--gpus", "64", "--gpu", gpu, "--seq-len", "4096", "--global-batch", "512"]
                for model in (presets()[:3] if quick else presets()) for gpu in gpus]
    for framework in ENGINE_FRAMEWORKS:
        for model in models:
            stem = str(folder / f"{framework}-{model}")
            commands += [
                ["solve", model, "--gpus", "16", "--gpu", "h100", *batch, "--framework", framework,
                 "--out", f"{stem}.json", "--out", f"{stem}.md", "--out", f"{stem}.csv", "--out", f"{stem}.html"],
                ["estimate", model, "--gpus", "8", "--gpu", "h100", *batch, "--framework", framework, "--tp", "1",
                 "--mbs", "1", "--json"],
                ["explain", model, "--gpus", "8", "--gpu", "h100", *batch, "--framework", framework, "--tp", "1",
                 "--mbs", "1", "--json"],
            ]
    for framework in FRAMEWORKS:
        for model in models:
            commands.append(["solve", model, "--gpus", "16", "--gpu", "h100", *batch, "--emit", framework])
    return commands


def run_one(argv: list[str]) -> tuple[int | None, str]:
    """(exit code, the traceback's last lines) of one CLI run; exit code None when an exception escaped main."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:             # main returns its codes; an exit from deeper down is a defect too
        return (exc.code if isinstance(exc.code, int) else None), f"SystemExit({exc.code!r}) escaped main"
    except BaseException:                 # noqa: BLE001 - what escapes the CLI is what this sweep reports
        return None, " | ".join(traceback.format_exc().strip().splitlines()[-3:])
    return code, ""


def main_sweep(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one GPU and two models a framework")
    args = parser.parse_args(argv)
    codes: Counter = Counter()
    defects = 0
    with tempfile.TemporaryDirectory() as folder:
        commands = runs(args.quick, Path(folder))
        for command in commands:
            code, why = run_one(command)
            codes[code] += 1
            if code not in ALLOWED_EXIT_CODES or why:
                defects += 1
                print(f"defect: autopar {' '.join(command)}: exit {code}; {why}")
    shown = ",".join(f"{code}:{count}" for code, count in sorted(codes.items(), key=lambda item: str(item[0])))
    print(f"cli-sweep: runs={len(commands)} defects={defects} exit_codes={shown}")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main_sweep())
