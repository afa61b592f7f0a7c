"""Unit constants and the rounding that turns a cost-model float into the number a document shows.

Base units everywhere inside (bytes, seconds, FLOP/s, DESIGN.md §4); these are the only conversions, and formatting
for people (GiB with decimals, '70.6B') lives in autopar/report/units.py.
"""

from __future__ import annotations

import math

GIB = 1024**3
"""Bytes in a GiB."""


def whole_number(value: float) -> "int | float":
    """An integral count as an int (JSON '512', not '512.0'); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def whole_bytes(value: float) -> "int | float":
    """Bytes rounded to a whole byte, as an int; non-finite values unchanged (reports turn them into null)."""
    return int(round(value)) if math.isfinite(value) else value
