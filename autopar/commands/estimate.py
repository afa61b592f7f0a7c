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
from typing import TYPE_CHECKING, Any

from autopar.commands import (add_cluster_arguments, add_json_argument, add_model_argument, add_plan_arguments,
                              add_relax_argument, add_training_arguments)

if TYPE_CHECKING:
    from autopar.estimate import Remedy
    from autopar.results import Estimate

GIB = 1024**3
MAX_STAGE_COLUMNS = 8


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
    parser.add_argument("--all-stages", action="store_true",
                        help=f"show every pipeline stage (default: at most {MAX_STAGE_COLUMNS}, the others in --json)")
    add_json_argument(parser)
    from autopar.report.options import add_megatron_import_argument, add_output_arguments  # F: import/report flags

    add_megatron_import_argument(parser)
    add_output_arguments(parser, pick=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autopar.commands import plan_from_args, specs_from_args
    from autopar.estimate import estimate, remedies, rule_violations
    from autopar.report.options import import_megatron_run, report_model_mismatches, write_outputs
    from autopar.search.rules import active_rules

    imported = import_megatron_run(args)  # --from-megatron-args: plan, seq, batch, precision, GPUs from the command
    plan = imported.plan if imported else plan_from_args(args)  # cheap checks first: a bad --zero before the model
    active_rules(args.relax)     # an unknown or non-relaxable --relax name is a bad input
    model, cluster, training = specs_from_args(args)
    report_model_mismatches(imported, model)
    result = estimate(model, cluster, training, plan, relax=args.relax)
    fixes = remedies(model, cluster, training, plan, relax=args.relax) if not result.fits else ()
    reasons = rule_violations(model, cluster, training, plan, relax=args.relax)
    if args.json:
        print(json.dumps(estimate_to_dict(result, fixes, reasons), indent=2))
    else:
        print_estimate(result, fixes, reasons, all_stages=args.all_stages)
    write_outputs(args, result)  # --out reports, --emit launch config
    return 0 if result.feasible else 1


def estimate_to_dict(result: "Estimate", fixes: "tuple[Remedy, ...]", reasons: dict[str, str]) -> dict[str, Any]:
    from autopar.describe import describe_inputs

    return {"inputs": describe_inputs(result.model, result.cluster, result.training), **result.to_dict(),
            "violation_reasons": {rule: reasons.get(rule, "peak memory exceeds the limit")
                                  for rule in result.violations},
            "remedies": [fix.to_dict(result.cluster.num_gpus) for fix in fixes]}


# ---- terminal output -------------------------------------------------------------------------------------------

def format_bytes(value: float) -> str:
    """GiB down to 0.1 GiB, then MiB, then KiB: '61.42 GiB', '512.0 MiB'."""
    magnitude = abs(value)
    if magnitude >= 0.1 * GIB:
        return f"{value / GIB:.2f} GiB"
    if magnitude >= 1024**2 or magnitude == 0:
        return f"{value / 1024**2:.1f} MiB" if magnitude else "0"
    return f"{value / 1024:.1f} KiB"


def format_seconds(value: float) -> str:
    if abs(value) >= 1.0:
        return f"{value:.2f} s"
    if abs(value) >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs" if value else "0"


def _count(value: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:g}"


def _shown_stages(result: "Estimate", all_stages: bool) -> list[int]:
    pp = len(result.stages)
    if all_stages or pp <= MAX_STAGE_COLUMNS:
        return list(range(pp))
    keep = {0, 1, 2, pp // 2, pp - 3, pp - 2, pp - 1, result.worst_stage}
    return sorted(s for s in keep if 0 <= s < pp)


def print_estimate(result: "Estimate", fixes: "tuple[Remedy, ...]", reasons: dict[str, str],
                   all_stages: bool = False) -> None:
    from rich.console import Console

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    _print_inputs(console, result)
    console.print()
    _print_memory(console, result, all_stages)
    console.print()
    _print_time(console, result)
    console.print()
    _print_verdict(console, result, reasons)
    if fixes:
        console.print()
        _print_remedies(console, result, fixes)


def _print_inputs(console: Any, result: "Estimate") -> None:
    from costmodels import params

    model, cluster, training, plan = result.model, result.cluster, result.training, result.plan
    profile = cluster.profile
    shape = (f"h={model.hidden_size}, {model.num_layers} layers, {model.num_attention_heads} heads "
             f"({model.num_kv_heads} kv), ffn {model.ffn_hidden_size}, vocab {model.vocab_size}")
    total, active = params.total_params(model), params.active_params(model)
    size = f"{_count(total)} params" + (f" ({_count(active)} active)" if active != total else "")
    if model.moe is not None:
        shape += f", {model.moe.num_experts} experts top-{model.moe.top_k}"
    console.print(f"[bold]model[/]     {model.name}: {size}; {shape}")
    console.print(f"[bold]cluster[/]   {cluster.num_gpus} × {profile.display_name} ({cluster.num_nodes} node"
                  f"{'s' if cluster.num_nodes > 1 else ''} of {cluster.gpus_per_node}), "
                  f"{profile.hbm_bytes / GIB:g} GiB HBM, limit {format_bytes(cluster.memory_limit_bytes)} "
                  f"({cluster.headroom:.0%} headroom) \\[{profile.source_path}]")
    console.print(f"[bold]training[/]  seq {training.seq_len}, global batch {training.global_batch_size} "
                  f"({_count(training.tokens_per_step)} tokens), {training.precision.value}, flash attention "
                  f"{'on' if training.flash_attention else 'off'}, fused cross entropy "
                  f"{'on' if training.fused_cross_entropy else 'off'}"
                  + (f", MoE capacity factor {training.moe_capacity_factor}"
                     if model.moe is not None and training.moe_capacity_factor else ""))
    console.print(f"[bold]plan[/]      {plan.short()}  →  dp {result.dp}, edp {plan.edp(cluster.num_gpus)}, "
                  f"{result.num_microbatches:g} microbatches per step")


def _print_memory(console: Any, result: "Estimate", all_stages: bool) -> None:
    from rich.table import Table

    shown = _shown_stages(result, all_stages)
    hidden = len(result.stages) - len(shown)
    title = "Memory per GPU by pipeline stage" + (f" ({hidden} middle stages not shown; --all-stages)"
                                                  if hidden else "")
    table = Table(title=title, title_justify="left")
    table.add_column("term")
    for stage in shown:
        table.add_column(f"stage {stage}" + (" *" if stage == result.worst_stage else ""), justify="right")
    terms = list(dict.fromkeys(term for stage in result.stages for term in stage.terms_bytes))
    zero = [term for term in terms if not any(stage.terms_bytes.get(term, 0.0) for stage in result.stages)]
    table.add_row("layers", *(f"{result.stages[s].layers:g}" for s in shown), style="dim")
    for term in terms:
        if term not in zero:
            table.add_row(term, *(format_bytes(result.stages[s].terms_bytes.get(term, 0.0)) for s in shown))
    limit = result.memory_limit_bytes
    table.add_section()
    table.add_row("[bold]total", *(f"[bold]{format_bytes(result.stages[s].total_bytes)}" for s in shown))
    table.add_row("limit", *(format_bytes(limit) for _ in shown))
    table.add_row("fits", *(("[green]yes" if result.stages[s].total_bytes <= limit else
                             f"[red]NO +{format_bytes(result.stages[s].total_bytes - limit)}") for s in shown))
    console.print(table)
    if zero:
        console.print(f"[dim]not shown, zero on every stage: {', '.join(zero)}[/]")


def _print_time(console: Any, result: "Estimate") -> None:
    from rich.table import Table

    step = result.step_time_s
    table = Table(title="Step time", title_justify="left")
    table.add_column("term")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    zero = [term for term, seconds in result.time_terms_s.items() if not seconds]
    for term, seconds in result.time_terms_s.items():
        if term not in zero:
            table.add_row(term, format_seconds(seconds), f"{seconds / step:.1%}" if step else "-")
    table.add_section()
    table.add_row("[bold]step time", f"[bold]{format_seconds(step)}", "100.0%")
    console.print(table)
    if zero:
        console.print(f"[dim]not shown, zero: {', '.join(zero)}[/]")
    precision = result.training.precision.value
    peak = result.cluster.profile.peak_flops_per_s[precision] / 1e12
    console.print(f"[bold]throughput[/]  {result.tokens_per_s:,.0f} tokens/s, MFU {result.mfu:.1%} "
                  f"(of the {peak:g} TFLOP/s dense {precision} peak)")
    console.print(f"            model {result.model_tflops_per_gpu:.1f} TFLOP/s per GPU, hardware "
                  f"{result.hardware_tflops_per_gpu:.1f} TFLOP/s per GPU (recompute counted)")


def _print_verdict(console: Any, result: "Estimate", reasons: dict[str, str]) -> None:
    peak, limit = result.peak_memory_bytes, result.memory_limit_bytes
    where = f"worst stage {result.worst_stage}: {format_bytes(peak)} of {format_bytes(limit)}"
    if result.fits:
        console.print(f"[green bold]fits[/] ({where}, {format_bytes(limit - peak)} to spare)")
    else:
        console.print(f"[red bold]does not fit[/] ({where}, {format_bytes(peak - limit)} over)")
    for rule, reason in reasons.items():
        console.print(f"[yellow]breaks guide rule {rule}[/]: {reason}")


def _print_remedies(console: Any, result: "Estimate", fixes: "tuple[Remedy, ...]") -> None:
    from rich.table import Table

    table = Table(title="Remedies (the guide's order, each applied on top of the ones before; stops once it fits)",
                  title_justify="left")
    for name, justify in (("#", "right"), ("remedy", "left"), ("change", "left"), ("peak memory", "right"),
                          ("step time", "right"), ("fits", "left")):
        table.add_column(name, justify=justify)
    table.add_row("0", "[dim]your plan", result.plan.short(), format_bytes(result.peak_memory_bytes),
                  format_seconds(result.step_time_s), "[red]no")
    for index, fix in enumerate(fixes, start=1):
        if fix.applied:
            table.add_row(str(index), fix.title, fix.change, format_bytes(fix.peak_memory_bytes),
                          format_seconds(fix.step_time_s), "[green]yes" if fix.fits else "[red]no")
        else:
            table.add_row(str(index), f"[dim]{fix.title}", f"[dim]skipped: {fix.skipped_because}", "", "", "")
    console.print(table)
    last = next((fix for fix in reversed(fixes) if fix.applied), None)
    if last is not None and last.fits:
        console.print(f"fits with [bold]{last.plan.short()}[/] ({format_bytes(last.peak_memory_bytes)}); "
                      "`autopar solve` finds the fastest plan that fits")
    else:
        console.print("[red]still does not fit after every remedy[/]: use more GPUs or larger ones "
                      "(`autopar solve` / `autopar explain`)")
