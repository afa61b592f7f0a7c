"""Terminal rendering of one estimate (`autopar estimate`): the inputs, memory per pipeline stage by named term,
step time by term, the verdict, and the guide's remedies when the plan does not fit. Imported only to print.

Memory is in GiB (named in each table's title); times and rates carry their unit (autopar.report.units).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from autopar.remedies import Remedy
    from costmodels.scoring import Estimate

MAX_STAGE_COLUMNS = 8
"""Pipeline stages shown by default; the others are in --json (or --all-stages)."""


def _shown_stages(result: "Estimate", all_stages: bool) -> list[int]:
    pp = len(result.stages)
    if all_stages or pp <= MAX_STAGE_COLUMNS:
        return list(range(pp))
    keep = {0, 1, 2, pp // 2, pp - 3, pp - 2, pp - 1, result.worst_stage}
    return sorted(s for s in keep if 0 <= s < pp)


def print_estimate(result: "Estimate", fixes: "tuple[Remedy, ...]", reasons: dict[str, str],
                   all_stages: bool = False, stream: "TextIO | None" = None) -> None:
    from rich.console import Console

    out = stream if stream is not None else sys.stdout
    console = Console(file=out, highlight=False, width=None if out.isatty() else 120)
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
    from autopar.report.terminal import print_header_line, print_inputs

    plan, num_gpus = result.plan, result.cluster.num_gpus
    print_inputs(console, result.model, result.cluster, result.training)
    derived = f"dp {result.dp}" + (f", edp {plan.edp(num_gpus)}" if result.model.moe is not None else "")
    print_header_line(console, "plan", f"{plan.short()}  →  {derived}, {result.num_microbatches:g} microbatches "
                                       "per step")


def _print_memory(console: Any, result: "Estimate", all_stages: bool) -> None:
    from rich.table import Table

    from autopar.report.units import format_gib_cell

    shown = _shown_stages(result, all_stages)
    hidden = len(result.stages) - len(shown)
    title = "Memory per GPU by pipeline stage, GiB (- = none; * = the stage with the peak)" + (
        f" ({hidden} middle stages not shown; --all-stages)" if hidden else "")
    table = Table(title=title, title_justify="left")
    table.add_column("term")
    for stage in shown:                         # the stage's decoder-layer count is part of its heading, not a row
        layers = result.stages[stage].layers
        table.add_column(f"stage {stage}" + (" *" if stage == result.worst_stage else "")
                         + f"\n{layers:g} layer{'s' if layers != 1 else ''}", justify="right")
    terms = list(dict.fromkeys(term for stage in result.stages for term in stage.terms_bytes))
    zero = [term for term in terms if not any(stage.terms_bytes.get(term, 0.0) for stage in result.stages)]
    for term in terms:
        if term not in zero:
            table.add_row(term, *(format_gib_cell(result.stages[s].terms_bytes.get(term, 0.0)) for s in shown))
    limit = result.memory_limit_bytes
    table.add_section()
    table.add_row("[bold]total", *(f"[bold]{format_gib_cell(result.stages[s].total_bytes)}" for s in shown))
    table.add_row("limit", *(format_gib_cell(limit) for _ in shown))
    table.add_row("fits", *(("[green]yes" if result.stages[s].total_bytes <= limit else
                             f"[red]NO +{format_gib_cell(result.stages[s].total_bytes - limit)}") for s in shown))
    console.print(table)
    if zero:
        console.print(f"[dim]not shown, zero on every stage: {', '.join(zero)}[/]")
    note = freed_gradients_note(result)
    if note:
        console.print(f"[dim]{note}[/]")


def freed_gradients_note(result: "Estimate") -> str:
    """Why the gradient terms are below the gradients' size, where they are (costmodels.memory.
    gradients_at_peak_share): empty elsewhere."""
    from costmodels.memory import frees_gradients_between_steps

    if not frees_gradients_between_steps(result.training) or result.num_microbatches > 1:
        return ""
    return (f"gradients: {result.training.engine.value} frees them between steps (zero_grad(set_to_none=True)); "
            "with one micro-batch a step each layer's gradients appear as its activations are freed, so the "
            "gradient terms hold only what the gradients exceed the activations by"
            + ("; DDP's all-reduce buckets, a second copy of every gradient, stay (ddp_gradient_buckets)"
               if result.stages and result.stages[0].terms_bytes.get("ddp_gradient_buckets") else ""))


def _print_time(console: Any, result: "Estimate") -> None:
    from rich.table import Table

    from autopar.report.units import TIME_UNIT, column_cells, format_percent, format_rate, format_tflops

    step = result.step_time_s
    scale = 1.0                                 # every time in seconds, whatever its size (autopar.report.units)
    table = Table(title="Step time", title_justify="left")
    table.add_column("term")
    table.add_column(f"time ({TIME_UNIT})", justify="right")
    table.add_column("share", justify="right")
    zero = [term for term, seconds in result.time_terms_s.items() if not seconds]
    shown = [(term, seconds) for term, seconds in result.time_terms_s.items() if term not in zero]
    cells = column_cells([seconds for _, seconds in shown] + [step], scale, digits=4)
    for (term, seconds), cell in zip(shown, cells):
        table.add_row(term, cell, format_percent(seconds / step) if step else "-")
    table.add_section()
    table.add_row("[bold]step time", f"[bold]{cells[-1]}", format_percent(1.0))
    console.print(table)
    if zero:
        console.print(f"[dim]not shown, zero: {', '.join(zero)}[/]")
    precision = result.training.precision.value
    peak = result.cluster.profile.peak_flops_per_s[precision]
    console.print(f"[bold]throughput[/]  {format_rate(result.tokens_per_s)}, MFU {format_percent(result.mfu)} "
                  f"(of the {format_tflops(peak / 1e12)} dense {precision} peak)")
    console.print(f"            model {format_tflops(result.model_tflops_per_gpu)} per GPU, hardware "
                  f"{format_tflops(result.hardware_tflops_per_gpu)} per GPU (recompute counted)")


def _print_verdict(console: Any, result: "Estimate", reasons: dict[str, str]) -> None:
    from autopar.report.units import format_gib

    peak, limit = result.peak_memory_bytes, result.memory_limit_bytes
    where = f"worst stage {result.worst_stage}: {format_gib(peak, 2)} of {format_gib(limit, 2)}"
    if result.fits:
        console.print(f"[green bold]fits in memory[/] ({where}, {format_gib(limit - peak, 2)} to spare)")
    else:
        console.print(f"[red bold]does not fit[/] ({where}, {format_gib(peak - limit, 2)} over)")
    for rule, reason in reasons.items():
        console.print(f"[yellow]breaks guide rule {rule}[/]: {reason}")


def _remedy_verdict(fix: "Remedy") -> str:
    if fix.fits:
        return "[green]yes"
    if fix.fits_memory:
        return f"[yellow]memory only: breaks {', '.join(fix.still_breaks)}"
    return "[red]no"


def _print_remedies(console: Any, result: "Estimate", fixes: "tuple[Remedy, ...]") -> None:
    from rich.markup import escape
    from rich.table import Table

    from autopar.report.units import TIME_UNIT, column_cells, format_gib

    applied = [fix for fix in fixes if fix.applied]
    times = [result.step_time_s] + [fix.step_time_s for fix in applied]
    unit = TIME_UNIT                                 # one unit per column, named in the header
    time_cells = iter(column_cells(times, 1.0, digits=4))
    memory_cells = iter(column_cells([result.peak_memory_bytes] + [fix.peak_memory_bytes for fix in applied],
                                     1024**3, digits=4))
    table = Table(title="Remedies (the guide's order, each applied on top of the ones before; stops once memory "
                        "fits)", title_justify="left")
    for name, justify in (("#", "right"), ("remedy", "left"), ("change", "left"), ("peak memory (GiB)", "right"),
                          (f"step time ({unit})", "right"), ("fits", "left")):
        table.add_column(name, justify=justify)
    table.add_row("0", "[dim]your plan", result.plan.short(), next(memory_cells), next(time_cells), "[red]no")
    for index, fix in enumerate(fixes, start=1):
        if fix.applied:
            table.add_row(str(index), escape(fix.title), fix.change, next(memory_cells), next(time_cells),
                          _remedy_verdict(fix))
        else:
            table.add_row(str(index), f"[dim]{escape(fix.title)}", f"[dim]skipped: {escape(fix.skipped_because)}",
                          "", "", "")
    console.print(table)
    last = next((fix for fix in reversed(fixes) if fix.applied), None)
    if last is not None and last.fits:
        console.print(f"fits with [bold]{last.plan.short()}[/] ({format_gib(last.peak_memory_bytes, 2)}); "
                      "`autopar solve` finds the fastest plan that fits")
    elif last is not None and last.fits_memory:
        console.print(f"[yellow]within memory with [bold]{last.plan.short()}[/] "
                      f"({format_gib(last.peak_memory_bytes, 2)}), but it still breaks guide rule "
                      f"{', '.join(last.still_breaks)}[/] (see above): not a fit until that is fixed too; "
                      "`autopar solve` finds the fastest plan that fits and keeps the rules")
    else:
        console.print("[red]still does not fit after every remedy[/]: use more GPUs or larger ones "
                      "(`autopar solve` / `autopar explain`)")
