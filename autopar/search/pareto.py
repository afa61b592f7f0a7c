"""The (step time, peak memory) Pareto front over integer objective vectors, with the documented tie-break.

Both solvers compare plans on the same integer objectives (`autopar.search.objective`): step time in whole
microseconds and peak memory in whole MiB. A plan is on the front when no other plan is at least as good on both
and better on one; among plans with equal vectors the one first in `space.TIE_BREAK_ORDER` is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autopar.search.space import tie_break_key


def front_indices(time_units: np.ndarray, memory_units: np.ndarray, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Indices of the non-dominated rows, fastest first (one row per distinct objective vector)."""
    if len(time_units) == 0:
        return np.zeros(0, dtype=np.int64)
    keys = tie_break_key(columns)
    order = np.lexsort(tuple(keys) + (np.asarray(memory_units), np.asarray(time_units)))
    memory_sorted = np.asarray(memory_units)[order]
    best_before = np.concatenate(([np.iinfo(np.int64).max], np.minimum.accumulate(memory_sorted)[:-1]))
    return order[memory_sorted < best_before]


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a is at least as good as b on both objectives and better on one (lower is better)."""
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])
