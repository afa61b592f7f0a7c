"""The CP-SAT model: knobs as integer variables, rules as table constraints, costs as integer tables, and the
epsilon-constraint loop that walks the (step time, peak memory) front.

Reads as OR-Tools' samples do: data (autopar.search.tables) → variables (one per knob) → constraints (one function
per family: joint domains, rules, cost tables, objectives) → objective → solve → read.

- Each rule is one table constraint over the rule's knobs, enforced by a Boolean literal named after the rule; in an
  explaining model the literals are assumptions, so an infeasible problem yields the rules that conflict
  (`sufficient_assumptions_for_infeasibility`).
- Step time = F × W + S × R (autopar.search.objective): W and R sums of table variables, F the pipeline factor's
  table variable, the product by `add_multiplication_equality`.
- Peak memory = max over the candidate worst stages (autopar.search.tables.memory_tables: the first stage, the
  last, and for MoE models the middle stages that may carry more) of the sum of that stage's table variables,
  plus the stage-independent tables.
- Pareto walk (epsilon constraint): minimise time with memory <= bound; then, time fixed, minimise
  memory · K + tie-break key (the plan first in space.TIE_BREAK_ORDER); tighten the bound below that memory;
  repeat until infeasible. Every point is the unique optimum of its second solve, so the front is deterministic.
- Built with the public `CpModel` API only (tables by `add_allowed_assignments`, rule literals by
  `only_enforce_if`, the walk's bounds by `IntVar.with_domain`); nothing writes the protobuf.
- One worker, fixed seed, no presolve (measured fastest here); a time limit bounds the whole walk, and what was
  found is returned marked unproven.

Cost: the tables are as large as the projections of the space onto each group's knobs; with this cost model the
step-time groups read 12-13 of the 13 knobs, so each solve propagates tables about the size of the space
(~0.1-0.3 s on a 2,000-plan space on this project's machine). autopar.search.solve therefore runs the oracle by
default; this model is the second, independent solver the oracle is tested against.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autopar.search import objective
from autopar.search.objective import ObjectiveStructure
from costmodels.rules import Problem, Rule
from autopar.search.space import TIE_BREAK_ORDER, SearchSpace
from autopar.search.tables import Table, memory_tables, rule_table, time_tables
from costmodels.plan import PLAN_FIELDS, PlanArrays

if TYPE_CHECKING:                                          # ortools is imported lazily at run time (_cp)
    from ortools.sat.python.cp_model import CpModel, IntVar, LinearExpr

NUM_WORKERS = 1
"""One worker: on this project's 2-core machine a second worker only competes with the first (measured)."""
RANDOM_SEED = 0
PRESOLVE = False
"""CP-SAT's presolve costs ~4x the search on these table-heavy models (measured on small instances)."""


@dataclass
class Knobs:
    """The CP-SAT variable of every plan knob (etp aliases tp for dense models)."""

    variables: dict[str, IntVar]

    def __getitem__(self, knob: str) -> IntVar:
        return self.variables[knob]


@dataclass
class ParetoModel:
    """A built model and the handles the front walk needs."""

    model: CpModel
    knobs: Knobs
    time_var: IntVar
    memory_var: IntVar
    tie_break: LinearExpr | int
    """Σ rank(knob) · weight, the position of a plan in space.TIE_BREAK_ORDER (_tie_break)."""
    tie_break_range: int
    """One more than the largest tie_break value: memory · range + tie_break orders by memory first."""
    rule_literals: dict[str, IntVar]
    table_rows: int
    build_s: float


def _cp():
    from ortools.sat.python import cp_model  # lazily: ortools is heavy to import

    return cp_model


# ---- variables ---------------------------------------------------------------------------------------------

def knob_variables(model: CpModel, space: SearchSpace) -> Knobs:
    """One integer variable per knob over its candidate values (Domain.from_values: holes stay holes)."""
    cp_model = _cp()
    variables = {}
    for knob in PLAN_FIELDS:
        if knob == "etp" and space.etp_follows_tp:
            continue
        values = [int(v) for v in space.domain(knob)]
        variables[knob] = model.new_int_var_from_domain(cp_model.Domain.from_values(values), knob)
    if space.etp_follows_tp:
        variables["etp"] = variables["tp"]
    return Knobs(variables)


# ---- constraints -------------------------------------------------------------------------------------------

def add_table(model: CpModel, knobs: Knobs, table: Table, value_var: IntVar | None = None,
              enforce: IntVar | None = None) -> None:
    """The rows of `table` as the allowed assignments of (its knobs..., value_var); with `enforce`, only when that
    literal is true. An empty table admits no assignment (the model, or the literal, is then infeasible)."""
    variables = [knobs[k] for k in table.knobs]
    rows = table.rows
    if value_var is not None:
        variables.append(value_var)
        rows = np.concatenate([rows, table.values.reshape(-1, 1)], axis=1)
    constraint = model.add_allowed_assignments(variables, rows)
    if enforce is not None:
        constraint.only_enforce_if(enforce)


def _value_var(model: CpModel, table: Table, name: str) -> IntVar:
    if len(table.values) == 0:
        return model.new_int_var(0, 0, name)
    return model.new_int_var(int(table.values.min()), int(table.values.max()), name)


def add_joint_domains(model: CpModel, knobs: Knobs, space: SearchSpace) -> None:
    """The pipeline split and the recompute setting take only their listed combinations."""
    split_rows = np.array(space.splits, dtype=np.int64).reshape(-1, 3)
    add_table(model, knobs, Table("split", ("pp", "first_stage_layers", "last_stage_layers"), split_rows,
                                   np.ones(len(split_rows), np.int64)))
    recompute_rows = np.array(space.recomputes, dtype=np.int64).reshape(-1, 2)
    add_table(model, knobs, Table("recompute", ("recompute", "recompute_layers"), recompute_rows,
                                   np.ones(len(recompute_rows), np.int64)))


def _add_rules(model: CpModel, knobs: Knobs, space: SearchSpace, problem: Problem, rules: Sequence[Rule]
               ) -> dict[str, IntVar]:
    literals = {}
    for rule in rules:
        if rule.id == "memory":
            continue
        literal = model.new_bool_var(f"rule:{rule.id}")
        add_table(model, knobs, rule_table(rule, space, problem), enforce=literal)
        literals[rule.id] = literal
    return literals


def _sum_tables(model: CpModel, knobs: Knobs, tables: Sequence[Table], name: str):
    """Σ of one variable per table (each linked to its knobs by the table); returns (expr, lo, hi)."""
    total, lo, hi = 0, 0, 0
    for i, table in enumerate(tables):
        var = _value_var(model, table, f"{name}{i}")
        add_table(model, knobs, table, var)
        total = total + var
        if len(table.values):
            lo += int(table.values.min())
            hi += int(table.values.max())
    return total, lo, hi


def _add_time(model: CpModel, knobs: Knobs, pipelined: list[Table], others: list[Table],
              factor: Table | None) -> IntVar:
    scale = objective.PIPELINE_FACTOR_SCALE
    other_sum, other_lo, other_hi = _sum_tables(model, knobs, others, "t_other")
    if factor is None:
        time_var = model.new_int_var(scale * other_lo, scale * other_hi, "time")
        model.add(time_var == scale * other_sum)
        return time_var
    w_expr, w_lo, w_hi = _sum_tables(model, knobs, pipelined, "t_pipe")
    w = model.new_int_var(w_lo, w_hi, "pipelined")
    model.add(w == w_expr)
    f = _value_var(model, factor, "pipeline_factor")
    add_table(model, knobs, factor, f)
    f_lo, f_hi = (int(factor.values.min()), int(factor.values.max())) if len(factor.values) else (0, 0)
    product = model.new_int_var(f_lo * w_lo, f_hi * w_hi, "pipelined_x_factor")
    model.add_multiplication_equality(product, [f, w])
    time_var = model.new_int_var(f_lo * w_lo + scale * other_lo, f_hi * w_hi + scale * other_hi, "time")
    model.add(time_var == product + scale * other_sum)
    return time_var


def _add_memory(model: CpModel, knobs: Knobs, per_candidate_stage: list[list[Table]], shared: list[Table]
                ) -> IntVar:
    """memory = max over the candidate worst stages of Σ that stage's tables, + Σ the stage-independent tables."""
    stage_vars = []
    lo_all, hi_all = [], []
    for candidate, tables in enumerate(per_candidate_stage):
        expr, lo, hi = _sum_tables(model, knobs, tables, f"m_stage{candidate}_")
        var = model.new_int_var(lo, hi, f"memory_stage{candidate}")
        model.add(var == expr)
        stage_vars.append(var)
        lo_all.append(lo)
        hi_all.append(hi)
    stage_peak = model.new_int_var(max(lo_all), max(hi_all), "memory_worst_rank")
    model.add_max_equality(stage_peak, stage_vars)
    shared_expr, shared_lo, shared_hi = _sum_tables(model, knobs, shared, "m_shared")
    memory_var = model.new_int_var(max(lo_all) + shared_lo, max(hi_all) + shared_hi, "memory")
    model.add(memory_var == stage_peak + shared_expr)
    return memory_var


def _tie_break(model: CpModel, knobs: Knobs, space: SearchSpace) -> tuple[LinearExpr | int, int]:
    """(Σ rank(knob) · weight, the product of the domain sizes): weights a mixed radix in TIE_BREAK_ORDER (first =
    most significant), so the expression is the plan's position in that order."""
    terms = []
    weight = 1
    for knob in reversed(TIE_BREAK_ORDER):
        if knob == "etp" and space.etp_follows_tp:
            continue
        values = [int(v) for v in space.domain(knob)]
        if len(values) > 1:
            rank = model.new_int_var(0, len(values) - 1, f"rank_{knob}")
            # rank = index of the knob's value in its sorted domain, as a two-column table
            model.add_allowed_assignments([knobs[knob], rank], [(v, i) for i, v in enumerate(values)])
            terms.append((rank, weight))
        weight *= len(values)
    expr = sum(rank * w for rank, w in terms) if terms else 0
    return expr, weight


def build_pareto_model(space: SearchSpace, problem: Problem, rules: Sequence[Rule], *, enforce_memory: bool = True,
                       structure: ObjectiveStructure | None = None) -> ParetoModel:
    cp_model = _cp()
    start = time.perf_counter()
    structure = structure or objective.objective_structure(problem.model, problem.cluster, problem.training)
    model = cp_model.CpModel()
    knobs = knob_variables(model, space)
    add_joint_domains(model, knobs, space)
    literals = _add_rules(model, knobs, space, problem, rules)
    for literal in literals.values():
        model.add_bool_or([literal])                       # rules hold (an explaining model uses assumptions)
    pipelined, others, factor = time_tables(structure, space, problem, rules)
    per_candidate_stage, shared = memory_tables(structure, space, problem, rules)
    time_var = _add_time(model, knobs, pipelined, others, factor)
    memory_var = _add_memory(model, knobs, per_candidate_stage, shared)
    if enforce_memory and any(r.id == "memory" for r in rules):
        model.add(memory_var <= objective.memory_limit_units(problem.cluster.memory_limit_bytes))
    tie_break, tie_range = _tie_break(model, knobs, space)
    stage_tables = [t for stage in per_candidate_stage for t in stage]
    rows = sum(len(t.values) for t in pipelined + others + stage_tables + shared)
    return ParetoModel(model=model, knobs=knobs, time_var=time_var, memory_var=memory_var, tie_break=tie_break,
                       tie_break_range=tie_range, rule_literals=literals, table_rows=rows,
                       build_s=time.perf_counter() - start)


# ---- solve ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CpsatResult:
    plans: PlanArrays
    time_units: np.ndarray
    memory_units: np.ndarray
    proven_optimal: bool
    solves: int
    build_s: float
    elapsed_s: float
    table_rows: int


def _solver(deadline: float | None):  # -> cp_model.CpSolver
    cp_model = _cp()
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = NUM_WORKERS
    solver.parameters.random_seed = RANDOM_SEED
    solver.parameters.cp_model_presolve = PRESOLVE
    if deadline is not None:
        solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    return solver


def _set_bounds(var: IntVar, lo: int, hi: int) -> None:
    """Narrow (or widen back) a variable's domain to [lo, hi] between two solves of the walk."""
    var.with_domain(_cp().Domain(lo, hi))


def _read_plan(solver, knobs: Knobs) -> dict[str, int]:
    return {k: int(solver.value(knobs[k])) for k in PLAN_FIELDS}


def walk_front(pareto_model: ParetoModel, *, time_limit_s: float | None = None) -> CpsatResult:
    """The epsilon-constraint walk (module docstring)."""
    cp_model = _cp()
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s is not None else None
    model, knobs = pareto_model.model, pareto_model.knobs
    time_var, memory_var = pareto_model.time_var, pareto_model.memory_var
    t_lo, t_hi = time_var.domain.min(), time_var.domain.max()
    m_lo, m_hi = memory_var.domain.min(), memory_var.domain.max()
    bound = m_hi
    rows: list[dict[str, int]] = []
    times, memories = [], []
    proven = True
    solves = 0
    while bound >= m_lo:
        if deadline is not None and time.perf_counter() >= deadline:
            proven = False
            break
        # 1. fastest plan within the memory bound
        _set_bounds(memory_var, m_lo, bound)
        _set_bounds(time_var, t_lo, t_hi)
        model.clear_hints()
        model.minimize(time_var)
        solver = _solver(deadline)
        status = solver.solve(model)
        solves += 1
        if status == cp_model.INFEASIBLE:
            break
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            proven = False
            break
        if status != cp_model.OPTIMAL:
            proven = False
        best_time = int(solver.value(time_var))
        hint = _read_plan(solver, knobs)
        # 2. least memory at that time, then the first plan in the tie-break order
        _set_bounds(time_var, best_time, best_time)
        for k, v in hint.items():
            if not (k == "etp" and knobs["etp"] is knobs["tp"]):
                model.add_hint(knobs[k], v)
        model.minimize(memory_var * pareto_model.tie_break_range + pareto_model.tie_break)
        solver = _solver(deadline)
        status = solver.solve(model)
        solves += 1
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            proven = False
            break
        if status != cp_model.OPTIMAL:
            proven = False
        rows.append(_read_plan(solver, knobs))
        times.append(best_time)
        memory_now = int(solver.value(memory_var))
        memories.append(memory_now)
        bound = memory_now - 1
    columns = {k: np.array([r[k] for r in rows], dtype=np.int64) for k in PLAN_FIELDS}
    columns["sp"] = columns["sp"].astype(bool)
    return CpsatResult(plans=PlanArrays(**columns), time_units=np.array(times, dtype=np.int64),
                       memory_units=np.array(memories, dtype=np.int64), proven_optimal=proven, solves=solves,
                       build_s=pareto_model.build_s, elapsed_s=time.perf_counter() - start + pareto_model.build_s,
                       table_rows=pareto_model.table_rows)


def solve_cpsat(space: SearchSpace, problem: Problem, rules: Sequence[Rule], *,
                time_limit_s: float | None = None) -> CpsatResult:
    return walk_front(build_pareto_model(space, problem, rules), time_limit_s=time_limit_s)
