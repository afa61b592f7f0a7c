"""`autopar.solve`: the Pareto front of (step time, peak memory per GPU) for a model on a cluster.

    front = autopar.solve(model, cluster, training, fix={"tp": 8}, bounds={"pp": (None, 8)})

Steps: the user's controls → the search space (autopar.search.space) → the rules in force
(costmodels.rules) → a solver (the CP-SAT model, autopar.search.cpsat, or the exhaustive oracle,
autopar.search.oracle; both rank plans by the same integer objectives and break ties in the same order, so they
return the same front) → every point re-scored with the float model (autopar.estimate) → `ParetoFront`.
When nothing fits, `Infeasible` names the smallest set of conflicting rules and the nearest plan
(autopar.search.explain).

No global state: every call builds its own space, model and solver; safe to call from several threads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping

from autopar.results import Estimate, ParetoFront
from autopar.search.space import (
    Controls,
    build_space,
    parse_assignments,
    parse_knob_value,
)
from costmodels.errors import InputError
from costmodels.plan import Plan, PlanArrays
from costmodels.rules import Problem, Rule, active_rules
from costmodels.scoring import estimates, require_input_types, require_precision_supported
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

SOLVERS = ("auto", "cpsat", "oracle")
AUTO_SOLVER = "oracle"
"""What `solver="auto"` runs. Both solvers return the same front (tests/test_cpsat_differential.py), and the
oracle is the faster one for this cost model, on every size measured on this project's 2-core machine: the
step-time terms depend on 12 and 13 of the 13 knobs (costmodels.steptime.TERM_KNOBS), so CP-SAT's integer tables
are as large as the space itself, each CP-SAT solve costs ~0.1-0.3 s even on a 2,000-plan space, and the front walk
needs two solves per front point, while the vectorised oracle evaluates ~3·10^5 plans per second (benchmarks/
solver.py). Small factor tables joined by products do not change that: benchmarks/cpsat_decomposed.py measures CP-SAT
at 20 s and 72 s on S1 and S2 where numpy takes 0.3 s and 0.7 s over the same integer objective. CP-SAT stays
available (`solver="cpsat"`) and answers the "why is nothing feasible" question (autopar.search.explain), which
only needs the rules' small tables."""


CPSAT_MAX_TABLE_CANDIDATES = 5_000_000
"""Refuse to build CP-SAT tables over more candidate rows than this (memory and hours of solving)."""


def controls_from(fix: Mapping[str, object] | Iterable[str] | None = None,
                  bounds: Mapping[str, tuple[object, object]] | None = None,
                  relax: Iterable[str] = ()) -> Controls:
    """User controls from the API's shapes: fix {knob: value}, bounds {knob: (min or None, max or None)}."""
    fixed = parse_assignments(fix, "fix") if fix else {}
    minimum, maximum = {}, {}
    for knob, pair in (bounds or {}).items():
        try:
            low, high = pair
        except (TypeError, ValueError):
            raise InputError("bounds", f"give {knob} as (min, max) with None for an open end, got {pair!r}") from None
        if low is not None:
            minimum[knob] = parse_knob_value(knob, low)
        if high is not None:
            maximum[knob] = parse_knob_value(knob, high)
    return Controls(fix=fixed, minimum=minimum, maximum=maximum, relax=tuple(relax))


def solve(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
          fix: Mapping[str, object] | Iterable[str] | None = None,
          bounds: Mapping[str, tuple[object, object]] | None = None,
          relax: Iterable[str] = (), time_limit_s: float | None = None, solver: str = "auto",
          progress: Callable[[float], None] | None = None, extra_rules: tuple[Rule, ...] = (),
          jobs: int | None = None) -> ParetoFront:
    """Every Pareto-optimal layout, fastest first, each re-scored with the float cost model.

    fix: pin knobs ({"tp": 4} or ["tp=4"]); bounds: {"pp": (None, 8)} keeps pp <= 8; relax: guide rules to drop
    (see costmodels.rules.RULES); time_limit_s: stop the search there and return what was found, marked
    not proven optimal; solver: "cpsat", "oracle" or "auto" (see AUTO_SOLVER); progress: called with the fraction
    of the oracle's search done, for a progress bar; extra_rules: more rules every plan must meet, e.g. what one
    framework can run (autopar.export.capabilities.framework_rules, `solve --framework`); jobs: processes the
    oracle may run in (None: 8, never more than the CPUs this process may use; 1: this process only;
    autopar.search.processes), the same front whatever the number.
    Raises InputError for bad controls and Infeasible when no plan fits.
    """
    require_input_types(model=model, cluster=cluster, training=training)
    if solver not in SOLVERS:
        raise InputError("solver", f"unknown solver {solver!r}; use one of {', '.join(SOLVERS)}")
    if time_limit_s is not None and not (time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise InputError("time_limit", f"must be a positive number of seconds, got {time_limit_s!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise InputError("jobs", f"must be a whole number of processes >= 1 (or None: the default), got {jobs!r}")
    require_precision_supported(cluster, training)
    controls = controls_from(fix, bounds, relax)
    rules = active_rules(controls.relax)
    rules = rules + tuple(extra_rules)
    problem = Problem(model, cluster, training)
    refusing = inputs_refused(problem, extra_rules)
    if refusing:   # a rule on no knob refuses every plan alike: name it, not the search
        from autopar.errors import Infeasible

        raise Infeasible(f"no plan runs with these inputs ({', '.join(r.id for r in refusing)} refuses every plan)",
                         tuple(r.id for r in refusing), tuple(f"{r.id}: {r.reason}" for r in refusing))
    start = time.perf_counter()
    space = build_space(model, cluster, training, controls)
    chosen = solver if solver != "auto" else AUTO_SOLVER
    notes: list[str] = []
    if chosen == "cpsat":
        from autopar.search import objective
        from autopar.search.cpsat import solve_cpsat
        from autopar.search.tables import largest_table_candidates

        rows = largest_table_candidates(objective.objective_structure(model, cluster, training), space)
        if rows > CPSAT_MAX_TABLE_CANDIDATES:
            raise InputError("solver", f"the CP-SAT model would tabulate {rows:,} candidate rows for this space "
                             f"(limit {CPSAT_MAX_TABLE_CANDIDATES:,}); use --solver oracle (the default) or narrow "
                             "the space with --fix / --max")

        result = solve_cpsat(space, problem, rules, time_limit_s=time_limit_s)
        plans, proven = result.plans, result.proven_optimal
        notes.append(f"CP-SAT: {result.solves} solves, {result.table_rows} table rows, "
                     f"model built in {result.build_s:.2f} s")
    else:
        from autopar.search.oracle import solve_oracle

        result = solve_oracle(space, problem, rules, time_budget_s=time_limit_s, progress=progress, jobs=jobs)
        plans, proven = result.plans, result.complete
        notes.append(f"oracle: {result.plans_seen:,} plans enumerated, {result.valid_plans:,} pass the rules, "
                     f"{result.fitting_plans:,} fit in memory")
    if not proven:
        notes.append("time limit reached: the front is the best found so far, not proven optimal")
    if len(plans) == 0:
        if not proven:
            from autopar.errors import Infeasible

            raise Infeasible(f"no plan found within the time limit of {time_limit_s:g} s", (),
                             ("raise --time-limit or narrow the search with --fix / --max",))
        from autopar.search.explain import explain_infeasible

        if extra_rules:  # the added rules narrowed the space; the explanation below knows only the search's own
            from autopar.errors import Infeasible

            raise Infeasible(f"no plan fits once the added rules hold ({', '.join(r.id for r in extra_rules)})",
                             tuple(r.id for r in extra_rules), tuple(f"{r.id}: {r.reason}" for r in extra_rules)
                             + ("drop them (--framework) to see the full front, or why nothing fits at all",))
        raise explain_infeasible(model, cluster, training, controls, jobs)
    points = rescore(model, cluster, training, plans)
    points, checked_notes = checked_front(points)
    notes.extend(checked_notes)
    if not points:
        from autopar.search.explain import explain_infeasible

        raise explain_infeasible(model, cluster, training, controls, jobs)
    return ParetoFront(model=model, cluster=cluster, training=training, points=points, proven_optimal=proven,
                       rules=tuple(r.id for r in rules), relaxed_rules=tuple(controls.relax), solver=chosen,
                       solve_time_s=time.perf_counter() - start, search_space_size=space.size, notes=tuple(notes))


def inputs_refused(problem: Problem, rules: Iterable[Rule]) -> tuple[Rule, ...]:
    """The rules on no knob (knobs ()) that `problem` breaks: a training input a framework cannot run (e.g.
    bridge:grad_reduce_in_fp32), which no plan can satisfy."""
    one = PlanArrays.from_plans([Plan()])
    return tuple(r for r in rules if not r.knobs and not bool(r.holds(problem, one)[0]))


def checked_front(points: tuple[Estimate, ...]) -> tuple[tuple[Estimate, ...], list[str]]:
    """The front as the float model (costmodels.scoring, the one definition of "fits") sees it: a point it says does not
    fit is dropped and said so (the integer units round memory up, so this only happens if that invariant breaks), and
    step times past the solver's exact integer range are noted (autopar.search.objective saturates them)."""
    from autopar.search.objective import TIME_RANKING_LIMIT_S

    kept = tuple(p for p in points if p.fits)
    notes = []
    if len(kept) < len(points):
        notes.append(f"{len(points) - len(kept)} plan(s) the solver kept were dropped: the float model says they do "
                     "not fit in memory")
    if any(p.step_time_s >= TIME_RANKING_LIMIT_S for p in kept):
        notes.append(f"step times over {TIME_RANKING_LIMIT_S:.3g} s are past the solver's integer range: plans "
                     "beyond it rank as ties on step time")
    return kept, notes


def rescore(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
            plans: PlanArrays) -> tuple[Estimate, ...]:
    """The float model's estimate of every plan, in the given (front) order, in one vectorised evaluation.

    The plans come from the solver, so they pass every rule in force: no rule is checked again."""
    return estimates(model, cluster, training, plans)


def scaling_gpu_counts(low: int, high: int, gpus_per_node: int) -> tuple[int, ...]:
    """GPU counts of a scaling front: LO, HI and every power of two (or node count × power of two) between."""
    counts = {low, high}
    n = 1
    while n <= high:
        if n >= low and (n <= gpus_per_node or n % gpus_per_node == 0):
            counts.add(n)
        n *= 2
    return tuple(sorted(counts))


def solve_scaling(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, gpu_range: tuple[int, int],
                  progress: Callable[[float, str], None] | None = None, **options) -> ParetoFront:
    """The front over (step time, peak memory, GPU count) for the GPU counts of `scaling_gpu_counts`; counts with
    no feasible plan are skipped (noted). Points keep their own cluster (Estimate.cluster).
    `progress(fraction, label)` is told how far the whole search is and which GPU count it is on."""
    import dataclasses

    from autopar.errors import Infeasible

    low, high = gpu_range
    start = time.perf_counter()
    counts = scaling_gpu_counts(low, high, cluster.gpus_per_node)
    points: list[Estimate] = []
    notes: list[str] = [f"scaling front over GPU counts {', '.join(map(str, counts))}"]
    proven, last_front, size = True, None, 0
    for index, n in enumerate(counts):
        if progress is not None:
            options["progress"] = (lambda fraction, index=index, n=n:
                                   progress((index + fraction) / len(counts), f"{n:,} GPUs"))
        try:
            sub = dataclasses.replace(cluster, num_gpus=n, gpus_per_node=min(cluster.gpus_per_node, n))
        except InputError as exc:
            notes.append(f"{_gpus(n)} skipped: {exc.message}")
            continue
        try:
            front = solve(model, sub, training, **options)
        except Infeasible as exc:
            notes.append(f"{_gpus(n)}: {exc.message}")
            continue
        last_front = front
        proven &= front.proven_optimal
        size += front.search_space_size
        points.extend(front.points)
    if last_front is None:
        raise Infeasible(f"no plan fits on any GPU count in {low}-{high}", ("memory",), tuple(notes))
    vectors = [(p.step_time_s, p.peak_memory_bytes, p.cluster.num_gpus) for p in points]
    kept = [p for p, v in zip(points, vectors)
            if not any(w != v and all(a <= b for a, b in zip(w, v)) for w in vectors)]
    kept.sort(key=lambda p: (p.step_time_s, p.peak_memory_bytes, p.cluster.num_gpus))
    return dataclasses.replace(last_front, points=tuple(kept), proven_optimal=proven,
                               solve_time_s=time.perf_counter() - start, search_space_size=size,
                               notes=tuple(notes))


def _gpus(count: int) -> str:
    return f"on {count:,} GPU{'s' if count != 1 else ''}"


__all__ = ["SOLVERS", "controls_from", "rescore", "solve", "solve_scaling"]
