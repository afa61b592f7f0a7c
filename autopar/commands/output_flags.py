"""The report/export/import flags shared by `autopar solve`, `estimate` and `explain`, and what they do: CLI flag
handling (the reports and launch configs themselves are written by autopar.report and autopar.export).

Commands add them with two calls and act on them with a few:

    add_output_arguments(parser)            # --out FILE (repeatable), --emit FRAMEWORK, --pick N
    add_megatron_import_argument(parser)    # --from-megatron-args "COMMAND" | FILE
    ...
    validate_output_arguments(args)         # FIRST: a bad --emit/--out/--pick is exit 2 before any computing
    imported = import_megatron_run(args)    # None, or the MegatronRun (plan, training fields, GPU count)
    plan = imported.plan if imported else plan_from_args(args)
    model, cluster, training = specs_from_args(args, imported=imported)  # the command's training and GPU count
    ...
    print_report(..., stream=report_stream(args))   # the human report: stdout, or stderr under --emit
    write_outputs(args, front_or_estimate)  # writes every --out, prints --emit's config for point --pick

stdout holds one document (OUTPUT_RULE): the --json document when --json is given, else the --emit launch config
when --emit is given, else the human report; everything else (the report displaced by --emit, the launch config
displaced by --json, notes, warnings, 'wrote FILE') goes to stderr. So `autopar estimate ... --emit deepspeed >
ds.json` writes valid JSON.

Nothing heavy is imported at module level (argparse only).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Callable, TextIO

from autopar.commands import given_plan_flags, integer

if TYPE_CHECKING:
    from autopar.megatron_args import MegatronRun
    from autopar.results import Estimate, ParetoFront

FRAMEWORK_CHOICES = "megatron, nemo, bridge, verl, torchtitan, deepspeed"
OUTPUT_RULE = ("stdout holds one document: the --json output with --json, else the --emit launch config with "
               "--emit (the report then goes to stderr), else the report")


def add_output_arguments(parser: argparse.ArgumentParser, pick: bool = True) -> None:
    group = parser.add_argument_group("reports and launch configs")
    group.add_argument("--out", action="append", default=[], metavar="FILE",
                       help="write a report; the format follows the extension: .json (versioned schema), .csv, "
                            ".md, .html (self-contained, with plots); repeat for several")
    group.add_argument("--emit", default=None, metavar="FRAMEWORK",
                       help=f"print the launch configuration of the chosen plan for one of: {FRAMEWORK_CHOICES}. "
                            f"{OUTPUT_RULE}")
    if pick:
        group.add_argument("--pick", type=integer, default=0, metavar="N",
                           help="which front point --emit uses: 0 = fastest (default), as numbered in the table")
    group.add_argument("--verl-algorithm", default=None, metavar="NAME",
                       help="with --emit verl: the advantage estimator (gae, the default, trains a critic; grpo, "
                            "rloo, reinforce_plus_plus, ... do not)")


def validate_output_arguments(args: argparse.Namespace) -> None:
    """Check --emit, --out and --pick before anything is computed: InputError (one line, exit 2), nothing on stdout.

    --emit: a known framework (normalised in place to its canonical name); --out: an extension autopar writes, in an
    existing, writable directory, not a directory itself; --pick: >= 0 and only with --emit. Whether --pick names a
    point of the front can only be known after solving (`chosen_point`).
    """
    import os

    from costmodels.errors import InputError

    framework = getattr(args, "emit", None)
    if framework is not None:
        from autopar.export import framework_name

        args.emit = framework_name(framework)
    if getattr(args, "verl_algorithm", None) is not None:
        from autopar.export.verl import verl_algorithm

        if args.emit != "verl":
            raise InputError("verl-algorithm", "--verl-algorithm applies to --emit verl only; drop it or emit verl")
        args.verl_algorithm = verl_algorithm(args.verl_algorithm)
    seen: dict[str, str] = {}
    inputs = input_files(args) if getattr(args, "out", None) else {}
    for path in getattr(args, "out", None) or []:
        from autopar.atomic_write import check_writable
        from autopar.report import report_format

        report_format(path)
        target = check_writable(path)             # a real probe: missing or read-only folders, special files, ...
        if target.exists() and not os.access(target, os.W_OK):
            raise InputError("out", f"cannot write {path!r}: permission denied; choose another directory")
        same = os.path.realpath(target)
        if same in inputs:
            raise InputError("out", f"--out {path} is {inputs[same]}, which this command reads; the report would "
                                    "replace it: choose another file")
        if same in seen:
            raise InputError("out", f"--out {path} is given twice (also as --out {seen[same]}); give each report "
                                    "file once")
        seen[same] = path
    pick = getattr(args, "pick", 0)
    if pick is not None and pick < 0:
        raise InputError("pick", f"--pick {pick}: must be >= 0 (0 = the fastest point)")
    if pick and framework is None:
        raise InputError("pick", f"--pick {pick} chooses the point --emit prints; add --emit FRAMEWORK or drop "
                                 "--pick")


def input_files(args: argparse.Namespace) -> dict[str, str]:
    """The files this command reads, by real path -> what they are: MODEL (a config.json, or a model directory's),
    --profile, --from-megatron-args given as a file. `--out` may not name one of them."""
    import os

    found: dict[str, str] = {}
    model = getattr(args, "model", None)
    for value, what in ((model, "MODEL's config"), (getattr(args, "profile", None), "the --profile file"),
                        (getattr(args, "from_megatron_args", None), "the --from-megatron-args file")):
        if not value or "\n" in value or len(value) > 4096:     # a preset, an id, or a command typed inline
            continue
        try:
            path = os.path.join(value, "config.json") if what == "MODEL's config" and os.path.isdir(value) else value
            if os.path.isfile(path):
                found[os.path.realpath(path)] = what
        except (OSError, ValueError):
            continue
    return found


def report_stream(args: argparse.Namespace, stdout: TextIO | None = None,
                  stderr: TextIO | None = None) -> TextIO:
    """Where the human report goes (OUTPUT_RULE): stderr when --emit puts the launch config on stdout."""
    if getattr(args, "emit", None) and not getattr(args, "json", False):
        return stderr if stderr is not None else sys.stderr
    return stdout if stdout is not None else sys.stdout


def add_megatron_import_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-megatron-args", default=None, metavar="COMMAND|FILE",
                        help="take the plan, sequence length, global batch, precision, overlap switches, attention "
                             "backend, MoE dispatcher and capacity, loss kernels and pipeline schedule (and the GPU "
                             "count, when the launcher says it) from an existing Megatron-LM command line or launch "
                             "script; plan flags (--tp, ...) cannot be given with it (edit the command instead); "
                             "MODEL's layer count is used when the command has no --num-layers")
    parser.add_argument("--from-bridge-config", default=None, metavar="FILE",
                        help="take the plan, sequence length, global batch, precision, optimizer state dtypes, "
                             "overlap switches, MoE dispatcher and loss kernels from a Megatron-Bridge "
                             "ConfigContainer YAML (what ConfigContainer.to_yaml writes: a run's run_config.yaml); "
                             "give --gpus (the config has no GPU count); plan flags cannot be given with it; the "
                             "settings that change memory and that autopar does not price are named")


def import_megatron_run(args: argparse.Namespace, stderr: TextIO | None = None,
                        num_layers: "Callable[[], int] | None" = None) -> "MegatronRun | None":
    """Parse --from-megatron-args (text or file); None without it. `args` is left as typed.

    `specs_from_args(args, imported=run)` then takes the command's --seq-length, --global-batch-size, precision and
    the other training switches it decides (MegatronRun.training) over the training flags, and its GPU count unless
    --gpus was given. Plan flags (--tp, ...) together with it are
    a bad input: the plan comes from the command. `num_layers` gives MODEL's layer count, asked for only when the command needs one it does not state
    (--num-layers-per-virtual-pipeline-stage without --num-layers). What the reader had to approximate is printed
    to stderr as notes.
    """
    source = getattr(args, "from_megatron_args", None)
    if getattr(args, "from_bridge_config", None) is not None:
        if source is not None:
            from costmodels.errors import InputError

            raise InputError("from-bridge-config", "give --from-megatron-args or --from-bridge-config, not both")
        return import_bridge_config(args, stderr)
    if source is None:
        return None
    from autopar.megatron_args import parse_megatron_args, read_megatron_source
    from costmodels.errors import InputError

    typed = given_plan_flags(args)
    if typed:
        raise InputError("from-megatron-args", f"the plan comes from the Megatron-LM command; drop "
                                               f"{', '.join(typed)} (or edit the command)")
    run = parse_megatron_args(read_megatron_source(source), num_layers=num_layers)
    seq_flag = "--seq-length" if "--seq-length" in run.flags else "--encoder-seq-length"
    for name, flag, command_flag in (("seq_len", "--seq-len", seq_flag),
                                     ("global_batch", "--global-batch", "--global-batch-size")):
        typed, imported = getattr(args, name, None), run.training.get(
            "seq_len" if name == "seq_len" else "global_batch_size")
        if imported is not None and typed is not None and typed != imported:
            theirs = (f"{command_flag} {imported}" if command_flag in run.flags else
                      f"default global batch (micro-batch × dp) {imported}")
            raise InputError(name, f"{flag} {typed} contradicts the Megatron-LM command's {theirs}; drop {flag} (or "
                                   "edit the command)")
    typed_precision = getattr(args, "precision", None)
    if typed_precision is not None:
        from costmodels.specs import TrainingSpec

        TrainingSpec(precision=typed_precision)           # an unknown value is named as such, not a contradiction
    if typed_precision is not None and str(typed_precision).strip().lower() != run.training["precision"]:
        theirs = "fp8 (--fp8-format)" if run.training["precision"] == "fp8" else "bf16 (no --fp8-format)"
        raise InputError("precision", f"--precision {typed_precision} contradicts the Megatron-LM command's "
                                      f"{theirs}; drop --precision (or edit the command)")
    typed_recipe, imported_recipe = getattr(args, "fp8_recipe", None), run.training.get("fp8_recipe")
    if typed_recipe is not None and str(typed_recipe).strip().lower() != imported_recipe:
        theirs = ("bf16 (no --fp8-format)" if imported_recipe is None else
                  f"--fp8-recipe {imported_recipe}" if "--fp8-recipe" in run.flags else
                  f"fp8 recipe {imported_recipe} (Megatron-Core's default without --fp8-recipe)")
        raise InputError("fp8_recipe", f"--fp8-recipe {typed_recipe} contradicts the Megatron-LM command's {theirs}; "
                                       "drop --fp8-recipe (or edit the command)")
    stream = stderr if stderr is not None else sys.stderr
    typed_gpus = getattr(args, "num_gpus", None)
    if run.num_gpus is not None and typed_gpus is not None and typed_gpus != run.num_gpus:
        print(f"autopar: note: --gpus {typed_gpus} used; the Megatron-LM command launches {run.num_gpus}",
              file=stream)
    typed_dispatcher, imported_dispatcher = getattr(args, "moe_dispatcher", None), run.training.get("moe_dispatcher")
    if imported_dispatcher is not None and typed_dispatcher not in (None, "alltoall", imported_dispatcher):
        print(f"autopar: note: --moe-dispatcher {typed_dispatcher} ignored: the Megatron-LM command runs "
              f"{imported_dispatcher}", file=stream)
    for name, flag, default in (("moe_capacity_factor", "--moe-capacity-factor", None),
                                ("moe_imbalance_factor", "--moe-imbalance-factor", 1.0)):
        typed_value, imported_value = getattr(args, name, None), run.training.get(name)
        if imported_value is not None and typed_value not in (None, default, imported_value):
            print(f"autopar: note: {flag} {typed_value:g} ignored: the Megatron-LM command runs {imported_value:g} "
                  "(--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity)", file=stream)
    typed_gemm, imported_gemm = getattr(args, "expert_gemm", None), run.training.get("expert_gemm")
    if imported_gemm is not None and typed_gemm not in (None, imported_gemm):
        print(f"autopar: note: --expert-gemm {typed_gemm} ignored: the Megatron-LM command runs {imported_gemm} "
              "(Transformer Engine's GroupedLinear, a cuBLAS GEMM per expert)", file=stream)
    if getattr(args, "grad_reduce_in_bf16", False) and run.training["grad_reduce_in_fp32"]:
        print("autopar: note: --grad-reduce-in-bf16 ignored: the Megatron-LM command reduces gradients in fp32 "
              "(its own gradient dtype, as Megatron-LM derives it, is priced)", file=stream)
    if getattr(args, "fp8_param_gather", False) and not run.training.get("fp8_param_gather", False):
        print("autopar: note: --fp8-param-gather ignored: the Megatron-LM command keeps bf16 weights (without "
              "--fp8-param-gather, or under --use-torch-fsdp2)", file=stream)
    typed_offload = getattr(args, "offload_modules", None)
    if typed_offload is not None and tuple(typed_offload) != tuple(run.training.get("offload_modules", ())):
        print(f"autopar: note: --offload-modules {' '.join(typed_offload)} ignored: the Megatron-LM command "
              f"offloads {' '.join(run.training.get('offload_modules', ())) or 'nothing'} "
              "(--fine-grained-activation-offloading --offload-modules)", file=stream)
    from costmodels.specs import CrossEntropyKernel, PipelineSchedule

    imported_loss = run.training["cross_entropy"]
    typed_loss = overridden_choice(args, "cross_entropy", imported_loss, CrossEntropyKernel, "cross-entropy kernel")
    if typed_loss is not None:
        print(f"autopar: note: the loss kernel {typed_loss} you gave is ignored: the Megatron-LM command "
              f"runs {imported_loss} ({'with' if imported_loss == 'fused' else 'without'} "
              "--cross-entropy-loss-fusion)", file=stream)
    imported_schedule = run.training["pipeline_schedule"]
    typed_schedule = overridden_choice(args, "pipeline_schedule", imported_schedule, PipelineSchedule,
                                       "pipeline schedule")
    if typed_schedule is not None:
        print(f"autopar: note: --pipeline-schedule {typed_schedule} ignored: the Megatron-LM command "
              f"runs {imported_schedule}", file=stream)
    for note in run.notes:
        print(f"autopar: note: {note}", file=stream)
    return run


def import_bridge_config(args: argparse.Namespace, stderr: TextIO | None = None) -> "MegatronRun":
    """Read --from-bridge-config (autopar.bridge_config): the plan and training settings of a Megatron-Bridge
    config, as --from-megatron-args takes a command's. Plan flags beside it, or a --seq-len / --global-batch the
    config contradicts, are a bad input; its notes and the settings autopar does not price go to stderr."""
    from autopar.bridge_config import read_bridge_config
    from costmodels.errors import InputError

    typed = given_plan_flags(args)
    if typed:
        raise InputError("from-bridge-config", f"the plan comes from the Megatron-Bridge config; drop "
                                               f"{', '.join(typed)} (or edit the config)")
    run = read_bridge_config(args.from_bridge_config)
    for name, flag, field_name, config_field in (("seq_len", "--seq-len", "seq_len", "model.seq_length"),
                                                 ("global_batch", "--global-batch", "global_batch_size",
                                                  "train.global_batch_size")):
        typed_value, imported = getattr(args, name, None), run.training.get(field_name)
        if imported is not None and typed_value is not None and typed_value != imported:
            raise InputError(name, f"{flag} {typed_value} contradicts the config's {config_field} {imported}; drop "
                                   f"{flag} (or edit the config)")
    typed_precision = getattr(args, "precision", None)
    if typed_precision is not None and str(typed_precision).strip().lower() != run.training["precision"]:
        raise InputError("precision", f"--precision {typed_precision} contradicts the config's mixed_precision "
                                      f"({run.training['precision']}); drop --precision (or edit the config)")
    stream = stderr if stderr is not None else sys.stderr
    for note in run.notes:
        print(f"autopar: note: {note}", file=stream)
    for switch in run.not_priced:
        print(f"autopar: note: not priced: {switch}", file=stream)
    return run


def overridden_choice(args: argparse.Namespace, name: str, imported: str, choices: Any, what: str) -> "str | None":
    """The value typed for the training flag `name` (lower case) where it differs from the `imported` one the
    Megatron-LM command sets, else None; a typed value that is none of `choices` (an enum) is an InputError."""
    typed = getattr(args, name, None)
    if typed is None or str(typed).lower() == imported:
        return None
    from costmodels.errors import InputError

    if str(typed).lower() not in {choice.value for choice in choices}:
        raise InputError(name, f"unknown {what} {typed!r}; use {', '.join(choice.value for choice in choices)}")
    return str(typed).lower()


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
    validate_output_arguments(args)  # callers validate first; this keeps direct callers safe too
    paths = getattr(args, "out", None) or []
    if paths:
        for path in write_reports(result, paths):
            print(f"autopar: wrote {path}", file=err)
    framework = getattr(args, "emit", None)
    if framework:
        from autopar.export import launch_config

        from autopar.export.capabilities import Unsupported

        point = chosen_point(result, getattr(args, "pick", 0))
        try:
            config = launch_config(point, framework, verl_algorithm=getattr(args, "verl_algorithm", None))
        except Unsupported as refused:   # exit 2 with the reason and the nearest plan the framework runs
            raise refused.with_nearest(point) from None
        text = config.text
        if not point.fits:   # a script saved with `> train.sh` must say it will run out of memory
            warning = (f"does not fit: peak {point.peak_memory_bytes / 2**30:.1f} GiB per GPU on stage "
                       f"{point.worst_stage}, over the {point.cluster.memory_limit_bytes / 2**30:.1f} GiB limit; this "
                       "job would run out of memory")
            if config.framework == "deepspeed":
                print(f"# deepspeed: {warning}", file=err)
            else:
                text = f"# WARNING: {warning}\n" + text
        # OUTPUT_RULE: with --json, stdout holds the JSON document alone and the launch config goes to stderr
        (err if getattr(args, "json", False) else out).write(text)
        if config.framework == "deepspeed":  # JSON has no comments: the notes go to stderr
            for note in config.unexpressed:
                print(f"# deepspeed: {note}", file=err)


def chosen_point(result: "ParetoFront | Estimate", pick: int) -> "Estimate":
    from costmodels.errors import InputError
    from costmodels.scoring import Estimate

    if isinstance(result, Estimate):
        return result
    if not 0 <= pick < len(result.points):
        raise InputError("pick", f"--pick {pick} is not a point of the front; use 0 to {len(result.points) - 1}")
    return result.points[pick]
