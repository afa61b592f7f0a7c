"""Evaluate functions of the structure knobs once per structure, not once per plan.

A search enumerates plans as a product: a table of distinct *structures* (pp and its split, tp, cp, vpp, ep, etp,
zero) times the detail knobs (mbs, sp, recompute). Much of the cost model reads the structure knobs alone: the
layers on a stage, its MoE layers, its parameters, the gradient-sync traffic, the optimizer step. When a
`PlanArrays` carries a `StructureIndex` (plan i has the structure of row index[i] of `base`), those functions are
evaluated on the structure table once per search and gathered with `index`; without one they run as written. The
values are the same either way: each is an elementwise numpy expression of the plan's own knobs, so evaluating it on
the structure's row and copying the result is bit-for-bit the value computed on the plan itself.

A function that takes a pipeline rank can only be shared when the rank is a function of the structure too: an
integer, or one of the candidate-rank arrays made by `stage_list` (steptime.candidate_stages,
memory.candidate_worst_stages), which the index knows by identity. Any other rank array is evaluated directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

# costmodels.plan imports this module, so `PlanArrays` is only a name in the annotations here (no import back)

STRUCTURE_FIELDS: tuple[str, ...] = ("tp", "pp", "vpp", "cp", "ep", "etp", "zero", "first_stage_layers",
                                     "last_stage_layers")
"""The Plan fields a structure fixes; the functions shared through `per_structure` read no others."""


@dataclass(frozen=True, eq=False)
class StructureIndex:
    """Plan i has the structure of `base` row `index[i]`. `cache` holds values computed on `base` (shared by every
    subset of the same plans: one search); `roles` names the candidate-rank arrays handed out for these plans (and
    holds the per_knobs codes of these plans)."""

    base: "PlanArrays"
    index: np.ndarray
    cache: dict = field(default_factory=dict)
    roles: dict = field(default_factory=dict)

    def take(self, rows: "np.ndarray | slice") -> "StructureIndex":
        return StructureIndex(base=self.base, index=self.index[rows], cache=self.cache)


def link(plans: "PlanArrays", base: "PlanArrays", index: np.ndarray, cache: dict | None = None) -> "PlanArrays":
    """`plans` carrying the structure index (the base holds the structure knobs; its other knobs are unused)."""
    return replace(plans, structure=StructureIndex(base=base, index=index, cache=cache if cache is not None else {}))


def _gather(value: Any, index: np.ndarray) -> Any:
    if isinstance(value, dict):
        return {k: _gather(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_gather(v, index) for v in value)
    if isinstance(value, list):
        return [_gather(v, index) for v in value]
    if np.ndim(value) == 0:
        return value
    return value[index]


def _stage_on_base(plans: "PlanArrays", stage: Any) -> tuple[Any, Any] | None:
    """(cache key, the same rank on the base table) for a rank the structure determines; None otherwise."""
    if stage is None:
        return (), None
    if isinstance(stage, (int, np.integer)):
        return ("rank", int(stage)), int(stage)
    role = plans.structure.roles.get(id(stage))
    if role is None or role[0] is not stage:
        return None
    list_key, j = role[1]
    return (list_key, j), plans.structure.cache[list_key][j]


def per_structure(plans: "PlanArrays", key: tuple, fn: Callable[..., Any], stage: Any = None) -> Any:
    """fn(plans) (or fn(plans, stage)) for a function of the structure knobs alone, shared across plans of equal
    structure when `plans` carries a StructureIndex. `key` names the function and its non-plan arguments."""
    call = (lambda p, s: fn(p)) if stage is None else fn
    if getattr(plans, "structure", None) is None:      # also a single Plan

        return call(plans, stage)
    on_base = _stage_on_base(plans, stage)
    if on_base is None:
        return call(plans, stage)
    stage_key, base_stage = on_base
    full_key = key + stage_key
    cache = plans.structure.cache
    if full_key not in cache:
        cache[full_key] = call(plans.structure.base, base_stage)
    return _gather(cache[full_key], plans.structure.index)


def stage_list(plans: "PlanArrays", key: tuple, fn: Callable[["PlanArrays"], list]) -> list:
    """A list of per-plan rank arrays that depends on the structure alone (candidate ranks), registered so the
    functions of (structure, rank) can be shared for each of them."""
    if getattr(plans, "structure", None) is None:
        return fn(plans)
    cache = plans.structure.cache
    if key not in cache:
        cache[key] = fn(plans.structure.base)
    stages = _gather(cache[key], plans.structure.index)
    for j, stage in enumerate(stages):
        plans.structure.roles[id(stage)] = (stage, (key, j))
    return stages


def _dense(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Values (small non-negative integers) renumbered 0..k-1 in increasing order, and k."""
    present = np.zeros(int(values.max(initial=0)) + 1, dtype=bool)
    present[values] = True
    rank = np.cumsum(present) - 1
    return rank[values], int(present.sum())


MAX_CODE_TABLE = 1 << 24
"""Largest code range `per_knobs` indexes with a table; beyond it, it sorts."""


def _codes(plans: "PlanArrays", knobs: tuple[str, ...]) -> tuple[np.ndarray, int] | None:
    """An int64 code per plan, equal exactly for plans that agree on `knobs`, and the code range (None when the
    knob values are not small non-negative integers)."""
    link = plans.structure
    structural = tuple(k for k in knobs if k in STRUCTURE_FIELDS)
    cache_key = ("structure_codes", structural)
    if cache_key not in link.cache:
        row_code, bound = np.zeros(len(link.base), dtype=np.int64), 1
        for knob in structural:        # mixed radix over each column's distinct values: one int64 per row
            dense, count = _dense(np.asarray(getattr(link.base, knob), dtype=np.int64))
            if bound * count > 2**62:  # renumber the rows seen so far before the code could overflow
                _, row_code = np.unique(row_code, return_inverse=True)
                row_code, bound = row_code.reshape(-1).astype(np.int64), len(link.base)
            row_code, bound = row_code * count + dense, bound * count
        _, inverse = np.unique(row_code, return_inverse=True)
        link.cache[cache_key] = inverse.reshape(-1).astype(np.int64)
    code, bound = _dense(link.cache[cache_key][link.index])
    for knob in knobs:
        if knob in STRUCTURE_FIELDS:
            continue
        values = np.asarray(getattr(plans, knob), dtype=np.int64)
        low, high = int(values.min(initial=0)), int(values.max(initial=0))
        if low < 0 or high > MAX_CODE_TABLE or bound > 2**62 // (high + 1):
            return None
        code, bound = code * (high + 1) + values, bound * (high + 1)
    return code, bound


def _first_and_inverse(code: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first plan of each distinct code (in plan order) and, per plan, the position of its code's
    first plan among them."""
    if bound > MAX_CODE_TABLE:
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    n = len(code)
    table = np.empty(bound, dtype=np.int64)
    table[code[::-1]] = np.arange(n - 1, -1, -1, dtype=np.int64)     # the last write is the first occurrence
    first_of = table[code]
    first = np.flatnonzero(first_of == np.arange(n))
    position = np.empty(n, dtype=np.int64)
    position[first] = np.arange(len(first))
    return first, position[first_of]


def per_knobs(plans: "PlanArrays", knobs: tuple[str, ...], fn: Callable[["PlanArrays"], Any]) -> Any:
    """fn(plans) for a function that reads only `knobs` of each plan, evaluated once per distinct combination of
    their values and copied to the plans that share it (when `plans` carries a StructureIndex; else directly)."""
    columns = {f.name for f in fields(plans)} - {"structure"}
    if getattr(plans, "structure", None) is None or len(plans) == 0 or columns <= set(knobs):
        return fn(plans)
    known = plans.structure.roles
    if ("codes", knobs) not in known:
        known[("codes", knobs)] = _codes(plans, knobs)
    coded = known[("codes", knobs)]
    if coded is None:
        return fn(plans)
    first, inverse = _first_and_inverse(*coded)
    if len(first) == len(plans):
        return fn(plans)
    return _gather(fn(plans.take(first)), inverse)
