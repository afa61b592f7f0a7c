"""`autopar explain MODEL --gpus N [--tp 8 --pp 2 ...]`: why a plan is not on the front, or why nothing fits.

With plan flags: the rule the plan breaks, or the front point that dominates it, by how much, and the named
step-time terms that make the difference (the guide's "Training is slow" causes: bubble from too much PP, TP
communication, a micro-batch too small, excessive recomputation). Without plan flags: whether anything fits, and
if not the smallest set of conflicting rules, the nearest plan and its memory shortfall.

Exit codes: 0 explained; 1 nothing fits (printed as for `solve`); 2 bad input.
"""

from __future__ import annotations

import argparse
import json

from autopar.commands import (
    add_cluster_arguments,
    add_json_argument,
    add_model_argument,
    add_plan_arguments,
    add_training_arguments,
    given_plan_flags,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain", help="why a plan is not on the front, or why nothing fits",
        description="Explain a plan against the Pareto front (the rule it breaks, or the plan that beats it and "
                    "which time terms make the difference), or, without plan flags, why no plan fits.",
        epilog="exit codes: 0 explained, 1 nothing fits, 2 bad input")
    add_model_argument(parser)
    add_plan_arguments(parser)
    add_cluster_arguments(parser)
    add_training_arguments(parser)
    from autopar.commands.solve import add_search_arguments

    add_search_arguments(parser)
    from autopar.commands.output_flags import add_megatron_import_argument

    add_megatron_import_argument(parser)   # explain a running job: is there a faster layout?
    add_json_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import functools

    from autopar.commands import model_from_args, plan_from_args, specs_from_args
    from autopar.commands.output_flags import import_megatron_run, report_model_mismatches
    from autopar.commands.solve import controls_from_args
    from autopar.search.solve import solve
    from costmodels.rules import active_rules
    from costmodels.units import GIB

    controls, bounds = controls_from_args(args)
    active_rules(args.relax)
    load_model = functools.cache(lambda: model_from_args(args))
    # --from-megatron-args: the plan, seq, batch, precision and GPU count of a running job
    imported = import_megatron_run(args, num_layers=lambda: load_model().num_layers)
    given = imported is not None or bool(given_plan_flags(args))
    if imported is not None:
        plan = imported.plan
    elif given:
        plan = plan_from_args(args)   # flags not typed take the plan defaults (autopar.commands.plan_defaults)
    model, cluster, training = specs_from_args(args, load_model=load_model, imported=imported)
    report_model_mismatches(imported, model)
    front = solve(model, cluster, training, fix=args.fix, bounds=bounds, relax=tuple(args.relax),
                  time_limit_s=args.time_limit, solver=args.solver, jobs=args.jobs)   # Infeasible -> exit 1
    if not given:
        lines = [f"{len(front.points)} Pareto-optimal plans fit; the fastest is {front.points[0].plan.short()} "
                 f"({front.points[0].step_time_s:.3f} s per step, "
                 f"{front.points[0].peak_memory_bytes / GIB:.1f} GiB peak); run `autopar solve` for the front"]
        if args.json:
            print(json.dumps({"feasible": True, "front_size": len(front.points), "explanation": lines}, indent=2))
        else:
            print("\n".join(lines))
        return 0
    from autopar.search.explain import explain_plan

    explanation = explain_plan(model, cluster, training, plan, front, relax=tuple(args.relax), controls=controls)
    layout_lines, layout_document = [], {}
    if plan.pp > 1:   # where a per-stage layout would pay for this plan's structure (autopar.search.refine)
        from autopar.search.refine import explain_layout

        layout_lines, layout_document = explain_layout(model, cluster, training, plan)
    if args.json:
        document = explanation.to_dict()
        if layout_document:
            document["layout"] = layout_document
        print(json.dumps(document, indent=2))
    else:
        print(f"plan {plan.short()} on {cluster.num_gpus} × {cluster.profile.name}:")
        for line in list(explanation.lines) + layout_lines:
            print(f"  {line}")
    return 0
