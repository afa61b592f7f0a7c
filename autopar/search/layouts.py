"""Exact search for the best pipeline layout of one structure (costmodels.layout prices a layout).

Three engines over the same integer tables (costmodels.layout.LayoutTables), so they agree exactly:

- `brute_force`: every composition of the decoder layers into the virtual stages, vectorised. The oracle for small
  instances (tests/test_layouts.py compares the other two against it).
- `chain_dp` (vpp = 1): a rank's layers are one contiguous block, so a layout is a chain partition. The objective
  (m − 1)·max_r T_r + Σ_r T_r + max_r E_r is not a plain sum, so the DP runs under thresholds: for a bound B_T on
  every rank's per-microbatch time and B_E on its sync time, a DP over (rank, boundary) in O(pp·L²) finds the
  partition of least Σ T; scanning B_T then B_E upward over the tables' distinct values, and skipping a bound once
  (m − 1)·B_T + (least Σ T under B_T) + B_E cannot beat the best found, is exact: the optimum is met at its own
  maxima, and no partition under a bound sums to less than the least sum under it.
- `cpsat_layout` (any vpp): integer layers per virtual stage; a stage's dense and MoE layers from the boundaries
  (MoE layers before a boundary by integer division: ModelSpec's first-dense/frequency pattern), its time by an
  element constraint on its role's table, a rank's time T_r and largest chunk C_r as sum and max over its chunks,
  its sync and memory by element constraints on the rank tables at its totals, memory by restricting each rank's
  table index to the cells that fit, objective m·max T + Σ C − max C + max E (costmodels.layout). Symmetry: no two
  ranks are interchangeable (each holds its own number of in-flight micro-batches, rank 0 the embedding, the last
  rank the loss); without MoE layers the middle-role chunks of one rank are (a chunk's time reads only its layer
  count and role, the rank its chunks' sum and max), so they are ordered by size. The uniform layout is the hint.

`best_layout` uses the DP without interleaving and CP-SAT with it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from costmodels.layout import LayoutCost, LayoutTables, price_layout, stage_role

BRUTE_FORCE_MAX_LAYOUTS = 2_000_000
"""Refuse brute force over more compositions than this."""
DP_MAX_SOLVES = 4000
"""Threshold pairs the chain DP tries before it hands over to CP-SAT."""


@dataclass(frozen=True)
class LayoutResult:
    best: LayoutCost | None
    """None when no layout fits in memory."""
    engine: str
    elapsed_s: float
    proven_optimal: bool
    layouts_examined: int = 0


# ---- brute force -------------------------------------------------------------------------------------------------

def compositions(total: int, parts: int) -> np.ndarray:
    """All (parts)-tuples of non-negative integers summing to `total`, as rows (stars and bars)."""
    bars = np.array(list(itertools.combinations(range(total + parts - 1), parts - 1)), dtype=np.int64)
    bars = bars.reshape(-1, parts - 1)
    edges = np.concatenate([np.full((len(bars), 1), -1), bars, np.full((len(bars), 1), total + parts - 1)], axis=1)
    return np.diff(edges, axis=1) - 1


def objectives_of(tables: LayoutTables, layouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(step time in ns, fits) of many layouts at once (rows): the integers of costmodels.layout.price_layout."""
    pp, v, m = tables.pp, tables.vpp, tables.microbatches
    stages = pp * v
    bounds = np.concatenate([np.zeros((len(layouts), 1), dtype=np.int64), np.cumsum(layouts, axis=1)], axis=1)
    moe = np.diff(tables.moe_before(bounds), axis=1)
    dense = layouts - moe
    roles = np.array([stage_role(i, stages) for i in range(stages)])[None, :]
    t = tables.stage_time_ns[roles, dense, moe].reshape(len(layouts), v, pp)
    rank_time, largest = t.sum(axis=1), t.max(axis=1)
    rank_dense = dense.reshape(len(layouts), v, pp).sum(axis=1)
    rank_moe = moe.reshape(len(layouts), v, pp).sum(axis=1)
    ranks = np.arange(pp)[None, :]
    e = tables.sync_ns[ranks, rank_dense, rank_moe]
    mem = tables.memory_mib[ranks, rank_dense, rank_moe]
    objective = (m * rank_time.max(axis=1) + largest.sum(axis=1) - largest.max(axis=1) + e.max(axis=1)
                 + tables.p2p_ns)
    return objective, mem.max(axis=1) <= tables.memory_limit_mib


def brute_force(tables: LayoutTables) -> LayoutResult:
    start = time.perf_counter()
    stages = tables.pp * tables.vpp
    count = math.comb(tables.num_layers + stages - 1, stages - 1)
    if count > BRUTE_FORCE_MAX_LAYOUTS:
        raise ValueError(f"{count:,} layouts: too many for brute force (limit {BRUTE_FORCE_MAX_LAYOUTS:,})")
    layouts = compositions(tables.num_layers, stages)
    objective, fits = objectives_of(tables, layouts)
    if not fits.any():
        return LayoutResult(None, "brute force", time.perf_counter() - start, True, len(layouts))
    objective = np.where(fits, objective, np.iinfo(np.int64).max)
    best = int(np.argmin(objective))           # first minimum: ties go to the lexicographically smallest layout
    return LayoutResult(price_layout(tables, tuple(int(x) for x in layouts[best])), "brute force",
                        time.perf_counter() - start, True, len(layouts))


# ---- chain DP (vpp = 1) ------------------------------------------------------------------------------------------

def _block_tables(tables: LayoutTables) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time, sync and fit of rank r holding decoder layers [a, b): arrays [rank, a, b] (a > b: does not fit)."""
    layers = tables.num_layers
    a, b = np.meshgrid(np.arange(layers + 1), np.arange(layers + 1), indexing="ij")
    valid = a <= b
    moe = np.where(valid, tables.moe_before(b) - tables.moe_before(a), 0)
    dense = np.where(valid, b - a, 0) - moe
    ranks = np.arange(tables.pp)[:, None, None]
    roles = np.array([stage_role(r, tables.pp) for r in range(tables.pp)])[:, None, None]
    t = tables.stage_time_ns[roles, dense[None], moe[None]]
    e = tables.sync_ns[ranks, dense[None], moe[None]]
    fits = valid[None] & (tables.memory_mib[ranks, dense[None], moe[None]] <= tables.memory_limit_mib)
    return t, e, fits


def _least_sum(t: np.ndarray, allowed: np.ndarray, with_layout: bool = True) -> tuple[int | None, list[int]]:
    """Least Σ_r t[r, a_r, a_{r+1}] over chain partitions 0 = a_0 <= ... <= a_pp = L using allowed blocks only, and
    the layers per rank of the first such partition (`with_layout` False: the sum only, the list empty)."""
    pp, n, _ = t.shape
    big = np.iinfo(np.int64).max // 4
    blocks = np.where(allowed, t, big)         # a block not allowed costs at least `big`: no partition uses it
    best = np.full(n, big, dtype=np.int64)
    best[0] = 0
    columns = np.arange(n)
    back = []
    for r in range(pp):
        cost = best[:, None] + blocks[r]                               # [a, b]
        if with_layout:
            choice = np.argmin(cost, axis=0)
            best = cost[choice, columns]
            back.append(choice)
        else:
            best = cost.min(axis=0)
        np.minimum(best, big, out=best)        # unreachable stays at `big` (no overflow over many ranks)
    if best[n - 1] >= big:
        return None, []
    if not with_layout:
        return int(best[n - 1]), []
    bounds = [n - 1]
    for r in range(pp - 1, -1, -1):
        bounds.append(int(back[r][bounds[-1]]))
    bounds.reverse()
    return int(best[n - 1]), [bounds[i + 1] - bounds[i] for i in range(pp)]


def chain_dp(tables: LayoutTables) -> LayoutResult:
    assert tables.vpp == 1, "the chain DP is for layouts without interleaving"
    start = time.perf_counter()
    m = tables.microbatches
    t, e, fits = _block_tables(tables)
    least_sum, _ = _least_sum(t, fits, with_layout=False)
    if least_sum is None:
        return LayoutResult(None, "chain DP", time.perf_counter() - start, True)
    e_floor = int(e[fits].min())
    best: LayoutCost | None = None
    solves = 0
    for bound_t in np.unique(t[fits]):
        bound_t = int(bound_t)
        if best is not None and (m - 1) * bound_t + least_sum + e_floor + tables.p2p_ns >= best.objective_ns:
            break
        allowed_t = fits & (t <= bound_t)
        solves += 1
        least_sum_t, _ = _least_sum(t, allowed_t, with_layout=False)      # no partition under this bound sums to less
        if least_sum_t is None:
            continue
        if best is not None and (m - 1) * bound_t + least_sum_t + e_floor + tables.p2p_ns >= best.objective_ns:
            continue
        for bound_e in np.unique(e[allowed_t]):
            bound_e = int(bound_e)
            if best is not None and (m - 1) * bound_t + least_sum_t + bound_e + tables.p2p_ns >= best.objective_ns:
                break
            solves += 1
            if solves > DP_MAX_SOLVES:
                return LayoutResult(best, "chain DP (stopped)", time.perf_counter() - start, False, solves)
            total, layout = _least_sum(t, allowed_t & (e <= bound_e))
            if total is None:
                continue
            cost = price_layout(tables, tuple(layout))
            if best is None or cost.objective_ns < best.objective_ns:
                best = cost
    return LayoutResult(best, "chain DP", time.perf_counter() - start, True, solves)


# ---- CP-SAT ------------------------------------------------------------------------------------------------------

def cpsat_layout(tables: LayoutTables, time_limit_s: float | None = 10.0, hint: tuple[int, ...] | None = None,
                 workers: int = 1, deterministic_limit: float | None = None) -> LayoutResult:
    """The fastest layout that fits, by CP-SAT. `deterministic_limit`: CP-SAT's max_deterministic_time (its own
    work units, about seconds), which with one worker stops at the same point on every run and machine, so the
    layout found is repeatable even when the search is cut short."""
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    pp, v, m, layers = tables.pp, tables.vpp, tables.microbatches, tables.num_layers
    stages = pp * v
    model = cp_model.CpModel()
    x = [model.NewIntVar(0, layers, f"layers_{i}") for i in range(stages)]
    model.Add(sum(x) == layers)
    position = [model.NewConstant(0)]
    for i in range(stages):
        p = model.NewIntVar(0, layers, f"position_{i + 1}")
        model.Add(p == position[-1] + x[i])
        position.append(p)
    # MoE layers before each boundary: max(0, floor(P / f) - floor(k / f)) (params.moe_layers_before)
    if tables.num_moe_layers:
        moe_before = []
        for i, p in enumerate(position):
            q = model.NewIntVar(0, layers, f"q_{i}")
            model.AddDivisionEquality(q, p, tables.moe_freq)
            mb = model.NewIntVar(0, tables.num_moe_layers, f"moe_before_{i}")
            model.AddMaxEquality(mb, [q - tables.moe_first_dense // tables.moe_freq, model.NewConstant(0)])
            moe_before.append(mb)
        moe = [moe_before[i + 1] - moe_before[i] for i in range(stages)]
    else:
        moe = [0] * stages
    width = tables.num_moe_layers + 1
    stage_times = []
    for i in range(stages):
        table = tables.stage_time_ns[stage_role(i, stages)].ravel()
        cell = model.NewIntVar(0, len(table) - 1, f"stage_cell_{i}")
        model.Add(cell == (x[i] - moe[i]) * width + moe[i])
        t_i = model.NewIntVar(0, int(table.max()), f"stage_time_{i}")
        model.AddElement(cell, [int(val) for val in table], t_i)
        stage_times.append(t_i)
    rank_times, largest, syncs = [], [], []
    for r in range(pp):
        chunks = range(r, stages, pp)
        dense_r = sum(x[i] for i in chunks) - sum(moe[i] for i in chunks)
        moe_r = sum(moe[i] for i in chunks)
        feasible = np.flatnonzero(tables.memory_mib[r].ravel() <= tables.memory_limit_mib)
        if not len(feasible):
            return LayoutResult(None, "CP-SAT", time.perf_counter() - start, True)
        index = model.NewIntVarFromDomain(cp_model.Domain.FromValues([int(i) for i in feasible]), f"rank_cell_{r}")
        model.Add(index == dense_r * width + moe_r)
        e_r = model.NewIntVar(0, int(tables.sync_ns[r].max()), f"sync_{r}")
        model.AddElement(index, [int(val) for val in tables.sync_ns[r].ravel()], e_r)
        syncs.append(e_r)
        t_r = model.NewIntVar(0, int(sum(tables.stage_time_ns.max() for _ in chunks)), f"rank_time_{r}")
        model.Add(t_r == sum(stage_times[i] for i in chunks))
        c_r = model.NewIntVar(0, int(tables.stage_time_ns.max()), f"largest_chunk_{r}")
        model.AddMaxEquality(c_r, [stage_times[i] for i in chunks])
        rank_times.append(t_r)
        largest.append(c_r)
    if not tables.num_moe_layers:
        # symmetry breaking: without MoE layers a chunk's time depends on its layer count and role alone, and a rank
        # on the sum and max of its chunks, so the middle-role chunks of a rank are interchangeable: order them
        for r in range(pp):
            chunks = [i for i in range(r, stages, pp) if stage_role(i, stages) == 1]
            for a, b in zip(chunks, chunks[1:]):
                model.Add(x[a] >= x[b])
    t_max = model.NewIntVar(0, int(tables.stage_time_ns.max()) * v, "rank_time_max")
    c_max = model.NewIntVar(0, int(tables.stage_time_ns.max()), "largest_chunk_max")
    e_max = model.NewIntVar(0, int(tables.sync_ns.max()), "sync_max")
    model.AddMaxEquality(t_max, rank_times)
    model.AddMaxEquality(c_max, largest)
    model.AddMaxEquality(e_max, syncs)
    model.Minimize(m * t_max + sum(largest) - c_max + e_max)
    if hint is not None:
        for var, value in zip(x, hint):
            model.AddHint(var, int(value))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = time_limit_s
    if deterministic_limit is not None:
        solver.parameters.max_deterministic_time = deterministic_limit
    status = solver.Solve(model)
    elapsed = time.perf_counter() - start
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return LayoutResult(None, "CP-SAT", elapsed, status == cp_model.INFEASIBLE)
    layout = tuple(int(solver.Value(var)) for var in x)
    cost = price_layout(tables, layout)
    # the encoding must price a layout as price_layout does: checked on the returned solution's own values (the
    # objective value CP-SAT reports for an incumbent cut off by a time limit was seen to differ from that solution's)
    encoded_ns = m * solver.Value(t_max) + sum(solver.Value(c) for c in largest) - solver.Value(c_max) \
        + solver.Value(e_max)
    assert cost.objective_ns == encoded_ns + tables.p2p_ns, "CP-SAT's encoding disagrees with the layout's price"
    return LayoutResult(cost, "CP-SAT", elapsed, status == cp_model.OPTIMAL)


def best_layout(tables: LayoutTables, time_limit_s: float | None = 10.0, hint: tuple[int, ...] | None = None,
                deterministic_limit: float | None = None) -> LayoutResult:
    """The fastest layout that fits: the chain DP without interleaving (CP-SAT if the DP stops early), CP-SAT
    with it (limits: cpsat_layout)."""
    if tables.vpp == 1:
        result = chain_dp(tables)
        if result.proven_optimal:
            return result
    return cpsat_layout(tables, time_limit_s=time_limit_s, hint=hint, deterministic_limit=deterministic_limit)
