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

The plans of one search are also a product on the other side: structure row × *detail* row (mbs, sp, recompute and
its layers and modules). When the index knows each plan's detail row too (`detail` and `detail_index`), `per_knobs`
with a `key` keeps a function of a few knobs (a layer's times, a layer's collectives) for the whole search: its
values live on the grid (distinct structure values of those knobs) × (distinct detail values), each cell evaluated
the first time a plan needs it, so a combination that recurs in every batch of the search is priced once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
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
    holds the per_knobs codes of these plans). Optionally plan i also has the detail knobs of row `detail_index[i]`
    of `detail` (columns of the knobs outside STRUCTURE_FIELDS, one row per detail combination of the search)."""

    base: "PlanArrays"
    index: np.ndarray
    cache: dict = field(default_factory=dict)
    roles: dict = field(default_factory=dict)
    detail: "dict[str, np.ndarray] | None" = None
    detail_index: "np.ndarray | None" = None

    def take(self, rows: "np.ndarray | slice") -> "StructureIndex":
        return StructureIndex(base=self.base, index=self.index[rows], cache=self.cache, detail=self.detail,
                              detail_index=None if self.detail_index is None else self.detail_index[rows])


def link(plans: "PlanArrays", base: "PlanArrays", index: np.ndarray, cache: dict | None = None,
         detail: "dict[str, np.ndarray] | None" = None, detail_index: np.ndarray | None = None) -> "PlanArrays":
    """`plans` carrying the structure index (the base holds the structure knobs; its other knobs are unused), and
    with `detail` the detail row of each plan (`detail_index`)."""
    return replace(plans, structure=StructureIndex(base=base, index=index, cache=cache if cache is not None else {},
                                                   detail=detail, detail_index=detail_index))


def _gather(value: Any, index: np.ndarray) -> Any:
    if isinstance(value, dict):
        return {k: _gather(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_gather(v, index) for v in value)
    if isinstance(value, list):
        return [_gather(v, index) for v in value]
    if is_dataclass(value):
        return replace(value, **{f.name: _gather(getattr(value, f.name), index) for f in fields(value)})
    if value is None or np.ndim(value) == 0:
        return value
    return take_rows(value, index)


def take_rows(values: Any, index: Any) -> Any:
    """values[index]; for a plain 1-D array and integer indices by ndarray.take, the same values about a third
    faster (the gathers of a search)."""
    if type(values) is np.ndarray and values.ndim == 1 and isinstance(index, np.ndarray) and index.dtype.kind in "iu":
        return values.take(index)
    return values[index]


def _scatter(store: Any, value: Any, at: np.ndarray, size: int) -> Any:
    """`store` (values on a grid of `size` cells; None: not made yet) with `value` (one entry per cell of `at`)
    written to those cells; the same nesting as `_gather` reads. A scalar leaf is stored as an array."""
    if isinstance(value, dict):
        return {k: _scatter(None if store is None else store[k], v, at, size) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        parts = [_scatter(None if store is None else store[i], v, at, size) for i, v in enumerate(value)]
        return tuple(parts) if isinstance(value, tuple) else parts
    if is_dataclass(value):
        return replace(value, **{f.name: _scatter(None if store is None else getattr(store, f.name),
                                                  getattr(value, f.name), at, size) for f in fields(value)})
    if value is None:
        return None
    value = np.asarray(value)
    if store is None:
        store = np.zeros(size, dtype=value.dtype)
    store[at] = np.broadcast_to(value, at.shape)
    return store


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


def per_structure(plans: "PlanArrays", key: tuple, fn: Callable[..., Any], stage: Any = None,
                  knobs: tuple[str, ...] | None = None) -> Any:
    """fn(plans) (or fn(plans, stage)) for a function of the structure knobs alone, shared across plans of equal
    structure when `plans` carries a StructureIndex. `key` names the function and its non-plan arguments. With
    `knobs` (the structure fields fn and the rank read), it is evaluated once per distinct combination of those
    among the structures (e.g. not once per vpp for a function that does not read vpp)."""
    call = (lambda p, s: fn(p)) if stage is None else fn
    if getattr(plans, "structure", None) is None:      # also a single Plan

        return call(plans, stage)
    on_base = _stage_on_base(plans, stage)
    if on_base is None:
        return call(plans, stage)
    stage_key, base_stage = on_base
    full_key = key + stage_key
    link = plans.structure
    if full_key not in link.cache:
        base = _base_view(link)
        if knobs is None:
            link.cache[full_key] = call(base, base_stage)
        else:
            code = _structure_codes(link, tuple(k for k in STRUCTURE_FIELDS if k in knobs))
            first, inverse = _first_and_inverse(code, int(code.max(initial=-1)) + 1)
            at = base_stage if base_stage is None or np.ndim(base_stage) == 0 else base_stage[first]
            link.cache[full_key] = _gather(call(base.take(first), at), inverse)
    return _gather(link.cache[full_key], link.index)


def _base_view(link: StructureIndex) -> "PlanArrays":
    """The base table linked to itself (index 0..n-1, the same cache), kept for the search: a shared function
    evaluated on the base reaches the others it calls through the cache too (layers_on_stage computes
    layers_per_middle_stage once per search, not once per caller). Its roles know the base's candidate-rank
    arrays, so the functions of (structure, rank) called with them are shared as well."""
    if ("base_view",) not in link.cache:
        base_roles: dict = {}
        link.cache[("base_roles",)] = base_roles
        link.cache[("base_view",)] = replace(link.base, structure=StructureIndex(
            base=link.base, index=np.arange(len(link.base)), cache=link.cache, roles=base_roles))
    return link.cache[("base_view",)]


def stage_list(plans: "PlanArrays", key: tuple, fn: Callable[["PlanArrays"], list]) -> list:
    """A list of per-plan rank arrays that depends on the structure alone (candidate ranks), registered so the
    functions of (structure, rank) can be shared for each of them."""
    if getattr(plans, "structure", None) is None:
        return fn(plans)
    cache = plans.structure.cache
    if key not in cache:
        cache[key] = fn(plans.structure.base)
        base_roles = _base_view(plans.structure).structure.roles
        for j, stage in enumerate(cache[key]):
            base_roles[id(stage)] = (stage, (key, j))
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


def _table_codes(columns: list[np.ndarray], rows: int) -> tuple[np.ndarray, int]:
    """Per row, a dense code (0..k-1) equal exactly for rows that agree on every column, and k."""
    row_code, bound = np.zeros(rows, dtype=np.int64), 1
    for column in columns:            # mixed radix over each column's distinct values: one int64 per row
        if len(column) and 0 <= column.min() and column.max() <= MAX_CODE_TABLE:
            dense, count = _dense(column)
        else:
            values, dense = np.unique(column, return_inverse=True)
            dense, count = dense.reshape(-1), len(values)
        if bound * count > 4 * rows:      # renumber the rows seen so far: the code stays a small table index
            row_code, bound = _dense(row_code)
        row_code, bound = row_code * count + dense, bound * count
    return _dense(row_code) if rows else (row_code, 0)


def _structure_codes(link: StructureIndex, structural: tuple[str, ...]) -> np.ndarray:
    """Per base row, the dense code of its values of the `structural` knobs (kept for the search)."""
    cache_key = ("structure_codes", structural)
    if cache_key not in link.cache:
        columns = [np.asarray(getattr(link.base, knob), dtype=np.int64) for knob in structural]
        link.cache[cache_key] = _table_codes(columns, len(link.base))[0]
    return link.cache[cache_key]


def _codes(plans: "PlanArrays", knobs: tuple[str, ...]) -> tuple[np.ndarray, int] | None:
    """An int64 code per plan, equal exactly for plans that agree on `knobs`, and the code range (None when the
    knob values are not small non-negative integers). Each knob's values are renumbered densely before they join the
    code, and the code itself whenever its range passes the plan count, so the range stays near the number of
    distinct combinations (a small table for `_first_and_inverse`, not one spanning every possible value)."""
    link = plans.structure
    grid = _grid_codes(link, knobs)
    if grid is not None:               # the detail rows are known: one code per plan from two table look-ups
        structure_code, detail_code, detail_count = grid
        code, bound = _dense(structure_code[link.index])
        code, bound = code * detail_count + detail_code[link.detail_index], bound * detail_count
        return _dense(code) if bound > max(len(plans), 1) else (code, bound)
    structural = tuple(k for k in knobs if k in STRUCTURE_FIELDS)
    code, bound = _dense(_structure_codes(link, structural)[link.index])
    for knob in knobs:
        if knob in STRUCTURE_FIELDS:
            continue
        values = np.asarray(getattr(plans, knob), dtype=np.int64)
        if int(values.min(initial=0)) < 0 or int(values.max(initial=0)) > MAX_CODE_TABLE:
            return None
        dense, count = _dense(values)
        code, bound = code * count + dense, bound * count
        if bound > max(len(plans), 1):
            code, bound = _dense(code)
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


MEMO_MAX_CELLS = 1 << 18
"""Largest grid `per_knobs` keeps values on for a whole search (2 MB per float64 array of the function's result;
a layer's times and collectives on the largest MoE spaces fill ~70k cells); beyond it, it deduplicates within each
batch only."""


@dataclass
class _Memo:
    """Values of one function on the grid (structure code × detail code) of its knobs, each cell evaluated the first
    time a plan needs it; `done` marks those. Lives in StructureIndex.cache: one search."""

    structure_code: np.ndarray
    """Per base row: the dense code of its values of the function's structure knobs."""
    detail_code: np.ndarray
    """Per detail row: the dense code of its values of the function's detail knobs."""
    detail_count: int
    done: np.ndarray
    values: Any = None


def _grid_codes(link: StructureIndex, knobs: tuple[str, ...]) -> "tuple[np.ndarray, np.ndarray, int] | None":
    """(per base row, the dense code of its `knobs` among the structure fields; per detail row, the dense code of its
    other `knobs`; the number of those), kept for the search; None without detail rows or when a knob is in
    neither table."""
    if link.detail is None or link.detail_index is None:
        return None
    cache_key = ("grid_codes", knobs)
    if cache_key not in link.cache:
        structural = tuple(k for k in knobs if k in STRUCTURE_FIELDS)
        detailed = tuple(k for k in knobs if k not in STRUCTURE_FIELDS)
        codes = None
        if all(k in link.detail for k in detailed):
            rows = len(next(iter(link.detail.values()))) if link.detail else 1
            detail_code, detail_count = _table_codes([np.asarray(link.detail[k], dtype=np.int64) for k in detailed],
                                                     rows)
            codes = (_structure_codes(link, structural), detail_code, detail_count)
        link.cache[cache_key] = codes
    return link.cache[cache_key]


def _memo(plans: "PlanArrays", key: tuple, knobs: tuple[str, ...]) -> "_Memo | None":
    """The search-wide memo of `key` over `knobs` (made on first use); None when the plans carry no detail rows,
    a knob is in neither table, or the grid would pass MEMO_MAX_CELLS."""
    link = plans.structure
    cache_key = ("per_knobs_memo", key, knobs)
    if cache_key not in link.cache:
        codes, memo = _grid_codes(link, knobs), None
        if codes is not None:
            structure_code, detail_code, detail_count = codes
            cells = (int(structure_code.max(initial=0)) + 1) * detail_count
            if cells <= MEMO_MAX_CELLS:
                memo = _Memo(structure_code=structure_code, detail_code=detail_code, detail_count=detail_count,
                             done=np.zeros(cells, dtype=bool))
        link.cache[cache_key] = memo
    return link.cache[cache_key]


def _memoised(plans: "PlanArrays", memo: _Memo, fn: Callable[["PlanArrays"], Any]) -> Any:
    """fn(plans) through the memo: the cells no earlier batch needed are evaluated now (one plan each)."""
    link = plans.structure
    cell = memo.structure_code[link.index] * memo.detail_count + memo.detail_code[link.detail_index]
    new = ~memo.done[cell]
    if new.any():
        rows = np.flatnonzero(new)
        cells, first = np.unique(cell[rows], return_index=True)
        memo.values = _scatter(memo.values, fn(plans.take(rows[first])), cells, len(memo.done))
        memo.done[cells] = True
    return _gather(memo.values, cell)


def per_knobs(plans: "PlanArrays", knobs: tuple[str, ...], fn: Callable[["PlanArrays"], Any],
              key: tuple | None = None) -> Any:
    """fn(plans) for a function that reads only `knobs` of each plan, evaluated once per distinct combination of
    their values and copied to the plans that share it (when `plans` carries a StructureIndex; else directly).
    With a `key` (naming the function and its non-plan arguments) and detail rows in the index, the values are kept
    for the whole search: each combination is evaluated once per search, not once per batch."""
    columns = {f.name for f in fields(plans)} - {"structure"}
    if getattr(plans, "structure", None) is None or len(plans) == 0 or columns <= set(knobs):
        return fn(plans)
    if key is not None:
        memo = _memo(plans, key, knobs)
        if memo is not None:
            return _memoised(plans, memo, fn)
    known = plans.structure.roles
    distinct_over = known.get("distinct_over")        # set when these plans are one per combination of some knobs
    if distinct_over is not None and distinct_over <= set(knobs):
        return fn(plans)
    if ("codes", knobs) not in known:
        known[("codes", knobs)] = _codes(plans, knobs)
    coded = known[("codes", knobs)]
    if coded is None:
        return fn(plans)
    first, inverse = _first_and_inverse(*coded)
    if len(first) == len(plans):
        return fn(plans)
    distinct = plans.take(first)
    distinct.structure.roles["distinct_over"] = frozenset(knobs)
    return _gather(fn(distinct), inverse)
