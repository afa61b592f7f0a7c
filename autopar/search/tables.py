"""Integer cost tables over the few knobs each group of terms depends on (the data of the CP-SAT model).

A table's rows are the product of its knobs' candidate values, kept where every rule that reads only those knobs
holds (rows no full plan could use are left out); its values are the group's integer units (autopar.search
.objective) from the cost model's own vectorised term functions evaluated on those rows, the knobs it does not read
left at Plan's defaults. Joint domains stay joint: a table that reads first/last_stage_layers reads pp with them
(the pipeline split), one that reads recompute_layers reads recompute with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.search import objective
from autopar.search.objective import ObjectiveStructure, TermGroup, ordered
from costmodels.rules import Problem, Rule, structural_mask
from autopar.search.space import SearchSpace, mixed_radix, plan_arrays
from costmodels import memory, steptime

ROW_CHUNK = 500_000


@dataclass(frozen=True)
class Table:
    name: str
    knobs: tuple[str, ...]
    rows: np.ndarray
    """int64, one column per knob."""
    values: np.ndarray
    """int64 units per row (for rule tables: all ones)."""


def expand_knobs(knobs: Sequence[str], space: SearchSpace) -> tuple[str, ...]:
    wanted = set(knobs)
    if space.etp_follows_tp and "etp" in wanted:
        wanted.discard("etp")
        wanted.add("tp")
    if {"first_stage_layers", "last_stage_layers"} & wanted:
        wanted |= set(objective.SPLIT_KNOBS)
    if "recompute_layers" in wanted:
        wanted.add("recompute")
    return ordered(wanted)


def _factors(knobs: tuple[str, ...], space: SearchSpace) -> list[tuple[str, np.ndarray]]:
    names: list[str] = []
    if "first_stage_layers" in knobs:
        names.append("split")
    elif "pp" in knobs:
        names.append("pp")
    if "recompute_layers" in knobs:
        names.append("recompute")
    elif "recompute" in knobs:
        names.append("recompute_kind")
    for k in knobs:
        if k not in ("pp", "first_stage_layers", "last_stage_layers", "recompute", "recompute_layers"):
            names.append(k)
    factors = []
    for name in names:
        if name == "split":
            factors.append(("split", np.array(space.splits, dtype=np.int64).reshape(-1, 3)))
        elif name == "recompute":
            factors.append(("recompute", np.array(space.recomputes, dtype=np.int64).reshape(-1, 2)))
        elif name == "recompute_kind":
            factors.append(("recompute_kind", np.array(space.domain("recompute"), dtype=np.int64).reshape(-1, 1)))
        else:
            factors.append((name, np.array(space.domain(name), dtype=np.int64).reshape(-1, 1)))
    return factors


def valid_rows(knobs: tuple[str, ...], space: SearchSpace, problem: Problem, rules: Sequence[Rule]
               ) -> dict[str, np.ndarray]:
    """Columns of the product of `knobs`' candidates where every rule reading only those knobs holds."""
    factors = _factors(knobs, space)
    sizes = [len(t) for _, t in factors]
    total = math.prod(sizes)
    covered = [r for r in rules if r.id != "memory" and set(expand_knobs(r.knobs, space)) <= set(knobs)]
    kept: list[dict[str, np.ndarray]] = []
    for start in range(0, total, ROW_CHUNK):
        columns = space.columns_from_factors(factors, mixed_radix(sizes, start, min(total, start + ROW_CHUNK)))
        mask = structural_mask(problem, plan_arrays(_with_etp(columns, space)), covered)
        kept.append({k: v[mask] for k, v in columns.items()})
    return {k: np.concatenate([c[k] for c in kept]) for k in kept[0]} if kept else {}


def _with_etp(columns: dict[str, np.ndarray], space: SearchSpace) -> dict[str, np.ndarray]:
    if space.etp_follows_tp and "tp" in columns:
        return {**columns, "etp": columns["tp"]}
    return columns


def _as_table(name: str, knobs: tuple[str, ...], columns: dict[str, np.ndarray], values: np.ndarray) -> Table:
    rows = np.stack([columns[k] for k in knobs], axis=1) if knobs else np.zeros((len(values), 0), np.int64)
    return Table(name=name, knobs=knobs, rows=rows.astype(np.int64), values=np.asarray(values, dtype=np.int64))


# ---- the tables of the objectives --------------------------------------------------------------------------

def time_tables(structure: ObjectiveStructure, space: SearchSpace, problem: Problem, rules: Sequence[Rule]
                ) -> tuple[list[Table], list[Table], Table | None]:
    """(pipelined group tables, other group tables, pipeline factor table or None)."""
    def build(group: TermGroup, name: str) -> Table:
        knobs = expand_knobs(group.knobs, space)
        columns = valid_rows(knobs, space, problem, rules)
        plans = plan_arrays(_with_etp(columns, space))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            terms = steptime.step_time_terms_s(problem.model, problem.cluster, problem.training, plans)
        return _finite(_as_table(name, knobs, columns, _safe_units(objective.time_group_units, terms, group)))

    pipelined = [build(g, f"time:{'+'.join(g.terms)}") for g in structure.pipelined_time_groups]
    others = [build(g, f"time:{'+'.join(g.terms)}") for g in structure.other_time_groups]
    factor = None
    if structure.factored:
        knobs = expand_knobs(objective.PIPELINE_FACTOR_KNOBS, space)
        columns = valid_rows(knobs, space, problem, rules)
        plans = plan_arrays(_with_etp(columns, space))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            units = objective.pipeline_factor_units(problem.cluster, problem.training, plans) \
                if len(plans) else np.zeros(0, np.int64)
        factor = _as_table("pipeline_factor", knobs, columns, units)
    return pipelined, others, factor


def candidate_stage_count(problem: Problem, space: SearchSpace) -> int:
    """How many candidate worst stages (memory.candidate_worst_stages) the model needs to cover every pipeline split
    in the space (>= 2: the first stage and the last)."""
    splits = np.array(space.splits, dtype=np.int64).reshape(-1, 3)
    plans = plan_arrays({"pp": splits[:, 0], "first_stage_layers": splits[:, 1],
                         "last_stage_layers": splits[:, 2]})
    with np.errstate(divide="ignore", invalid="ignore"):
        return len(memory.candidate_worst_stages(problem.model, plans))


def memory_tables(structure: ObjectiveStructure, space: SearchSpace, problem: Problem, rules: Sequence[Rule]
                  ) -> tuple[list[list[Table]], list[Table]]:
    """(for each candidate worst stage: the stage groups' tables, the stage-independent groups' tables).

    Candidate j is a fixed position in objective.memory_stage_roles' list: 0 the first stage, the last one the
    last stage (rank pp-1), those between the middle ranks an MoE model's dense-first layers make distinct. Which
    rank candidate j is depends on a few knobs, added to every table of that candidate: none for the first stage,
    pp for the last, the pipeline split for a middle one."""
    num_candidates = candidate_stage_count(problem, space)
    moe = problem.model.moe is not None
    per_candidate: list[list[Table]] = []
    for candidate in range(num_candidates):
        rank_knobs: tuple[str, ...] = () if candidate == 0 else (
            objective.SPLIT_KNOBS if (moe and candidate < num_candidates - 1) else ("pp",))
        tables = []
        for group in structure.stage_memory_groups:
            knobs = expand_knobs(group.knobs + rank_knobs, space)
            columns = valid_rows(knobs, space, problem, rules)
            plans = plan_arrays(_with_etp(columns, space))
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                stage = objective.memory_stage_roles(problem.model, plans, num_candidates)[candidate] \
                    if len(plans) else 0
                terms = memory.memory_terms_bytes(problem.model, problem.cluster, problem.training, plans, stage)
            units = _safe_units(objective.memory_group_units, terms, group)
            tables.append(_finite(_as_table(f"memory[{candidate}]:{'+'.join(group.terms)}", knobs, columns, units)))
        per_candidate.append(tables)
    shared = []
    for group in structure.shared_memory_groups:
        knobs = expand_knobs(group.knobs, space)
        columns = valid_rows(knobs, space, problem, rules) if knobs else {}
        plans = plan_arrays(_with_etp(columns, space)) if knobs else plan_arrays({}, length=1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            terms = memory.memory_terms_bytes(problem.model, problem.cluster, problem.training, plans, 0)
        units = _safe_units(objective.memory_group_units, terms, group)
        shared.append(_as_table(f"memory:{'+'.join(group.terms)}", knobs, columns, units))
    return per_candidate, shared


def _safe_units(convert, terms, group: TermGroup) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = sum(np.asarray(terms[t], dtype=float) for t in group.terms)
        finite = np.isfinite(total)
        safe = {t: np.where(finite, terms[t], 0.0) for t in group.terms}
        units = convert(safe, group)
    return np.where(finite, units, np.iinfo(np.int64).min)


def _finite(table: Table) -> Table:
    """Drop rows whose value is not a number (plans the rules reject anyway)."""
    keep = table.values != np.iinfo(np.int64).min
    if keep.all():
        return table
    return Table(table.name, table.knobs, table.rows[keep], table.values[keep])


def rule_table(rule: Rule, space: SearchSpace, problem: Problem) -> Table:
    """Rows of the rule's knobs' candidates where the rule holds."""
    knobs = expand_knobs(rule.knobs, space)
    columns = valid_rows(knobs, space, problem, [rule])
    n = len(next(iter(columns.values()))) if columns else 0
    return _as_table(f"rule:{rule.id}", knobs, columns, np.ones(n, np.int64))


def largest_table_candidates(structure: ObjectiveStructure, space: SearchSpace) -> int:
    """Candidate rows (before the rules) of the largest cost table the CP-SAT model would build."""
    largest = 1
    for group in structure.pipelined_time_groups + structure.other_time_groups + structure.stage_memory_groups:
        factors = _factors(expand_knobs(group.knobs, space), space)
        largest = max(largest, math.prod(len(t) for _, t in factors))
    return largest
