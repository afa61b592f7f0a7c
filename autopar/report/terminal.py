"""Terminal table of a front (rich), with units chosen per value. Imported only by commands that print.

`front_table(front)` is what `autopar solve` prints; `estimate_rows` gives the same columns for one estimate;
`print_inputs(console, model, cluster, training)` prints the inputs header every command starts with
(`autopar.report.header.inputs_header`), so solve, estimate and explain word it the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.report.units import format_bytes, format_percent, format_rate, format_seconds

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from autopar.results import Estimate, ParetoFront
    from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

LABEL_WIDTH = 10
"""Width of the label column of the header lines ('model', 'cluster', 'training', 'plan', ...)."""


def print_header_line(console: "Console", label: str, text: str) -> None:
    """One header line: the label in bold, padded; the text as typed (user text is not read as rich markup)."""
    from rich.text import Text

    console.print(Text.assemble((label.ljust(LABEL_WIDTH), "bold"), text))


def print_inputs(console: "Console", model: "ModelSpec", cluster: "ClusterSpec", training: "TrainingSpec") -> None:
    """The model / cluster / training header lines (autopar.report.header.inputs_header)."""
    from autopar.report.header import inputs_header

    for label, text in inputs_header(model, cluster, training):
        print_header_line(console, label, text)


COLUMNS = ("#", "plan", "step time", "throughput", "MFU", "peak memory", "stage", "microbatches")


def estimate_row(rank: int, estimate: "Estimate") -> list[str]:
    return [str(rank), estimate.plan.short(), format_seconds(estimate.step_time_s),
            format_rate(estimate.tokens_per_s), format_percent(estimate.mfu),
            f"{format_bytes(estimate.peak_memory_bytes)} / {format_bytes(estimate.memory_limit_bytes)}",
            str(estimate.worst_stage), f"{estimate.num_microbatches:g}"]


def front_table(front: "ParetoFront", title: str | None = None) -> "Table":
    """The front, one row per point; a GPUs column when the points run on different GPU counts (scaling front)."""
    from rich.table import Table

    scaling = len({estimate.cluster.num_gpus for estimate in front.points}) > 1
    table = Table(title=title, title_justify="left")
    columns = COLUMNS[:2] + (("GPUs",) if scaling else ()) + COLUMNS[2:]
    for index, name in enumerate(columns):
        table.add_column(name, justify="left" if index == 1 else "right", no_wrap=index != 1)
    for rank, estimate in enumerate(front.points):
        row = estimate_row(rank, estimate)
        table.add_row(*(row[:2] + ([str(estimate.cluster.num_gpus)] if scaling else []) + row[2:]))
    return table
