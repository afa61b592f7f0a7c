"""Terminal table of a front (rich), with units chosen per value. Imported only by commands that print.

`front_table(front)` is what `autopar solve` prints; `estimate_rows` gives the same columns for one estimate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.report.units import format_bytes, format_percent, format_rate, format_seconds

if TYPE_CHECKING:
    from rich.table import Table

    from autopar.results import Estimate, ParetoFront

COLUMNS = ("#", "plan", "step time", "throughput", "MFU", "peak memory", "stage", "microbatches")


def estimate_row(rank: int, estimate: "Estimate") -> list[str]:
    return [str(rank), estimate.plan.short(), format_seconds(estimate.step_time_s),
            format_rate(estimate.tokens_per_s), format_percent(estimate.mfu),
            f"{format_bytes(estimate.peak_memory_bytes)} / {format_bytes(estimate.memory_limit_bytes)}",
            str(estimate.worst_stage), f"{estimate.num_microbatches:g}"]


def front_table(front: "ParetoFront", title: str | None = None) -> "Table":
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for index, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if index == 1 else "right", no_wrap=index != 1)
    for rank, estimate in enumerate(front.points):
        table.add_row(*estimate_row(rank, estimate))
    return table
