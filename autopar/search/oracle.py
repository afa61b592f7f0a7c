"""The oracle: enumerate every candidate plan, apply the rules, evaluate the float cost model, keep the front.

Simple and exact; the reference every solver test compares against. Enumeration runs in two levels so memory stays
bounded: first the product of the structural knobs (pp split, tp, cp, vpp, ep, etp, zero) filtered by the rules
that read only those and by memory: the memory groups that depend on these knobs alone (weights, gradients,
optimizer states, ZeRO buffers, fixed overheads) are a lower bound on the peak, so a structure whose bound is over
the limit cannot fit whatever the rest. Then, chunk by chunk, each surviving structure times (mbs, sp, recompute),
all rules applied, the cost model evaluated on what remains, and a running front kept.

What makes it fast without changing a number (costmodels.structure): a function of the structure knobs is evaluated
once per structure of the search, a function of a few knobs (one layer's times and collectives) once per distinct
combination of them in the search, the per-stage pieces once per distinct plan in a chunk (plans differing only in
zero share them). And the time is priced in two steps: first a lower bound on the whole (the pipelined part without
the host timeline, and the gradient sync as if its compute windows were endless: objective.time_bound_units); a
plan the running front already strictly dominates on that bound can be on no front, so the rest of its time (the
host timeline, the gradient sync, p2p, the optimizer) is never priced. The plans left (a few hundred a batch of
half a million) are priced a few batches at a time, the likeliest front points first (`price_into_front`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from autopar.search import objective, processes
from autopar.search.pareto import front_indices
from autopar.search.space import SearchSpace, mixed_radix, plan_arrays
from costmodels.plan import PLAN_FIELDS, PlanArrays
from costmodels.rules import Problem, Rule, structural_mask
from costmodels.structure import STRUCTURE_FIELDS, link as structure_link

CHUNK_PLANS = 500_000
"""Plans evaluated at once (bounds the oracle's memory to a few hundred MB). Each batch has a fixed cost (its
structures' links, the cost model's calls, tens of milliseconds), so fewer, larger batches are faster."""
TIME_LIMITED_CHUNK_PLANS = 50_000
"""The first batch under a time limit, which is checked between batches: small enough that a limit of a fraction of
a second stops a search of a few million plans. The next are sized from the last one's pace (`chunk_spans`)."""
CHECKS_PER_LIMIT = 20
"""Under a time limit, a batch is sized to take about this fraction of it (between TIME_LIMITED_CHUNK_PLANS and
CHUNK_PLANS plans)."""

STRUCTURE_KNOBS = ("split", "tp", "cp", "vpp", "ep", "etp", "zero")
DETAIL_KNOBS = ("mbs", "sp", "recompute")


@dataclass(frozen=True)
class OracleResult:
    plans: PlanArrays
    """The front's plans, fastest first."""
    time_units: np.ndarray
    memory_units: np.ndarray
    space_size: int
    valid_plans: int
    """Plans that pass every rule but memory."""
    fitting_plans: int
    complete: bool
    """False when the time budget ran out before every plan was seen."""
    elapsed_s: float
    plans_seen: int


def _level_knobs(space: SearchSpace, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in names if k == "split" or k == "recompute" or k in space.domains)


def _covered(rule: Rule, knobs: set[str]) -> bool:
    return set(rule.knobs) <= knobs


def structures(space: SearchSpace, problem: Problem, rules: tuple[Rule, ...], enforce_memory: bool = False
               ) -> dict[str, np.ndarray]:
    """Columns of every structure (split, tp, cp, vpp, ep, etp, zero) that passes the rules reading only those
    knobs and, with `enforce_memory`, the memory lower bound of the groups that read only those knobs."""
    # the product is built one factor at a time (earlier factors the major digits, as a mixed-radix count), each
    # rule applied as soon as the knobs it reads are present, so no structure a rule rejects is expanded further
    columns: dict[str, np.ndarray] = {}
    count = 1
    pending = [r for r in rules if r.id != "memory"]
    for name, table in space.factors(_level_knobs(space, STRUCTURE_KNOBS)):
        rows = np.repeat(np.arange(count), len(table))
        columns = {k: v[rows] for k, v in columns.items()}
        columns.update(space.columns_from_factors([(name, table)], [np.tile(np.arange(len(table)), count)]))
        count = len(rows)
        ready = [r for r in pending if _covered(r, set(columns))]
        pending = [r for r in pending if r not in ready]
        if ready and count:
            mask = structural_mask(problem, plan_arrays(columns), ready)
            columns = {k: v[mask] for k, v in columns.items()}
            count = int(mask.sum())
    knobs = set(columns)
    if enforce_memory and any(r.id == "memory" for r in rules) and len(columns["tp"]):
        structure = objective.objective_structure(problem.model, problem.cluster, problem.training)
        # linked to themselves as the base, the structures share what the memory terms compute from the same
        # knobs, and each memory group is evaluated once per distinct value of the knobs it reads
        candidates = plan_arrays(columns)
        candidates = structure_link(candidates, candidates, np.arange(len(candidates)))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            bound = objective.memory_units_by_group(structure, problem.model, problem.cluster, problem.training,
                                                    candidates, within=knobs)
        fits = bound <= objective.memory_limit_units(problem.cluster.memory_limit_bytes)
        columns = {k: v[fits] for k, v in columns.items()}
    return columns


def solve_oracle(space: SearchSpace, problem: Problem, rules: tuple[Rule, ...], *,
                 time_budget_s: float | None = None, enforce_memory: bool = True,
                 progress: "Callable[[float], None] | None" = None, jobs: int | None = None) -> OracleResult:
    """The exhaustive search. `progress(fraction)` is called after each chunk of structures (for a progress bar).
    `time_budget_s`: stop at the first batch boundary past it once a plan that fits has been found. `jobs`: worker
    processes (None: as many as `processes.usable_processes` allows); a search without a time budget and of at
    least PROCESS_MIN_PLANS candidates shares its batches out among them (`search_in_processes`), the same front."""
    start = time.perf_counter()
    search = BatchSearch.of(space, problem, rules, enforce_memory)
    front = RunningFront()
    n_structures = search.n_structures
    workers = processes.usable_processes(jobs) if time_budget_s is None else 1
    if workers > 1 and n_structures * search.per_structure >= PROCESS_MIN_PLANS:
        tally = search_in_processes(search, front, workers, progress)
    else:
        def stop() -> bool:
            # a time limit stops the search once it has a plan that fits (the front so far), never before: a
            # search that finds none runs on to say why nothing fits
            found = len(front.time_units) or search.pending.rows
            return time_budget_s is not None and bool(found) and time.perf_counter() - start > time_budget_s

        def done(s0: int, s1: int) -> None:
            if progress is not None:
                progress(s1 / max(n_structures, 1))

        tally = search.run(chunk_spans(n_structures, search.per_structure, time_budget_s), front, stop, done)
    return OracleResult(plans=plan_arrays(front.columns) if len(front.time_units) else _empty_plans(),
                        time_units=front.time_units, memory_units=front.memory_units, space_size=space.size,
                        valid_plans=tally.valid, fitting_plans=tally.fitting, complete=tally.complete,
                        elapsed_s=time.perf_counter() - start, plans_seen=tally.seen)


PROCESS_MIN_PLANS = 2_000_000
"""Candidate plans (structures × detail rows) from which a search shares its batches among processes: below it the
search takes a second or less, and a fork and the results' way back would be a visible share of it."""


@dataclass
class Tally:
    """What a search counted over its batches."""

    valid: int = 0
    """Plans that pass every rule but memory."""
    fitting: int = 0
    seen: int = 0
    """Plans enumerated (structures × detail rows), before any rule."""
    complete: bool = True
    """False when a time budget stopped the search before its last batch."""

    def add(self, other: "Tally") -> None:
        self.valid += other.valid
        self.fitting += other.fitting
        self.seen += other.seen
        self.complete = self.complete and other.complete


@dataclass
class BatchSearch:
    """Everything the search's batches read, built once before the first: the structures that pass the rules
    reading only structure knobs (and their memory lower bound), the detail factors and their rule tables, and the
    caches of structure-only values (`shared`) the batches fill as they go."""

    problem: Problem
    space: SearchSpace
    structure: "objective.ObjectiveStructure"
    base: dict[str, np.ndarray]
    base_plans: "PlanArrays | None"
    detail: list
    per_structure: int
    """Detail rows (mbs × sp × recompute values) per structure."""
    digits: list
    detail_table: "dict[str, np.ndarray] | None"
    tables: list[np.ndarray]
    product_rules: list[Rule]
    limit_units: int
    use_memory: bool
    shared: dict = field(default_factory=dict)
    pending: "Pending" = field(default_factory=lambda: Pending())

    @classmethod
    def of(cls, space: SearchSpace, problem: Problem, rules: tuple[Rule, ...], enforce_memory: bool
           ) -> "BatchSearch":
        base = structures(space, problem, rules, enforce_memory=enforce_memory)
        n_structures = len(next(iter(base.values())))
        detail = space.factors(_level_knobs(space, DETAIL_KNOBS))
        detail_sizes = [len(t) for _, t in detail]
        per_structure = math.prod(detail_sizes)
        tables, product_rules = detail_tables(space, base, detail, problem, rules)
        digits = mixed_radix(detail_sizes, 0, per_structure) if per_structure else []
        return cls(problem=problem, space=space,
                   structure=objective.objective_structure(problem.model, problem.cluster, problem.training),
                   base=base, base_plans=plan_arrays(base) if n_structures else None, detail=detail,
                   per_structure=per_structure, digits=digits,
                   detail_table=_detail_table(space, detail, digits) if per_structure else None,
                   tables=tables, product_rules=product_rules,
                   limit_units=objective.memory_limit_units(problem.cluster.memory_limit_bytes),
                   use_memory=enforce_memory and any(r.id == "memory" for r in rules))

    @property
    def n_structures(self) -> int:
        return len(next(iter(self.base.values())))

    def run(self, spans: "Iterable[tuple[int, int]]", front: "RunningFront", stop: Callable[[], bool] = lambda: False,
            done: Callable[[int, int], None] = lambda s0, s1: None) -> Tally:
        """Search the structures of `spans` (batches of structure indices) into `front`, pricing what waits at the
        end. `stop()` is asked before each batch (a time budget); `done(s0, s1)` after each."""
        tally = Tally()
        for s0, s1 in spans:
            if stop():
                tally.complete = False
                break
            self.batch(s0, s1, front, tally)
            done(s0, s1)
        if self.pending.rows:
            price_into_front(front, self.structure, self.problem, *self.pending.pop())
        return tally

    def batch(self, s0: int, s1: int, front: "RunningFront", tally: Tally) -> None:
        """One batch: structures s0..s1 times every detail row, the rules, memory, and the time bound against the
        running front; the plans past it wait in `pending`, priced into the front a few batches at a time."""
        problem, structure = self.problem, self.structure
        # the rules reading one detail factor and the structure, looked up per (structure, factor value), before
        # any plan is built
        mask = np.ones((s1 - s0, self.per_structure), dtype=bool)
        for table, digit in zip(self.tables, self.digits):
            mask &= table[s0:s1][:, digit]
        tally.seen += mask.size
        chunk_structure, detail_row = np.nonzero(mask)
        if not len(chunk_structure):
            return
        structure_index = s0 + chunk_structure
        columns = {k: v[structure_index] for k, v in self.base.items()}
        columns.update(self.space.columns_from_factors(self.detail, [d[detail_row] for d in self.digits]))
        plans = structure_link(_chunk_plans(columns), self.base_plans, structure_index, self.shared,
                               self.detail_table, detail_row)
        if self.product_rules:
            keep = structural_mask(problem, plans, self.product_rules)
            if not keep.any():
                return
            plans = plans.take(np.flatnonzero(keep))
        tally.valid += len(plans)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m_units = objective.memory_units_by_group(structure, problem.model, problem.cluster, problem.training,
                                                      plans)
        keep = m_units <= self.limit_units if self.use_memory else np.ones(len(plans), dtype=bool)
        tally.fitting += int(keep.sum())
        if not keep.any():
            return
        plans, m_units = plans.take(np.flatnonzero(keep)), m_units[keep]
        # a plan the running front strictly dominates on a lower bound of its time (it can be on no front) is
        # dropped before the rest of its time is priced; the others wait, a few batches' worth, to be priced
        # together (`price_into_front`)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            bound = objective.time_bound_units(structure, problem.model, problem.cluster, problem.training, plans)
        keep = np.flatnonzero(front.undominated(bound.units, m_units))
        self.pending.add(plans.take(keep), bound.take(keep), m_units[keep])
        if self.pending.rows >= PRICE_BATCH_PLANS:
            price_into_front(front, structure, problem, *self.pending.pop())


def search_in_processes(search: BatchSearch, front: "RunningFront", workers: int,
                        progress: "Callable[[float], None] | None") -> Tally:
    """The whole search (no time budget) with its batches shared out among `workers` forked processes: the first
    batch here (its front, forked into every worker, lets each drop from its first batch the plans it dominates),
    then every worker-th of the rest in each worker, interleaved so the heavy and light stretches of the structure
    order are shared alike. Each worker returns its front; merged here, they make the same front one process
    makes (a plan off one worker's front is strictly dominated by a point of it, so it is on no front; the
    merge breaks ties as `pareto.front_indices` does, whatever the order). A worker that could not start or was
    lost (`processes.Lost`: killed, e.g. by the out-of-memory killer) has its share searched here instead."""
    n_structures = search.n_structures
    spans = list(chunk_spans(n_structures, search.per_structure, None))
    tally = search.run(spans[:1], front)
    rest = spans[1:]
    structures_done = spans[0][1] if spans else 0

    def report(structures: int) -> None:
        nonlocal structures_done
        structures_done += structures
        if progress is not None:      # a lost worker's share searched again here counts twice: at most done
            progress(min(structures_done / max(n_structures, 1), 1.0))

    report(0)
    if not rest:
        return tally
    parts = [rest[j::workers] for j in range(min(workers, len(rest)))]

    def worker(part: list[tuple[int, int]]) -> Callable:
        def task(send: Callable) -> tuple:
            tally = search.run(part, front, done=lambda s0, s1: send(s1 - s0))
            return front.columns, front.time_units, front.memory_units, tally
        return task

    outcomes = processes.run_forked([worker(p) for p in parts], report)
    for outcome in outcomes:
        if not isinstance(outcome, processes.Lost):
            columns, time_units, memory_units, part_tally = outcome
            front.merge(plan_arrays(columns), time_units, memory_units)
            tally.add(part_tally)
    for part, outcome in zip(parts, outcomes):
        if isinstance(outcome, processes.Lost):
            tally.add(search.run(part, front, done=lambda s0, s1: report(s1 - s0)))
    return tally


def chunk_spans(n_structures: int, per_structure: int, time_budget_s: "float | None") -> Iterator[tuple[int, int]]:
    """(first, end) structure indices of each batch: CHUNK_PLANS plans a batch; under a time limit the first
    TIME_LIMITED_CHUNK_PLANS and each next sized from the pace of the one before (the time between two spans is
    that batch's) to take 1/CHECKS_PER_LIMIT of the limit, within TIME_LIMITED_CHUNK_PLANS..CHUNK_PLANS."""
    plans = CHUNK_PLANS if time_budget_s is None else min(CHUNK_PLANS, TIME_LIMITED_CHUNK_PLANS)
    start = 0
    while start < n_structures:
        end = min(n_structures, start + max(1, plans // max(per_structure, 1)))
        begun = time.perf_counter()
        yield start, end
        if time_budget_s is not None:
            pace = (end - start) * max(per_structure, 1) / max(time.perf_counter() - begun, 1e-3)
            plans = int(min(CHUNK_PLANS, max(TIME_LIMITED_CHUNK_PLANS, pace * time_budget_s / CHECKS_PER_LIMIT)))
        start = end


@dataclass
class RunningFront:
    """The front of the plans priced so far (fastest first), as the search keeps it."""

    columns: dict[str, np.ndarray] = field(
        default_factory=lambda: {k: np.zeros(0, dtype=np.int64) for k in PLAN_FIELDS})
    time_units: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    memory_units: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def undominated(self, time_units: np.ndarray, memory_units: np.ndarray) -> np.ndarray:
        """Mask of the plans no point of the front strictly dominates (`_not_dominated_by`)."""
        return _not_dominated_by(self.time_units, self.memory_units, time_units, memory_units)

    def merge(self, plans: PlanArrays, time_units: np.ndarray, memory_units: np.ndarray) -> None:
        """The front of its points and `plans`, ties broken as pareto.front_indices breaks them."""
        survivors = np.flatnonzero(self.undominated(time_units, memory_units))
        kept = survivors[_not_dominated_within(time_units[survivors], memory_units[survivors])]
        merged = {k: np.concatenate([self.columns[k], getattr(plans, k)[kept].astype(np.int64)]) for k in PLAN_FIELDS}
        merged_time = np.concatenate([self.time_units, time_units[kept]])
        merged_memory = np.concatenate([self.memory_units, memory_units[kept]])
        idx = front_indices(merged_time, merged_memory, merged)
        self.columns = {k: v[idx] for k, v in merged.items()}
        self.time_units, self.memory_units = merged_time[idx], merged_memory[idx]


PRICE_BATCH_PLANS = 20_000
"""Plans past the bound test priced at once: pricing the host timeline and the gradient sync costs tens of
milliseconds a call whatever the number of plans, and each batch leaves only a few hundred to a few thousand."""


@dataclass
class Pending:
    """Plans past the bound test of their batch, waiting to be priced (with their bounds and memory units)."""

    parts: list = field(default_factory=list)
    rows: int = 0

    def add(self, plans: PlanArrays, bound: "objective.TimeBound", memory_units: np.ndarray) -> None:
        if len(plans):
            self.parts.append((plans, bound, memory_units))
            self.rows += len(plans)

    def pop(self) -> "tuple[PlanArrays, objective.TimeBound, np.ndarray]":
        """The waiting plans as one batch (one batch's plans as they are, keeping their structure index)."""
        parts, self.parts, self.rows = self.parts, [], 0
        if len(parts) == 1:
            return parts[0]
        plans = PlanArrays.from_columns(**{k: np.concatenate([getattr(p, k) for p, _, _ in parts])
                                           for k in PLAN_FIELDS})
        bound = objective.TimeBound.concatenate([b for _, b, _ in parts])
        return plans, bound, np.concatenate([m for _, _, m in parts])


def price_into_front(front: RunningFront, structure: "objective.ObjectiveStructure", problem: Problem,
                     plans: PlanArrays, bound: "objective.TimeBound", memory_units: np.ndarray) -> None:
    """Price `plans` whole (objective.time_units_finish) and merge them into `front`, in two waves: first the plans
    no other of them dominates on their bounds (the likeliest front points), then the rest; each wave's plans the
    front dominates on their bounds are dropped unpriced (strictly dominated by a priced plan: on no front)."""
    first = _not_dominated_within(bound.units, memory_units)
    rest = np.setdiff1d(np.arange(len(plans)), first, assume_unique=True)
    for wave in (first, rest):
        wave = wave[front.undominated(bound.units[wave], memory_units[wave])]
        if not len(wave):
            continue
        priced = plans.take(wave)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            time_units = objective.time_units_finish(structure, problem.model, problem.cluster, problem.training,
                                                     priced, bound.take(wave))
        front.merge(priced, time_units, memory_units[wave])


def _factor_knobs(name: str) -> tuple[str, ...]:
    """The Plan fields one detail factor sets (space.columns_from_factors)."""
    return ("recompute", "recompute_layers", "recompute_modules") if name == "recompute" else (name,)


def detail_tables(space: SearchSpace, base: dict[str, np.ndarray], detail: list[tuple[str, np.ndarray]], problem: Problem,
                  rules: tuple[Rule, ...]) -> tuple[list[np.ndarray], list[Rule]]:
    """For each detail factor, a (structures × factor values) table of the rules that read the structure knobs and
    that factor only; and the rules left to check plan by plan (reading several detail factors). The rules reading
    the structure knobs alone were applied by `structures`."""
    structure_knobs = set(base)
    n = len(next(iter(base.values()))) if base else 0
    used: set[str] = set()
    tables = []
    for name, values in detail:
        knobs = structure_knobs | set(_factor_knobs(name))
        mine = [r for r in rules if r.id != "memory" and _covered(r, knobs) and not _covered(r, structure_knobs)]
        used.update(r.id for r in mine)
        if not mine or not n:
            tables.append(np.ones((n, len(values)), dtype=bool))
            continue
        # evaluated once per distinct value of the structure knobs these rules read, then copied to every structure
        read = [k for k in base if any(k in r.knobs or (k == "etp" and "tp" in r.knobs) for r in mine)]
        first, inverse = _distinct_rows([base[k] for k in read], n)
        rows = np.repeat(first, len(values))
        columns = {k: base[k][rows] for k in read}
        columns.update(space.columns_from_factors([(name, values)], [np.tile(np.arange(len(values)), len(first))]))
        ok = structural_mask(problem, plan_arrays(columns), mine).reshape(len(first), len(values))
        tables.append(ok[inverse])
    rest = [r for r in rules if r.id != "memory" and r.id not in used and not _covered(r, structure_knobs)]
    return tables, rest


def _detail_table(space: SearchSpace, detail: list[tuple[str, np.ndarray]], digits: list[np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """The detail knobs (those outside the structure) of every detail row, absent knobs at Plan's defaults as in
    the chunks' plans: what lets costmodels.structure keep a function of a few knobs for the whole search."""
    rows = plan_arrays(space.columns_from_factors(detail, digits), length=len(digits[0]) if digits else 1)
    return {k: getattr(rows, k) for k in PLAN_FIELDS if k not in STRUCTURE_FIELDS}


def _chunk_plans(columns: dict[str, np.ndarray]) -> PlanArrays:
    """The chunk's columns as PlanArrays without copying them (they are fresh arrays); plan_arrays when some knob
    is absent from the space and takes its default."""
    if not set(PLAN_FIELDS) <= set(columns) or (columns["etp"] == 0).any():
        return plan_arrays(columns)
    return PlanArrays(**{k: np.asarray(columns[k], dtype=bool if k == "sp" else np.int64) for k in PLAN_FIELDS})


def _distinct_rows(columns: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first row of each distinct combination of `columns`, each row's position among them)."""
    code = np.zeros(n, dtype=np.int64)
    for column in columns:
        values, dense = np.unique(column, return_inverse=True)
        code = code * len(values) + dense.reshape(-1)
        _, code = np.unique(code, return_inverse=True)        # renumbered: stays small whatever the columns
        code = code.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _not_dominated_by(front_time: np.ndarray, front_memory: np.ndarray, time_units: np.ndarray,
                      memory_units: np.ndarray) -> np.ndarray:
    """Mask of the plans no point of a front (fastest first: time increasing, memory decreasing) strictly
    dominates. Dropping the others changes no front: a strictly dominated plan is never on one, whatever the ties.
    The front points at least as fast as a plan are the first k; the last of them has the least memory."""
    if not len(front_time):
        return np.ones(len(time_units), dtype=bool)
    k = np.searchsorted(front_time, time_units, side="right")
    at = np.maximum(k - 1, 0)
    nearest_time, nearest_memory = front_time[at], front_memory[at]
    dominated = (k > 0) & ((nearest_memory < memory_units)
                           | ((nearest_memory == memory_units) & (nearest_time < time_units)))
    return ~dominated


def _not_dominated_within(time_units: np.ndarray, memory_units: np.ndarray) -> np.ndarray:
    """Indices of the plans no other plan of the same batch strictly dominates: a superset of the batch's front
    (every plan dropped has another that is faster-or-equal and strictly smaller, or faster and equal), so merging
    only these into the running front gives the same front."""
    span = int(memory_units.max(initial=0)) + 1
    if len(time_units) and int(time_units.max()) < np.iinfo(np.int64).max // span and time_units.min() >= 0 \
            and memory_units.min() >= 0:
        order = np.argsort(time_units * span + memory_units, kind="stable")   # (time, memory) as one integer
    else:
        order = np.lexsort((memory_units, time_units))
    memory_sorted = memory_units[order]
    best_before = np.concatenate(([np.iinfo(np.int64).max], np.minimum.accumulate(memory_sorted)[:-1]))
    return np.sort(order[memory_sorted <= best_before])


def _empty_plans() -> PlanArrays:
    return PlanArrays(**{k: np.zeros(0, dtype=bool if k == "sp" else np.int64) for k in PLAN_FIELDS})
