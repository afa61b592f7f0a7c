"""Terminal table of a front (rich), one fixed unit per column. Imported only by commands that print.

`front_table(front)` is what `autopar solve` prints; `estimate_rows` gives the same columns for one estimate;
`print_inputs(console, model, cluster, training)` prints the inputs header every command starts with
(`autopar.report.header.inputs_header`), so solve, estimate and explain word it the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.report.units import format_percent

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


def front_columns(front: "ParetoFront", scaling: bool = False) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the front table: one fixed unit per column, named in its header (seconds, tokens/s, GiB:
    autopar.report.units), with enough decimals that neighbouring rows never print the same number; a GPUs column
    on a scaling front (`scaling`, or points on several GPU counts)."""
    from autopar.report.units import RATE_UNIT, TIME_UNIT, column_cells, rate_cells, whole_count

    points = list(front.points)
    scaling = scaling or len({p.cluster.num_gpus for p in points}) > 1
    times = [p.step_time_s for p in points]
    rates = [p.tokens_per_s for p in points]
    peaks = [p.peak_memory_bytes for p in points]
    limits = sorted({p.memory_limit_bytes for p in points})
    limit = f"of {limits[0] / 1024**3:.1f}" if len(limits) == 1 else "limit per row"
    headers = (["#", "plan"] + (["GPUs"] if scaling else [])
               + [f"step time ({TIME_UNIT})", f"throughput ({RATE_UNIT})", "MFU",
                  f"peak memory (GiB {limit})", "peak stage", "microbatches"])
    time_cells = column_cells(times, 1.0)
    rate_column = rate_cells(rates)
    peak_cells = column_cells(peaks, 1024**3, digits=3)
    rows = []
    for rank, point in enumerate(points):
        memory = peak_cells[rank] if len(limits) == 1 else \
            f"{peak_cells[rank]} / {point.memory_limit_bytes / 1024**3:.1f}"
        rows.append([str(rank), point.plan.short()] + ([f"{point.cluster.num_gpus:,}"] if scaling else [])
                    + [time_cells[rank], rate_column[rank], format_percent(point.mfu), memory,
                       str(point.worst_stage), whole_count(point.num_microbatches)])
    return headers, rows


LEGEND = (
    ("split", "splitF/L = F layers on the first pipeline stage, L on the last (- = even share)"),
    ("sel", "sel = selective recompute"),
    ("full", "fullN = full recompute of N layers per stage"),
    ("z", "zN = ZeRO-N (z1 = distributed optimizer)"),
    ("sp", "sp = sequence parallel"),
)
"""What each plan-label token means, keyed by its prefix; a legend under a table lists those its labels use."""


def plan_legend(labels: "list[str]") -> str:
    """One line explaining the label tokens used in `labels` beyond tpN ppN vppN cpN epN etpN mbsN, and the peak
    stage column."""
    tokens = {token for label in labels for token in label.split()}
    used = []
    for prefix, text in LEGEND:
        if prefix == "z":
            hit = any(len(t) == 2 and t[0] == "z" and t[1].isdigit() for t in tokens)
        elif prefix == "sp":
            hit = "sp" in tokens
        else:
            hit = any(t.startswith(prefix) for t in tokens)
        if hit:
            used.append(text)
    used.append("peak stage = stage with the most memory (0 = first)")
    return "; ".join(used)


def front_table(front: "ParetoFront", title: str | None = None, scaling: bool = False) -> "Table":
    """The front, one row per point (`front_columns`), with the label legend as the caption."""
    from rich.table import Table

    headers, rows = front_columns(front, scaling)
    table = Table(title=title, title_justify="left", caption=plan_legend([row[1] for row in rows]),
                  caption_justify="left")
    for index, name in enumerate(headers):
        table.add_column(name, justify="left" if name == "plan" else "right", no_wrap=name != "plan")
    for row in rows:
        table.add_row(*row)
    return table
