"""The report/export/import flags shared by `autopar solve`, `estimate` and `explain`, and what they do.

Commands add them with two calls and act on them with one:

    add_output_arguments(parser)            # --out FILE (repeatable), --emit FRAMEWORK, --pick N
    add_megatron_import_argument(parser)    # --from-megatron-args "COMMAND" | FILE
    ...
    imported = import_megatron_run(args)    # None, or the MegatronRun; sets args.seq_len/global_batch/precision
                                            # (and num_gpus when --gpus was not given) from the command
    plan = imported.plan if imported else plan_from_args(args)
    ...
    write_outputs(args, front_or_estimate)  # writes every --out, prints --emit's config for point --pick

Nothing heavy is imported at module level (argparse only).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from autopar.megatron_args import MegatronRun
    from autopar.results import Estimate, ParetoFront

FRAMEWORK_CHOICES = "megatron, nemo, bridge, verl, torchtitan, deepspeed"


def add_output_arguments(parser: argparse.ArgumentParser, pick: bool = True) -> None:
    group = parser.add_argument_group("reports and launch configs")
    group.add_argument("--out", action="append", default=[], metavar="FILE",
                       help="write a report; the format follows the extension: .json (versioned schema), .csv, "
                            ".md, .html (self-contained, with plots); repeat for several")
    group.add_argument("--emit", default=None, metavar="FRAMEWORK",
                       help=f"print the launch configuration of the chosen plan for one of: {FRAMEWORK_CHOICES}")
    if pick:
        group.add_argument("--pick", type=int, default=0, metavar="N",
                           help="which front point --emit uses: 0 = fastest (default), as numbered in the table")


def add_megatron_import_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-megatron-args", default=None, metavar="COMMAND|FILE",
                        help="take the plan, sequence length, global batch, precision (and the GPU count, when the "
                             "launcher says it) from an existing Megatron-LM command line or launch script; "
                             "plan flags (--tp, ...) are then ignored")


def import_megatron_run(args: argparse.Namespace, stderr: TextIO | None = None) -> "MegatronRun | None":
    """Parse --from-megatron-args (text or file) and copy its training fields into `args`; None without it.

    The command's --seq-length, --global-batch-size and precision replace the training flags; its GPU count is
    used unless --gpus was given. What the reader had to approximate is printed to stderr as notes.
    """
    source = getattr(args, "from_megatron_args", None)
    if source is None:
        return None
    from autopar.megatron_args import parse_megatron_args, read_megatron_source

    run = parse_megatron_args(read_megatron_source(source))
    stream = stderr if stderr is not None else sys.stderr
    training = run.training
    if "seq_len" in training:
        args.seq_len = training["seq_len"]
    if "global_batch_size" in training:
        args.global_batch = training["global_batch_size"]
    args.precision = training.get("precision", args.precision)
    if run.num_gpus is not None:
        if getattr(args, "num_gpus", None) is None:
            args.num_gpus = run.num_gpus
        elif args.num_gpus != run.num_gpus:
            print(f"autopar: note: --gpus {args.num_gpus} used; the Megatron-LM command launches {run.num_gpus}",
                  file=stream)
    for note in run.notes:
        print(f"autopar: note: {note}", file=stream)
    return run


def report_model_mismatches(run: "MegatronRun | None", model: Any, stderr: TextIO | None = None) -> None:
    """Warn (stderr) where the Megatron-LM command's model shape differs from MODEL."""
    if run is None:
        return
    for line in run.model_mismatches(model):
        print(f"autopar: warning: {line}", file=stderr if stderr is not None else sys.stderr)


def write_outputs(args: argparse.Namespace, result: "ParetoFront | Estimate", stdout: TextIO | None = None,
                  stderr: TextIO | None = None) -> None:
    """Write every --out report and print --emit's launch config (stdout, or stderr under --json; DeepSpeed's
    unexpressed knobs to stderr since JSON has no comments)."""
    from autopar.report import write_reports

    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    paths = getattr(args, "out", None) or []
    if paths:
        for path in write_reports(result, paths):
            print(f"autopar: wrote {path}", file=err)
    framework = getattr(args, "emit", None)
    if framework:
        from autopar.export import framework_name, launch_config

        framework_name(framework)  # an unknown name is a bad input before anything else
        config = launch_config(chosen_point(result, getattr(args, "pick", 0)), framework)
        # with --json, stdout holds the JSON document alone: the launch config goes to stderr
        (err if getattr(args, "json", False) else out).write(config.text)
        if config.framework == "deepspeed":  # JSON has no comments: the notes go to stderr
            for note in config.unexpressed:
                print(f"# not expressible in DeepSpeed's config: {note}", file=err)


def chosen_point(result: "ParetoFront | Estimate", pick: int) -> "Estimate":
    from autopar.results import Estimate
    from costmodels.errors import InputError

    if isinstance(result, Estimate):
        return result
    if not 0 <= pick < len(result.points):
        raise InputError("pick", f"--pick {pick} is not a point of the front; use 0 to {len(result.points) - 1}")
    return result.points[pick]
