"""`autopar solve --layouts`: refine a front with per-stage pipeline layouts, and recompute it.

For every pipelined structure on the front (its knobs without the first/last split, which a layout subsumes), the
exact layout search (autopar.search.layouts: the chain DP without interleaving, CP-SAT with it) finds the fastest
layout that fits. Where it beats the structure's own (uniform) layout under the per-stage model, the layout plan is
added, priced by autopar.layout_estimate (the parent's estimate less exactly the per-stage model's gain); then the
Pareto front over step time and peak memory is recomputed. Structures are refined fastest first until the time
budget is spent; the notes say how many were refined and what was found.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from autopar.results import Estimate, ParetoFront

DEFAULT_BUDGET_S = 4.0
"""Time the refinement may take by default (tables, searches and estimates together)."""
PER_STRUCTURE_LIMIT_S = 2.0
"""CP-SAT time limit for one structure (its best layout so far is used, marked not proven, when it runs out)."""


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

    @property
    def gain(self) -> float:
        return 1.0 - self.best_ns / self.uniform_ns if self.uniform_ns else 0.0


def structure_key(plan) -> object:
    return dataclasses.replace(plan, first_stage_layers=0, last_stage_layers=0, layout=())


def refine_structure(model, cluster, training, point: Estimate, time_limit_s: float | None = PER_STRUCTURE_LIMIT_S
                     ) -> Refinement | None:
    from autopar.search.layouts import best_layout
    from costmodels.layout import layout_space_log10, layout_tables, price_layout, uniform_layout

    plan = point.plan
    if plan.pp < 2 or plan.layout:
        return None
    start = time.perf_counter()
    tables = layout_tables(model, cluster, training, plan)
    uniform = uniform_layout(model, plan)
    own = price_layout(tables, uniform)
    result = best_layout(tables, time_limit_s=time_limit_s, hint=uniform)
    best = result.best if result.best is not None and result.best.objective_ns < own.objective_ns else own
    return Refinement(parent=point, uniform_layout=uniform, best_layout=best.layout, uniform_ns=own.objective_ns,
                      best_ns=best.objective_ns, engine=result.engine, search_s=time.perf_counter() - start,
                      proven_optimal=result.proven_optimal,
                      space_log10=layout_space_log10(model.num_layers, plan.pp * plan.vpp))


def refine_front(front: ParetoFront, budget_s: float = DEFAULT_BUDGET_S) -> tuple[ParetoFront, list[Refinement]]:
    from costmodels.scoring import estimate

    start = time.perf_counter()
    model, cluster, training = front.model, front.cluster, front.training
    refinements: list[Refinement] = []
    seen: set = set()
    skipped = 0
    for point in front.points:
        key = structure_key(point.plan)
        if point.plan.pp < 2 or key in seen:
            continue
        seen.add(key)
        left = budget_s - (time.perf_counter() - start)
        if left <= 0:
            skipped += 1
            continue
        found = refine_structure(model, cluster, training, point, time_limit_s=min(PER_STRUCTURE_LIMIT_S, left))
        if found is not None:
            refinements.append(found)
    added = []
    for r in refinements:
        if r.best_layout != r.uniform_layout:
            plan = dataclasses.replace(r.parent.plan, layout=r.best_layout)
            added.append(estimate(model, cluster, training, plan, relax=front.relaxed_rules))
    points = list(front.points) + [p for p in added if not p.violations]
    kept = [p for p in points
            if not any((q.step_time_s <= p.step_time_s and q.peak_memory_bytes <= p.peak_memory_bytes)
                       and (q.step_time_s < p.step_time_s or q.peak_memory_bytes < p.peak_memory_bytes)
                       for q in points)]
    kept.sort(key=lambda p: (p.step_time_s, p.peak_memory_bytes))
    improved = [r for r in refinements if r.best_layout != r.uniform_layout]
    note = (f"layouts: {len(refinements)} pipelined front structures searched in {time.perf_counter() - start:.1f} s"
            f" (chain DP without interleaving, CP-SAT with it), {len(improved)} with a better layout")
    if improved:
        top = max(improved, key=lambda r: r.gain)
        note += f"; largest gain {100 * top.gain:.1f}% on {top.parent.plan.short()}"
    if any(not r.proven_optimal for r in refinements):
        note += "; some searches hit their time limit (best found used)"
    if skipped:
        note += f"; {skipped} structures left unrefined (time budget {budget_s:g} s)"
    return dataclasses.replace(front, points=tuple(kept), notes=tuple(front.notes) + (note,),
                               proven_optimal=front.proven_optimal and not skipped), refinements


def explain_layout(model, cluster, training, plan, time_limit_s: float | None = PER_STRUCTURE_LIMIT_S
                   ) -> tuple[list[str], dict]:
    """Where a per-stage layout pays for `plan`'s structure: the plan's own layout against the best one, with every
    rank's per-microbatch time and peak memory before and after (the per-stage model's integers: ns, MiB)."""
    from autopar.search.layouts import best_layout
    from costmodels.layout import layout_space_log10, layout_tables, parent_plan, price_layout, uniform_layout

    if plan.pp < 2:
        return [], {}
    base = parent_plan(model, cluster, training, plan) if plan.layout else plan
    tables = layout_tables(model, cluster, training, base)
    own_layout = plan.layout or uniform_layout(model, base)
    own = price_layout(tables, own_layout)
    result = best_layout(tables, time_limit_s=time_limit_s, hint=own_layout)
    best = result.best if result.best is not None and result.best.objective_ns < own.objective_ns else own
    gain = 1.0 - best.objective_ns / own.objective_ns
    proof = "optimal" if result.proven_optimal else "best found in the time limit"
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
