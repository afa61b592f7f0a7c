"""`autopar estimate MODEL --tp .. --pp .. --num-gpus N`: memory per pipeline stage, step time, and the guide's
remedies when the plan does not fit (the guide's `estimate_from_hf.py`, and more).

Exit codes: 0 the plan fits and breaks no rule; 1 it does not fit in memory or breaks a guide rule (tp_node,
cp_needs_sp_tp) — the remedies / the rule are printed; 2 bad input, including a plan Megatron-LM cannot build
(tp not dividing the heads, a GPU count the sizes do not divide, ...).
"""

from __future__ import annotations

import argparse
import json
import sys

from autopar.commands import (
    add_cluster_arguments,
    add_json_argument,
    add_model_argument,
    add_plan_arguments,
    add_relax_argument,
    add_training_arguments,
)
from autopar.report.estimate_text import MAX_STAGE_COLUMNS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate", help="memory per stage, step time and remedies for one plan",
        description="Estimate one plan: memory per GPU on every pipeline stage (by named term, against the limit "
                    "with headroom), step time by term, tokens/s and MFU. When it does not fit, the Parallelism "
                    "Strategies Guide's remedies in its order, each with the computed memory after applying it.",
        epilog="exit codes: 0 fits, 1 does not fit (remedies printed) or breaks a guide rule, 2 bad input")
    add_model_argument(parser)
    add_plan_arguments(parser)
    add_cluster_arguments(parser)
    add_training_arguments(parser)
    add_relax_argument(parser)
    parser.add_argument("--framework", default=None, metavar="FRAMEWORK",
                        help="the framework that runs the step, whose engine is priced (its kernel launches and "
                             "host synchronisations): megatron, nemo, bridge, verl (Megatron-Core), torchtitan, "
                             "deepspeed, pytorch (a plain training loop) or llmc; default megatron")
    parser.add_argument("--all-stages", action="store_true",
                        help=f"show every pipeline stage (default: at most {MAX_STAGE_COLUMNS}, the others in --json)")
    add_json_argument(parser)
    from autopar.commands.output_flags import (  # F: import/report flags
        add_megatron_import_argument,
        add_output_arguments,
    )

    add_megatron_import_argument(parser)
    add_output_arguments(parser, pick=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import functools

    from autopar.commands import (model_from_args, optimizer_step_warnings, plan_from_args, plan_input_warnings,
                                   specs_from_args)
    from autopar.commands.output_flags import (
        import_megatron_run,
        report_model_mismatches,
        report_stream,
        validate_output_arguments,
        write_outputs,
    )
    from autopar.remedies import remedies
    from autopar.report.document import estimate_document, finite_or_none
    from autopar.report.estimate_text import print_estimate
    from costmodels.rules import active_rules
    from costmodels.scoring import estimate, rule_violations

    validate_output_arguments(args)  # a bad --emit/--out is exit 2 before anything is computed
    load_model = functools.cache(lambda: model_from_args(args))  # loaded once, early only when the import needs it
    # --from-megatron-args: plan, seq, batch, precision, GPUs from the command (MODEL's layer count when the command
    # needs one it does not state); plan flags given with it are a bad input
    imported = import_megatron_run(args, num_layers=lambda: load_model().num_layers)
    plan = imported.plan if imported else plan_from_args(args)  # cheap checks first: a bad --zero before the model
    active_rules(args.relax)     # an unknown or non-relaxable --relax name is a bad input
    model, cluster, training = specs_from_args(args, load_model=load_model, imported=imported)
    report_model_mismatches(imported, model)
    for warning in plan_input_warnings(model, training, plan):
        print(f"autopar: warning: {warning}", file=sys.stderr)
    result = estimate(model, cluster, training, plan, relax=args.relax)
    for warning in optimizer_step_warnings(result):
        print(f"autopar: warning: {warning}", file=sys.stderr)
    fixes = remedies(model, cluster, training, plan, relax=args.relax) if not result.fits else ()
    reasons = rule_violations(model, cluster, training, plan, relax=args.relax)
    if args.json:
        print(json.dumps(finite_or_none(estimate_document(result, fixes, reasons)), indent=2, allow_nan=False))
    else:  # OUTPUT_RULE: with --emit the launch config alone is on stdout, the report on stderr
        print_estimate(result, fixes, reasons, all_stages=args.all_stages, stream=report_stream(args))
    write_outputs(args, result)  # --out reports, --emit launch config
    return 0 if result.feasible else 1
