"""Human units for terminal tables and reports.

Everything inside autopar is in base units (bytes, seconds, FLOP/s); these helpers are the one place they turn into
text. Times and throughputs have one unit each, the same in every report and on every run: seconds (`s`, never
minutes, which `min` would spell like "minimum") and tokens per second (`tokens/s`, whole numbers grouped by
thousands, never switching between k and M by magnitude); achieved compute in TFLOP/s per GPU. Memory columns are in
GiB; a single byte count in prose takes the binary prefix that fits it (GPU HBM is sold in GiB-sized stacks and
`nvidia-smi` reports MiB). Pure functions of a number: no locale, no global state.
"""

from __future__ import annotations

import math

from costmodels.units import GIB

_BYTE_UNITS: tuple[tuple[str, int], ...] = (("TiB", 1024 * GIB), ("GiB", GIB), ("MiB", GIB // 1024), ("KiB", 1024))
TIME_UNIT = "s"
"""The unit of every step time and time term, in every report (column headers say `step time (s)`)."""
RATE_UNIT = "tokens/s"
"""The unit of every throughput, in every report (`throughput (tokens/s)`)."""


def _significant(value: float, digits: int) -> str:
    """`value` with `digits` significant digits, without exponent notation and without trailing noise."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:.{decimals}f}"


def _not_finite(value: float) -> str | None:
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return None


def format_bytes(num_bytes: float, digits: int = 3) -> str:
    """1536 → '1.50 KiB'; 85899345920 → '80.0 GiB'; below 1 KiB plain bytes ('512 B')."""
    special = _not_finite(float(num_bytes))
    if special is not None:
        return special
    size = abs(float(num_bytes))
    for unit, scale in _BYTE_UNITS:
        if size >= scale:
            return f"{_significant(num_bytes / scale, digits)} {unit}"
    return f"{num_bytes:.0f} B"


def format_gib(num_bytes: float, decimals: int = 1) -> str:
    """Always in GiB (for columns that must line up): 85899345920 → '80.0 GiB'."""
    special = _not_finite(float(num_bytes))
    return special if special is not None else f"{num_bytes / GIB:.{decimals}f} GiB"


def format_gib_cell(num_bytes: float, decimals: int = 2, digits: int = 2) -> str:
    """A table cell in a column (or table) whose unit, GiB, is in its header: '60.29', '0.25', '-' for zero.

    Values too small to show with `decimals` decimals keep `digits` significant digits instead of rounding to 0
    (256 KiB → '0.00024'), so every non-zero term stays visible and comparable in the same unit.
    """
    special = _not_finite(float(num_bytes))
    if special is not None:
        return special
    if num_bytes == 0:
        return "-"
    gib = num_bytes / GIB
    if abs(gib) >= 0.5 * 10**-decimals:
        return f"{gib:.{decimals}f}"
    return _significant(gib, digits)


def format_seconds(seconds: float, digits: int = 3) -> str:
    """Always in seconds, `digits` significant digits: 0.0123 → '0.0123 s'; 3.5 → '3.50 s'; 95 → '95.0 s';
    4312 → '4,312 s'."""
    special = _not_finite(float(seconds))
    if special is not None:
        return special
    if seconds == 0:
        return "0 s"
    text = _significant(seconds, digits)
    return f"{float(text):,.{len(text.split('.')[1]) if '.' in text else 0}f} s"


def format_rate(per_second: float, unit: str = RATE_UNIT) -> str:
    """Whole units per second grouped by thousands: 1.25e6 → '1,250,000 tokens/s'; a rate below one keeps 3
    significant digits ('0.125 tokens/s')."""
    special = _not_finite(float(per_second))
    if special is not None:
        return special
    if abs(per_second) < 1:
        return f"{_significant(per_second, 3)} {unit}"
    return f"{per_second:,.0f} {unit}"


def format_tflops(tflops_per_s: float, digits: int = 3) -> str:
    """Achieved FLOP/s per GPU in the unit training logs use (Megatron's 'TFLOP/s/GPU'): 420.4 → '420 TFLOP/s'."""
    special = _not_finite(float(tflops_per_s))
    return special if special is not None else f"{_significant(tflops_per_s, digits)} TFLOP/s"


def format_percent(fraction: float, decimals: int = 1) -> str:
    """0.4234 → '42.3%'."""
    special = _not_finite(float(fraction))
    return special if special is not None else f"{100 * fraction:.{decimals}f}%"


def format_count(count: float, digits: int = 3) -> str:
    """Parameter counts and the like: 70.6e9 → '70.6B', 8.03e9 → '8.03B', 125e6 → '125M'."""
    special = _not_finite(float(count))
    if special is not None:
        return special
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(count) >= scale:
            return f"{_significant(count / scale, digits)}{suffix}"
    return f"{count:.0f}"


# ---- one unit per column ---------------------------------------------------------------------------------------
# A table column shows every value in one unit, named in its header, with as many decimals as it takes to tell
# neighbouring rows apart (a Pareto front's rows all differ, so two rows must never print the same number).

MAX_COLUMN_DECIMALS = 4
"""Decimals a column may grow to while neighbours still print alike (4 decimals of GiB is 0.1 MiB)."""


def column_cells(values: "list[float]", scale: float, digits: int = 3, grouped: bool = False) -> list[str]:
    """`values / scale` as cells of one column: the largest with `digits` significant digits, every other with the
    same decimals, more decimals (up to MAX_COLUMN_DECIMALS beyond) until neighbours that differ print differently;
    a value too small for those decimals keeps 2 significant digits instead of printing 0. `grouped`: thousands
    separated by commas ('2,513,427')."""
    scaled = [v / scale for v in values]
    finite = [abs(v) for v in scaled if math.isfinite(v) and v]
    largest = max(finite, default=0.0)
    decimals = max(0, digits - 1 - math.floor(math.log10(largest))) if largest else 0
    start = decimals

    def cell(value: float, places: int) -> str:
        special = _not_finite(value)
        if special is not None:
            return special
        if value and abs(value) < 0.5 * 10**-places:
            return _significant(value, 2)
        return f"{value:,.{places}f}" if grouped else f"{value:.{places}f}"

    while True:
        cells = [cell(v, decimals) for v in scaled]
        alike = any(a == b and x != y for a, b, x, y in zip(cells, cells[1:], scaled, scaled[1:]))
        if not alike or decimals >= start + MAX_COLUMN_DECIMALS:
            return cells
        decimals += 1


def whole_count(value: float) -> str:
    """A count in a column: digits grouped by thousands ('2,822,400'); a fractional count keeps 3 decimals."""
    special = _not_finite(float(value))
    if special is not None:
        return special
    return f"{int(round(value)):,}" if float(value).is_integer() else f"{value:,.3f}"


def front_columns(points: "list[dict]") -> dict[str, "str | list[str]"]:
    """The front table's step time, throughput and peak memory columns of the document's points, in the fixed
    units: {'time_unit', 'time_scale', 'rate_unit', 'time', 'rate', 'peak_gib'} (cells as strings; nulls print as
    n/a)."""
    def column(key: str) -> list[float]:
        return [p[key] if p[key] is not None else math.nan for p in points]

    return {"time_unit": TIME_UNIT, "time_scale": 1.0, "rate_unit": RATE_UNIT,
            "time": column_cells(column("step_time_s"), 1.0), "rate": rate_cells(column("tokens_per_s")),
            "peak_gib": column_cells(column("peak_memory_bytes"), GIB)}


def rate_cells(tokens_per_s: "list[float]") -> list[str]:
    """A throughput column in RATE_UNIT: whole tokens/s grouped by thousands (decimals only where neighbours would
    print alike)."""
    return column_cells(tokens_per_s, 1.0, digits=1, grouped=True)
