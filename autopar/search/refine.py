"""`autopar solve` (layouts on by default): refine a front with per-stage pipeline layouts, and recompute it.

For every pipelined structure on the front (its knobs without the first/last split, which a layout subsumes), the
exact layout search (autopar.search.layouts: the chain DP without interleaving, CP-SAT with it) finds the fastest
layout that fits. Where it beats the structure's own (uniform) layout under the per-stage model, the layout plan is
added, priced by costmodels.scoring.plan_estimates (the parent's estimate less exactly the per-stage model's gain);
then the Pareto front over step time and peak memory is recomputed.

Near-front structures. A structure off the front can overtake a front point once its layout is balanced. Candidates
are the pipelined structures one knob step from a front plan (pp = 1 plans included: their step up in pp), each of
tp, pp, vpp, cp, ep, etp, mbs, zero, sp, recompute moved to the next or previous value of the search space (which
keeps the user's --fix/--min/--max), that pass every rule in force and fit. Each is refined only if it could
overtake: its uniform step time less an upper bound on its layout gain beats the front at its own (uniform) peak
memory. The bound comes from the structure's per-stage tables (`layout_gain_bound`): a rank carries at least 1/pp of
the pipeline's per-micro-batch work, and that work is at least every virtual stage's empty cost plus, per decoder
layer, the cheapest one-layer increment anywhere in the tables; the fill/drain term is at least 0 and the
data-parallel sync at least the largest of the ranks' smallest entries. The same bound skips front structures that
no layout can improve. Not counted: a layout that also lowers a structure's peak memory could enter the front at a
lower memory than the uniform one; and structures two or more knob steps from the front are not candidates.

Everything runs within a budget (front structures fastest first, then the candidates fastest first): by default a
fixed amount of work, so the front is the same on every run (DEFAULT_FRONT_STRUCTURES); with `budget_s` a wall-clock
budget. The notes say how many structures were searched, how many were near-front, and what was found.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autopar.results import Estimate, ParetoFront

if TYPE_CHECKING:
    from costmodels.layout import LayoutCost

DEFAULT_FRONT_STRUCTURES = 8
DEFAULT_NEAR_STRUCTURES = 4
DEFAULT_CPSAT_SEARCHES = 1
DEFAULT_CPSAT_WORK = 0.2
DEFAULT_NEAR_SEEDS = 4
"""The default refinement is a fixed amount of work, so that `autopar solve` prints the same front on every run and
machine: the fastest DEFAULT_FRONT_STRUCTURES pipelined structures of the front and DEFAULT_NEAR_STRUCTURES
near-front candidates get their tables and gain bound, and those it does not rule out their search: the chain DP
(milliseconds) for every one without interleaving, CP-SAT (about 0.3-1 s on a shared 2-core machine) for the
first DEFAULT_CPSAT_SEARCHES with interleaving, each stopped at DEFAULT_CPSAT_WORK of CP-SAT's deterministic time
(one worker; its best layout so far is used). Near-front candidates are then the neighbours of the front's
DEFAULT_NEAR_SEEDS fastest plans, at the even split only. Sized to add about half a second to `autopar solve` on
this project's 2-core machine for dense and MoE fronts (the issue's MoE target is 3 s for the whole command).
`budget_s` (`--layouts-budget`) replaces it with a wall-clock budget and no counts."""
PER_STRUCTURE_LIMIT_S = 2.0
"""CP-SAT wall-clock limit for one structure under a wall-clock budget (its best layout so far is used, marked not
proven, when it runs out)."""
BUDGET_SHARE = 0.5
"""At most this share of the budget left goes to one structure's CP-SAT search, so one slow search cannot take
it all."""
NEIGHBOUR_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "sp", "recompute")
"""Knobs a near-front candidate moves one step from a front structure."""


@dataclass(frozen=True)
class Refinement:
    parent: Estimate
    uniform_layout: tuple[int, ...]
    best_layout: tuple[int, ...]
    uniform_ns: int
    best_ns: int
    engine: str
    search_s: float
    proven_optimal: bool
    space_log10: float
    near_front: bool = False
    """True for a structure off the front that its gain bound said could overtake it."""

    @property
    def gain(self) -> float:
        return 1.0 - self.best_ns / self.uniform_ns if self.uniform_ns else 0.0


def structure_key(plan) -> object:
    return dataclasses.replace(plan, first_stage_layers=0, last_stage_layers=0, layout=())


def layout_time_lower_bound_ns(tables) -> int:
    """A lower bound, in ns, on the step time of every layout of the structure (fitting or not), from its integer
    tables alone (the module docstring says why each term holds): m · ⌈W / pp⌉ + max_r min sync_r + p2p, with W the
    virtual stages' empty costs plus each decoder layer at the cheapest one-layer increment of its kind (dense, MoE)
    in any role's table. Needs non-negative stage times (the fill/drain term is then >= 0)."""
    import numpy as np

    t = tables.stage_time_ns
    stages = tables.pp * tables.vpp
    empty_ns = int(t[0, 0, 0] + t[2, 0, 0] + (stages - 2) * t[1, 0, 0]) if stages > 1 else int(t[0, 0, 0])
    dense_step = int(np.diff(t, axis=1).min()) if t.shape[1] > 1 else 0
    moe_step = int(np.diff(t, axis=2).min()) if t.shape[2] > 1 else 0
    dense_layers = tables.num_layers - tables.num_moe_layers
    work_ns = empty_ns + dense_layers * dense_step + tables.num_moe_layers * moe_step
    slowest_rank_ns = -(-work_ns // tables.pp)
    sync_ns = int(tables.sync_ns.reshape(tables.pp, -1).min(axis=1).max())
    return tables.microbatches * slowest_rank_ns + sync_ns + tables.p2p_ns


def layout_gain_bound(tables, uniform_ns: int) -> int:
    """An upper bound, in ns, on how much faster than `uniform_ns` any layout of the structure can be."""
    return max(0, uniform_ns - layout_time_lower_bound_ns(tables))


LAYOUT_MEMORY_RETRIES = 3
"""Times a structure's layout search runs again when the layout it found comes out over memory priced exactly
(costmodels.layout: the search's tables index a rank's memory by its total layers, chunks taken as equal; the exact
schedule holds chunk 0 longest, so a layout that piles layers into one chunk can exceed the limit)."""


def ranks_over_memory(model, cluster, training, plan, layout) -> tuple[int, ...]:
    """The pipeline ranks whose memory exceeds the limit when `plan` with `layout` is priced exactly (none for a
    layout that breaks the layout's own rules, which refine_front drops whatever its memory)."""
    from costmodels.layout import layout_breakdown, with_layout
    from costmodels.rules import Problem, layout_breaks

    if layout_breaks(Problem(model, cluster, training), with_layout(plan, layout)):
        return ()
    ranks = layout_breakdown(model, cluster, training, plan, layout).rank_memory_terms_bytes
    # summed as scoring.layout_estimate sums a rank's terms
    return tuple(r for r, terms in enumerate(ranks) if float(sum(terms.values())) > cluster.memory_limit_bytes)


def resplit_ranks(layout: tuple[int, ...], pp: int, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """`layout` with each of `ranks`' layers spread evenly over its chunks, the remainder on its later ones (chunk 0,
    held longest by the interleaved schedule, lightest): the same layers per rank, which is all the tables price a
    rank's memory by, the least the exact schedule holds for them."""
    out = list(layout)
    chunks = len(layout) // pp
    for rank in ranks:
        where = [rank + pp * v for v in range(chunks)]
        total = sum(out[i] for i in where)
        for v, i in enumerate(where):
            out[i] = total // chunks + (1 if v >= chunks - total % chunks else 0)
    return tuple(out)


def without_rank_totals(tables, cost, ranks: tuple[int, ...]):
    """`tables` with each of `ranks` refused the layer totals `cost` gave it (its memory cell set over the limit):
    the next search must place that rank's layers otherwise."""
    memory = tables.memory_mib.copy()
    for rank in ranks:
        memory[rank, cost.rank_dense[rank], cost.rank_moe[rank]] = tables.memory_limit_mib + 1
    return dataclasses.replace(tables, memory_mib=memory)


@dataclass(frozen=True)
class LayoutSearch:
    """The best layout of a structure that fits when priced exactly (`search_layout_that_fits`)."""

    best: LayoutCost
    """The layout kept (the structure's own where none found beats it and fits)."""
    engine: str
    proven_optimal: bool
    """The search proved it optimal, on the tables as built (False once a layout over memory was set aside)."""
    elapsed_s: float
    searches: int
    set_aside: bool
    """A faster layout came out over memory priced exactly and was set aside."""


def search_layout_that_fits(model, cluster, training, plan, tables, own, hint, time_limit_s: float | None,
                            deterministic_limit: float | None = None) -> LayoutSearch:
    """The fastest layout the search finds that beats `own` and fits when priced exactly: a layout over memory on
    some ranks is first re-split within them at the same totals (`resplit_ranks`); still over, the search runs again
    without those ranks' totals (`without_rank_totals`), at most LAYOUT_MEMORY_RETRIES times within `time_limit_s`
    in all; else `own`."""
    from autopar.search.layouts import best_layout
    from costmodels.layout import price_layout

    start = time.perf_counter()
    engine, proven, searches = "", True, 0
    for _ in range(1 + LAYOUT_MEMORY_RETRIES):
        left_s = None if time_limit_s is None else max(time_limit_s - (time.perf_counter() - start), 0.05)
        result = best_layout(tables, time_limit_s=left_s, hint=hint, deterministic_limit=deterministic_limit)
        searches += 1
        engine, proven = engine or result.engine, proven and result.proven_optimal
        best = result.best if result.best is not None and result.best.objective_ns < own.objective_ns else own
        over = ranks_over_memory(model, cluster, training, plan, best.layout) if best is not own else ()
        if not over:
            return LayoutSearch(best, engine, proven, time.perf_counter() - start, searches, searches > 1)
        proven = False
        resplit = price_layout(tables, resplit_ranks(best.layout, plan.pp, over))
        if resplit.objective_ns < own.objective_ns and not ranks_over_memory(model, cluster, training, plan,
                                                                             resplit.layout):
            return LayoutSearch(resplit, engine, False, time.perf_counter() - start, searches, True)
        tables = without_rank_totals(tables, best, over)
    return LayoutSearch(own, engine, False, time.perf_counter() - start, searches, True)


def refine_structure(model, cluster, training, point: Estimate, time_limit_s: float | None = PER_STRUCTURE_LIMIT_S,
                     tables=None, deterministic_limit: float | None = None) -> Refinement | None:
    from costmodels.layout import layout_space_log10, layout_tables, price_layout, uniform_layout

    plan = point.plan
    if plan.pp < 2 or plan.layout:
        return None
    start = time.perf_counter()
    tables = tables if tables is not None else layout_tables(model, cluster, training, plan)
    uniform = uniform_layout(model, plan)
    own = price_layout(tables, uniform)
    found = search_layout_that_fits(model, cluster, training, plan, tables, own, uniform, time_limit_s,
                                    deterministic_limit)
    return Refinement(parent=point, uniform_layout=uniform, best_layout=found.best.layout,
                      uniform_ns=own.objective_ns, best_ns=found.best.objective_ns, engine=found.engine,
                      search_s=time.perf_counter() - start, proven_optimal=found.proven_optimal,
                      space_log10=layout_space_log10(model.num_layers, plan.pp * plan.vpp))


def neighbour_plans(space, plans) -> list:
    """Every plan one knob step (NEIGHBOUR_KNOBS) from one of `plans`, within the search space `space` (so within
    the user's pins and bounds); pipelined, without a layout, with the plan's own first/last split where pp stays
    (else the even split), each structure once."""
    from costmodels.errors import InputError
    from costmodels.plan import Recompute

    seen, out = set(), []
    for plan in plans:
        base = dataclasses.replace(plan, layout=())
        for knob in NEIGHBOUR_KNOBS:
            if knob == "recompute":
                steps = [dict(recompute=Recompute(r), recompute_layers=n, recompute_modules=m)
                         for r, n, m in space.recomputes]
            elif knob == "etp" and space.etp_follows_tp:
                continue                                  # dense models: etp moves with tp
            else:
                values = space.domain(knob) if knob == "pp" or knob in space.domains else ()
                current = getattr(base, knob)
                below = [v for v in values if v < current]
                above = [v for v in values if v > current]
                steps = [{knob: bool(v) if knob == "sp" else v} for v in (below[-1:] + above[:1])]
                if knob == "tp" and space.etp_follows_tp:
                    steps = [dict(step, etp=step["tp"]) for step in steps]
            for change in steps:
                if "pp" in change:
                    change = dict(change, first_stage_layers=0, last_stage_layers=0)
                try:
                    candidate = dataclasses.replace(base, **change)
                except (InputError, ValueError):
                    continue
                if candidate.pp < 2 or structure_key(candidate) in seen:
                    continue
                seen.add(structure_key(candidate))
                out.append(candidate)
    return out


def near_front_candidates(front: ParetoFront, controls, extra_rules, exclude: set, seeds: int | None = None,
                          resplit: bool = True) -> list[Estimate]:
    """Estimates of the neighbour structures of the front that pass every rule in force and fit, fastest first.
    `seeds`: neighbours of the front's first `seeds` plans only (None: all); `resplit`: a pp or vpp the even split
    does not divide gets the nearest first/last split Megatron accepts (costmodels.layout.parent_plan)."""
    from autopar.search.space import Controls, build_space
    from costmodels.layout import parent_plan, split_is_whole
    from costmodels.plan import PlanArrays
    from costmodels.rules import LAYOUT_RULES, Problem, active_rules, structural_mask
    from costmodels.scoring import estimates

    model, cluster, training = front.model, front.cluster, front.training
    controls = controls if controls is not None else Controls(relax=tuple(front.relaxed_rules))
    space = build_space(model, cluster, training, controls)
    plans = [p for p in neighbour_plans(space, [q.plan for q in front.points[:seeds]])
             if structure_key(p) not in exclude]
    if not plans:
        return []
    problem = Problem(model, cluster, training)
    rules = [r for r in active_rules(controls.relax) + tuple(extra_rules) if r.id != "memory"]
    keep = structural_mask(problem, PlanArrays.from_plans(plans), rules)
    # a pp or vpp the even split does not divide: the nearest first/last split Megatron accepts, if any
    split = [parent_plan(model, cluster, training, p) for p, ok in zip(plans, keep) if not ok and resplit]
    split = [p for p in split if p.first_stage_layers or p.last_stage_layers]
    split_ok = structural_mask(problem, PlanArrays.from_plans(split), rules) if split else []
    kept = [p for p, ok in zip(plans, keep) if ok] + [p for p, ok in zip(split, split_ok) if ok]
    # a structure no first/last split runs but a layout does (every rule holds but the split's `layers`): its bare
    # plan, priced by the uniform model at the even split, fractional, as the parent of the layouts
    # refine_structure searches for it (costmodels.layout.parent_layout)
    only_layout = [p for p, ok in zip(plans, keep) if not ok and not p.recompute_layers]
    layout_rules = [r for r in rules if r.id not in LAYOUT_RULES]
    if only_layout:
        layout_ok = structural_mask(problem, PlanArrays.from_plans(only_layout), layout_rules)
        parents = [parent_plan(model, cluster, training, p) for p, ok in zip(only_layout, layout_ok) if ok]
        kept += list(dict.fromkeys(p for p in parents if not split_is_whole(model, p)))
    if not kept:
        return []
    scored = [e for e in estimates(model, cluster, training, PlanArrays.from_plans(kept)) if e.fits]
    return sorted(scored, key=lambda e: (e.step_time_s, e.peak_memory_bytes))


def front_time_at(points, memory_bytes: float) -> float:
    """The front's fastest step time among points using at most `memory_bytes` (inf where none does)."""
    return min((p.step_time_s for p in points if p.peak_memory_bytes <= memory_bytes), default=float("inf"))


def refine_front(front: ParetoFront, budget_s: float | None = None, controls=None, extra_rules=(),
                 near_front: bool = True) -> tuple[ParetoFront, list[Refinement]]:
    """The front with the best layout of each front structure, and of each near-front structure that could
    overtake it, added, and recomputed. `budget_s` None: the default fixed amount of work (DEFAULT_FRONT_STRUCTURES,
    repeatable); else a wall-clock budget. `controls` (autopar.search.space.Controls) and `extra_rules` are the
    search's own, so near-front candidates stay within them."""
    from costmodels.layout import (TIME_UNIT_S, layout_tables, price_layout, prices_layouts, split_is_whole,
                                   uniform_layout, with_layout)
    from costmodels.rules import Problem, layout_breaks
    from costmodels.scoring import plan_estimates

    start = time.perf_counter()
    model, cluster, training = front.model, front.cluster, front.training
    if not prices_layouts(training):
        note = (f"per-stage pipeline layouts not searched: they are priced for 1F1B, and the schedule is "
                f"{training.pipeline_schedule.value}")
        return dataclasses.replace(front, notes=tuple(front.notes) + (note,)), []
    split_controls = [] if controls is None else [
        f"{kind} {knob}" for kind, values in (("fix", controls.fix), ("min", controls.minimum),
                                              ("max", controls.maximum))
        for knob in values if knob in ("first_stage_layers", "last_stage_layers")]
    if split_controls:   # a layout replaces the first/last split: its plans would leave those controls
        note = (f"per-stage pipeline layouts not searched: your controls on the first/last split "
                f"({', '.join(split_controls)}) keep the split, which a layout replaces")
        return dataclasses.replace(front, notes=tuple(front.notes) + (note,)), []
    refinements: list[Refinement] = []
    seen: set = set()
    skipped = {False: 0, True: 0}     # structures the budget left unsearched: on the front, near it
    considered = {False: 0, True: 0}
    cpsat_searches = 0
    caps = {False: DEFAULT_FRONT_STRUCTURES, True: DEFAULT_NEAR_STRUCTURES}
    bounded_out = 0

    def left_s() -> float:
        return float("inf") if budget_s is None else budget_s - (time.perf_counter() - start)

    def consider(point: Estimate, is_near: bool) -> None:
        nonlocal bounded_out, cpsat_searches
        if left_s() <= 0 or (budget_s is None and considered[is_near] >= caps[is_near]):
            skipped[is_near] += 1
            return
        considered[is_near] += 1
        tables = layout_tables(model, cluster, training, point.plan)
        uniform_ns = price_layout(tables, uniform_layout(model, point.plan)).objective_ns
        bound_ns = layout_gain_bound(tables, uniform_ns)
        could = bound_ns > 0 and (not is_near or point.step_time_s - bound_ns * TIME_UNIT_S
                                  < front_time_at(front.points, point.peak_memory_bytes))
        if not could:
            bounded_out += 1
            return
        if budget_s is None and point.plan.vpp > 1:
            if cpsat_searches >= DEFAULT_CPSAT_SEARCHES:
                skipped[is_near] += 1
                return
            cpsat_searches += 1
        if budget_s is None:
            found = refine_structure(model, cluster, training, point, tables=tables, time_limit_s=None,
                                     deterministic_limit=DEFAULT_CPSAT_WORK)
        else:
            found = refine_structure(model, cluster, training, point, tables=tables,
                                     time_limit_s=max(min(PER_STRUCTURE_LIMIT_S, BUDGET_SHARE * left_s()), 0.05))
        if found is not None:
            refinements.append(dataclasses.replace(found, near_front=is_near))

    for point in front.points:
        key = structure_key(point.plan)
        if point.plan.pp < 2 or key in seen:
            continue
        seen.add(key)
        consider(point, is_near=False)
    front_structures = len(seen)
    candidates = []
    if near_front and left_s() > 0 and (budget_s is not None or DEFAULT_NEAR_STRUCTURES > 0):
        candidates = (near_front_candidates(front, controls, extra_rules, exclude=seen) if budget_s is not None else
                      near_front_candidates(front, controls, extra_rules, exclude=seen,
                                            seeds=DEFAULT_NEAR_SEEDS, resplit=False))
        for point in candidates:
            consider(point, is_near=True)
    # a structure only a layout runs (its parent's split is not whole) enters with its best layout even when that is
    # the balanced one: its parent is a price, not a plan
    # and a layout must pass the layout's own rules (costmodels.rules.layout_breaks: block recompute of n layers needs
    # a virtual stage of more than n, which the search's tables do not see)
    problem = Problem(model, cluster, training)
    layout_plans = [with_layout(r.parent.plan, r.best_layout) for r in refinements
                    if r.best_layout != r.uniform_layout or not split_is_whole(model, r.parent.plan)]
    added = plan_estimates(model, cluster, training, [p for p in layout_plans if not layout_breaks(problem, p)],
                           relax=front.relaxed_rules)
    points = list(front.points) + [p for p in added if not p.violations]
    kept = [p for p in points
            if not any((q.step_time_s <= p.step_time_s and q.peak_memory_bytes <= p.peak_memory_bytes)
                       and (q.step_time_s < p.step_time_s or q.peak_memory_bytes < p.peak_memory_bytes)
                       for q in points)]
    kept.sort(key=lambda p: (p.step_time_s, p.peak_memory_bytes))
    improved = [r for r in refinements if r.best_layout != r.uniform_layout]
    only_layout = sum(1 for r in refinements if not split_is_whole(model, r.parent.plan))
    near = [r for r in refinements if r.near_front]
    on_front = sum(1 for p in kept if p.plan.layout)
    limit = (f"budget {budget_s:g} s" if budget_s is not None else
             f"default work: up to {DEFAULT_FRONT_STRUCTURES} front and {DEFAULT_NEAR_STRUCTURES} near-front "
             f"structures, {DEFAULT_CPSAT_SEARCHES} with interleaving (CP-SAT)")
    note = (f"layouts: searched {len(refinements)} pipelined structures in {time.perf_counter() - start:.1f} s "
            f"({limit}; {len(refinements) - len(near)} of {front_structures} on the front, "
            f"{len(near)} of {len(candidates)} near-front candidates; {bounded_out} skipped: their gain bound "
            f"rules a gain or an overtake out); {len(improved)} with a better layout, {on_front} layout plan"
            f"{'s' if on_front != 1 else ''} on the front")
    if only_layout:
        note += (f"; {only_layout} structure{'s' if only_layout != 1 else ''} no first/last split runs (the layers do "
                 "not split over pp·vpp) searched through layouts alone")
    if improved:
        top = max(improved, key=lambda r: r.gain)
        note += f"; largest gain {100 * top.gain:.1f}% on {top.parent.plan.short()}"
    if any(not r.proven_optimal for r in refinements):
        note += "; some searches hit their time limit (best found used)"
    if skipped[False] or skipped[True]:
        note += (f"; left unsearched: {skipped[False]} front and {skipped[True]} near-front structures "
                 f"({'raise' if budget_s is not None else 'set'} --layouts-budget SECONDS to search more)")
    # proven_optimal stays the uniform search's: a layout can only add points, and the note says what was left
    return dataclasses.replace(front, points=tuple(kept), notes=tuple(front.notes) + (note,)), refinements


def explain_layout(model, cluster, training, plan, time_limit_s: float | None = PER_STRUCTURE_LIMIT_S
                   ) -> tuple[list[str], dict]:
    """Where a per-stage layout pays for `plan`'s structure: the plan's own layout against the best one, with every
    rank's per-microbatch time and peak memory before and after (the per-stage model's integers: ns, MiB)."""
    from costmodels.layout import (layout_space_log10, layout_tables, parent_plan, price_layout, prices_layouts,
                                   uniform_layout)

    if plan.pp < 2 or (not plan.layout and not prices_layouts(training)):
        return [], {}
    base = parent_plan(model, cluster, training, plan) if plan.layout else plan
    tables = layout_tables(model, cluster, training, base)
    own_layout = plan.layout or uniform_layout(model, base)
    own = price_layout(tables, own_layout)
    result = search_layout_that_fits(model, cluster, training, base, tables, own, own_layout, time_limit_s)
    best = result.best
    gain = 1.0 - best.objective_ns / own.objective_ns
    proof = "optimal" if result.proven_optimal else (
        "best found that fits (a faster one came out over memory)" if result.set_aside
        else "best found in the time limit")
    lines = [f"layout: {'|'.join(map(str, own.layout))} (decoder layers per virtual stage) -> "
             + ("already the best" if best is own else f"{'|'.join(map(str, best.layout))}, "
                f"{100 * gain:.1f}% faster step ({own.step_time_s:.3f} s -> {best.step_time_s:.3f} s per-stage model)")
             + f"; {result.engine}, {proof}, {result.elapsed_s:.2f} s over 10^{layout_space_log10(model.num_layers, plan.pp * plan.vpp):.0f} layouts"]
    if best is not own:
        slow_before, slow_after = own.bottleneck_rank, best.bottleneck_rank
        lines.append(f"  slowest rank {slow_before} at {own.rank_time_ns[slow_before] / 1e6:.2f} ms per micro-batch "
                     f"-> rank {slow_after} at {best.rank_time_ns[slow_after] / 1e6:.2f} ms; peak memory "
                     f"{own.peak_memory_mib / 1024:.1f} -> {best.peak_memory_mib / 1024:.1f} GiB")
        lines.append("  rank: layers, ms per micro-batch, GiB  before -> after")
        for rank in range(plan.pp):
            before = own.rank_dense[rank] + own.rank_moe[rank]
            after = best.rank_dense[rank] + best.rank_moe[rank]
            lines.append(f"  {rank:>4}: {before:>3} -> {after:<3} {own.rank_time_ns[rank] / 1e6:8.2f} -> "
                         f"{best.rank_time_ns[rank] / 1e6:<8.2f} {own.rank_memory_mib[rank] / 1024:6.1f} -> "
                         f"{best.rank_memory_mib[rank] / 1024:.1f}")
    document = {"layout": list(own.layout), "best_layout": list(best.layout), "gain": gain,
                "engine": result.engine, "proven_optimal": result.proven_optimal,
                "step_time_s": {"layout": own.step_time_s, "best_layout": best.step_time_s},
                "rank_time_s": {"layout": [t / 1e9 for t in own.rank_time_ns],
                                "best_layout": [t / 1e9 for t in best.rank_time_ns]},
                "rank_memory_bytes": {"layout": [m * 2**20 for m in own.rank_memory_mib],
                                      "best_layout": [m * 2**20 for m in best.rank_memory_mib]}}
    return lines, document
