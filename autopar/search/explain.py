"""Why nothing fits, and why a given plan is not on the front.

- `explain_infeasible`: when no plan satisfies the rules, a CP-SAT model of the rules alone, every rule and every
  user control (--fix, --min, --max) guarded by an assumption literal, gives the conflicting ones
  (`sufficient_assumptions_for_infeasibility`), shrunk to a minimal set by deletion. When the rules can be met but
  nothing fits in memory, the nearest plan (least peak memory, all other rules kept) and its shortfall are
  reported, with the smallest set of relaxable rules and controls that, together with `memory`, leave no plan.
- `explain_plan`: the rule a plan breaks, or the front point that dominates it, by how much, and which named
  step-time terms make the difference, in the words of the guide's "Training is slow" list.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autopar.errors import Infeasible, InputError
from autopar.results import ParetoFront
from autopar.search.space import Controls, SearchSpace, build_space
from costmodels.plan import PLAN_FIELDS, Plan, Recompute
from costmodels.rules import RULES_BY_ID, Problem, active_rules, check_plan
from costmodels.scoring import estimate as estimate_one
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec
from costmodels.units import GIB

MINIMISE_BUDGET_S = 20.0
"""Time spent shrinking a memory conflict to a minimal set; past it the set found so far is reported."""


# ---- controls as named assumptions ---------------------------------------------------------------------------

def control_items(controls: Controls) -> list[tuple[str, str, int]]:
    """(label, kind, value) of every user control, e.g. ("fix tp=3", "fix", 3)."""
    items = []
    for kind, mapping in (("fix", controls.fix), ("min", controls.minimum), ("max", controls.maximum)):
        for knob in sorted(mapping):
            items.append((f"{kind} {knob}={_shown(knob, mapping[knob])}", kind, mapping[knob]))
    return items


def _shown(knob: str, value: int) -> str:
    if knob == "recompute":
        return Recompute(value).label
    if knob == "sp":
        return "true" if value else "false"
    return str(value)


def without_control(controls: Controls, label: str) -> Controls:
    kind, _, assignment = label.partition(" ")
    knob = assignment.partition("=")[0]
    fix, minimum, maximum = dict(controls.fix), dict(controls.minimum), dict(controls.maximum)
    {"fix": fix, "min": minimum, "max": maximum}[kind].pop(knob, None)
    return replace(controls, fix=fix, minimum=minimum, maximum=maximum)


def _merged_space(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, controls: Controls) -> SearchSpace:
    """The candidates without the user's pins and bounds, plus the pinned values (so a pin can be blamed)."""
    free = build_space(model, cluster, training, Controls(relax=controls.relax))
    pinned = build_space(model, cluster, training, replace(controls, minimum={}, maximum={}))
    follows = free.etp_follows_tp and pinned.etp_follows_tp
    domains = {}
    for knob in set(free.domains) | set(pinned.domains) | ({"etp"} if not follows else set()):
        domains[knob] = tuple(sorted(set(free.domain(knob)) | set(pinned.domain(knob))))
    if follows:
        domains.pop("etp", None)
    return SearchSpace(splits=tuple(sorted(set(free.splits) | set(pinned.splits))),
                       recomputes=tuple(sorted(set(free.recomputes) | set(pinned.recomputes))),
                       domains=domains, etp_follows_tp=follows)


def structural_conflict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                        controls: Controls) -> tuple[str, ...] | None:
    """A minimal set of rules and controls that no plan can satisfy together, or None when they can be met."""
    from ortools.sat.python import cp_model

    from autopar.search import cpsat
    from autopar.search.tables import rule_table

    space = _merged_space(model, cluster, training, controls)
    problem = Problem(model, cluster, training)
    m = cp_model.CpModel()
    knobs = cpsat.knob_variables(m, space)
    cpsat.add_joint_domains(m, knobs, space)
    literals: dict[str, Any] = {}
    for rule in active_rules(controls.relax):
        if rule.id == "memory":
            continue
        literal = m.new_bool_var(rule.id)
        cpsat.add_table(m, knobs, rule_table(rule, space, problem), enforce=literal)
        literals[rule.id] = literal
    for label, kind, value in control_items(controls):
        knob = label.split(" ", 1)[1].partition("=")[0]
        literal = m.new_bool_var(label)
        var = knobs[knob]
        if kind == "fix":
            m.add(var == value).only_enforce_if(literal)
        elif kind == "min":
            m.add(var >= value).only_enforce_if(literal)
        else:
            m.add(var <= value).only_enforce_if(literal)
        literals[label] = literal

    def infeasible(names: Iterable[str]) -> tuple[bool, list[str]]:
        m.clear_assumptions()
        m.add_assumptions([literals[n] for n in names])
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = cpsat.RANDOM_SEED
        status = solver.solve(m)
        if status != cp_model.INFEASIBLE:
            return False, []
        core = {m.get_bool_var_from_proto_index(i).name
                for i in solver.sufficient_assumptions_for_infeasibility()}
        return True, [n for n in literals if n in core]

    names = list(literals)
    is_infeasible, core = infeasible(names)
    if not is_infeasible:
        return None
    core = core or names
    for name in list(core):                                   # deletion: keep only what the conflict needs
        trial = [n for n in core if n != name]
        if trial and infeasible(trial)[0]:
            core = trial
    return tuple(core)


# ---- memory conflicts -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NearestPlan:
    plan: Plan
    peak_memory_bytes: float
    worst_stage: int


def least_memory_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                      controls: Controls, jobs: int | None = None) -> NearestPlan | None:
    """The plan with the least peak memory among those meeting every rule but memory (None: no such plan).
    `jobs`: the search's processes (autopar.search.oracle.solve_oracle)."""
    from autopar.search.oracle import solve_oracle
    from costmodels.evaluate import evaluate

    try:
        space = build_space(model, cluster, training, controls)
    except Exception:  # noqa: BLE001 - a control that empties the space: no plan
        return None
    result = solve_oracle(space, Problem(model, cluster, training), active_rules(controls.relax),
                          enforce_memory=False, jobs=jobs)
    if len(result.memory_units) == 0:
        return None
    plan = result.plans.plan(int(np.argmin(result.memory_units)))
    evaluation = evaluate(model, cluster, training, [plan])
    return NearestPlan(plan, float(evaluation.peak_memory_bytes[0]), int(evaluation.worst_stage[0]))


def _fits(model, cluster, training, controls, jobs: int | None = None) -> bool:
    nearest = least_memory_plan(model, cluster, training, controls, jobs)
    return nearest is not None and nearest.peak_memory_bytes <= cluster.memory_limit_bytes


def memory_conflict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    controls: Controls, jobs: int | None = None) -> tuple[str, ...]:
    """`memory` plus a minimal set of relaxable rules and user controls without which some plan would fit."""
    start = time.perf_counter()
    relaxable = [r.id for r in active_rules(controls.relax) if r.relaxable]
    candidates = relaxable + [label for label, _, _ in control_items(controls)]
    needed: list[str] = []
    current = controls
    for name in candidates:
        if time.perf_counter() - start > MINIMISE_BUDGET_S:
            needed.append(name)
            continue
        trial = (replace(current, relax=current.relax + (name,)) if name in RULES_BY_ID
                 else without_control(current, name))
        if _fits(model, cluster, training, trial, jobs):
            needed.append(name)                # dropping it lets a plan fit: it is part of the conflict
        else:
            current = trial                    # not needed: leave it dropped
    return ("memory",) + tuple(needed)


def explain_infeasible(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       controls: Controls, jobs: int | None = None) -> Infeasible:
    conflict = structural_conflict(model, cluster, training, controls)
    inputs = (f"inputs: {model.name} ({model.num_layers} layers, {model.num_attention_heads} heads, "
              f"{model.num_kv_heads} KV heads"
              + (f", {model.moe.num_experts} experts" if model.moe else "")
              + f") on {cluster.num_gpus} × {cluster.profile.name} ({cluster.gpus_per_node} per node), "
              f"seq_len {training.seq_len}, global batch {training.global_batch_size}")
    if conflict is not None:
        details = tuple(_describe(name) for name in conflict) + (inputs,)
        return Infeasible(f"no plan satisfies the rules: {', '.join(conflict)} conflict", conflict, details)
    nearest = least_memory_plan(model, cluster, training, controls, jobs)
    assert nearest is not None, "the rules can be met but no plan was enumerated"
    limit = cluster.memory_limit_bytes
    shortfall = nearest.peak_memory_bytes - limit
    rules = memory_conflict(model, cluster, training, controls, jobs)
    unneeded = [r.id for r in active_rules(controls.relax) if r.relaxable and r.id not in rules]
    details = (
        f"nearest plan: {nearest.plan.short()} needs {nearest.peak_memory_bytes / GIB:.1f} GiB per GPU "
        f"(pipeline stage {nearest.worst_stage}), {shortfall / GIB:.1f} GiB over the limit of {limit / GIB:.1f} GiB "
        f"({1 - cluster.headroom:.0%} of {cluster.profile.hbm_bytes / GIB:.0f} GiB; --headroom {cluster.headroom:g})",
    ) + tuple(_describe(name) for name in rules) + (
        (f"these conflict even with {', '.join(unneeded)} relaxed",) if unneeded and len(rules) > 1 else ()
    ) + (
        inputs,
        "more GPUs, GPUs with more memory, a smaller --headroom, or relaxing a listed rule may help",
    )
    return Infeasible(f"no plan fits in memory: the least-memory plan is {shortfall / GIB:.1f} GiB over the "
                      f"per-GPU limit", rules, details)


def _describe(name: str) -> str:
    rule = RULES_BY_ID.get(name)
    if rule is None:
        return f"{name}: your --{name.split(' ', 1)[0]}"
    relax = " (relaxable: --relax " + name + ")" if rule.relaxable else ""
    return f"{name}: {rule.reason} [{rule.source}]{relax}"


# ---- why a plan is not on the front ----------------------------------------------------------------------------

TERM_CAUSES = {
    "pp_bubble": "pipeline bubble: too much PP for the number of microbatches (guide: 'Too much PP')",
    "pp_p2p": "pipeline stage-to-stage transfers (PP; only interleaving's steady-state backward sends overlap)",
    "tp_comm": "TP communication on every layer (guide: 'Too much TP')",
    "cp_comm": "CP ring exchange of K/V",
    "ep_comm": "EP all-to-all dispatch and combine",
    "host": "the host: kernel launches the GPU waits for and the queue drained at each host synchronisation "
            "(small kernels: small micro-batch, high TP, narrow experts, a fast GPU; MoE dispatch syncs; DTensor's "
            "dispatch of every operator under eager TP in torchtitan or a plain loop; DeepSpeed ZeRO-3's hooks on "
            "every submodule)",
    "dp_comm": "data-parallel gradient synchronisation (exposed, plus the SMs its overlapped part takes)",
    "optimizer": "optimizer step (and the host's synchronisations and launches around it; under DeepSpeed ZeRO-3 "
                 "its walk over every parameter)",
    "offload_copies": "fine-grained activation offloading: copies to and from host memory longer than the layers "
                      "they overlap (--offload-modules; the host link's rate)",
}


def _compute_cause(plan: Plan, better: Plan) -> str:
    if plan.recompute > better.recompute or (plan.recompute == better.recompute == Recompute.FULL
                                             and (plan.recompute_layers == 0) > (better.recompute_layers == 0)):
        if better.recompute == Recompute.NONE:
            rerun = "whole layers" if plan.recompute == Recompute.FULL else "the selected modules"
            return (f"recomputation the better point does without ({plan.recompute.label} recompute re-runs {rerun} "
                    "in the backward; that point fits with none)")
        if plan.recompute == better.recompute:
            return ("excessive recomputation: every layer re-run where the better point re-runs some of them "
                    "(--recompute-layers)")
        return "excessive recomputation (guide: use 'selective' instead of 'full')"
    if plan.mbs < better.mbs:
        return "micro-batch too small, so smaller, less efficient GEMMs (guide: increase micro_batch_size)"
    if plan.tp > better.tp:
        return "narrower GEMMs from more TP"
    return "GEMM time"


@dataclass(frozen=True)
class PlanExplanation:
    plan: Plan
    verdict: str
    """'breaks_rules', 'on_front', 'ties_front', 'beats_front' (a plan outside the search controls that no point of
    the front searched within them dominates) or 'dominated'."""
    lines: tuple[str, ...]
    broken_rules: tuple[str, ...] = ()
    front_index: int | None = None
    term_differences_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": {k: getattr(self.plan, k) if k != "recompute" else self.plan.recompute.label
                         for k in PLAN_FIELDS},
                "label": self.plan.short(), "verdict": self.verdict, "broken_rules": list(self.broken_rules),
                "front_index": self.front_index, "term_differences_s": self.term_differences_s,
                "explanation": list(self.lines)}


def outside_controls(plan: Plan, controls: Controls) -> tuple[str, ...]:
    """The user's controls (--fix, --min, --max) that `plan` does not satisfy, as labels like "fix sp=false"."""
    outside = []
    for label, kind, value in control_items(controls):
        knob = label.split(" ", 1)[1].partition("=")[0]
        mine = int(getattr(plan, knob))
        if (kind == "fix" and mine != value) or (kind == "min" and mine < value) or (kind == "max" and mine > value):
            outside.append(label)
    return tuple(outside)


def explain_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                 front: ParetoFront, relax: Iterable[str] = (), controls: Controls | None = None) -> PlanExplanation:
    """Why `plan` is or is not on `front` (which must be the front of the same inputs, searched within `controls`).
    A plan outside the controls is still compared with that front, and the first line says which controls it
    leaves."""
    outside = outside_controls(plan, controls) if controls is not None else ()
    note = (f"outside your search controls ({', '.join(outside)}): compared with the front searched within them",) \
        if outside else ()
    explanation = _explain_against_front(model, cluster, training, plan, front, relax, outside=bool(outside))
    return replace(explanation, lines=note + explanation.lines) if note else explanation


TIE_TIME_S = 2e-6
TIE_MEMORY_BYTES = 2 * 2 ** 20
"""How close to a front point an undominated plan outside the controls must be to count as a tie: the search's
rounding (its integer objectives are µs and MiB), with a unit of slack for the two roundings. Inside the controls an
undominated plan can only be such a tie."""


def _explain_against_front(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                           front: ParetoFront, relax: Iterable[str], outside: bool = False) -> PlanExplanation:
    broken = check_plan(model, cluster, training, plan, relax=relax)
    if broken:
        problem = Problem(model, cluster, training)
        lines = tuple(f"breaks rule {name}: {RULES_BY_ID[name].why_broken(problem, plan)}"
                      for name in broken if name != "memory")
        if "memory" in broken:
            try:
                mine = estimate_one(model, cluster, training, plan, relax=tuple(relax))
                lines += (f"breaks rule memory: needs {mine.peak_memory_bytes / GIB:.1f} GiB on stage "
                          f"{mine.worst_stage}, over the {cluster.memory_limit_bytes / GIB:.1f} GiB limit",)
            except InputError:  # a plan broken enough that it cannot be estimated
                lines += ("breaks rule memory",)
        return PlanExplanation(plan, "breaks_rules", lines, broken_rules=broken)
    mine = estimate_one(model, cluster, training, plan, relax=tuple(relax))
    my_time = mine.step_time_s
    for i, point in enumerate(front.points):
        if point.plan == plan:
            return PlanExplanation(plan, "on_front", (f"on the front: point #{i}",), front_index=i)
    dominating = [(i, p) for i, p in enumerate(front.points)
                  if p.step_time_s <= my_time * (1 + 1e-9) and p.peak_memory_bytes <= mine.peak_memory_bytes * (1 + 1e-9)]
    if not dominating:
        nearest = min(range(len(front.points)),
                      key=lambda i: abs(front.points[i].step_time_s - my_time)
                      + abs(front.points[i].peak_memory_bytes - mine.peak_memory_bytes) / GIB)
        point = front.points[nearest]
        ties = abs(point.step_time_s - my_time) <= TIE_TIME_S and \
            abs(point.peak_memory_bytes - mine.peak_memory_bytes) <= TIE_MEMORY_BYTES
        if ties or not outside:
            return PlanExplanation(plan, "ties_front", (
                f"not dominated: it ties front point #{nearest} ({point.plan.short()}) within the rounding of the "
                "search (1 µs, 1 MiB); the front lists the plan first in the tie-break order",), front_index=nearest)
        within = [i for i, p in enumerate(front.points) if p.peak_memory_bytes <= mine.peak_memory_bytes]
        at_memory = front.points[within[0]] if within else None
        versus = (f"the fastest front point at or below its memory, #{within[0]} ({at_memory.plan.short()}), "
                  f"takes {at_memory.step_time_s:.3f} s against its {my_time:.3f} s"
                  if at_memory is not None else
                  f"every front point needs more memory than its {mine.peak_memory_bytes / GIB:.1f} GiB")
        return PlanExplanation(plan, "beats_front", (
            f"not dominated: no point of the front searched within your controls is as fast at this memory; "
            f"{versus} ({mine.peak_memory_bytes / GIB:.1f} GiB); loosen the controls to search it",),
            front_index=within[0] if within else None)
    # the fastest front point at or below this plan's memory
    index, better = min(dominating, key=lambda ip: (ip[1].step_time_s, ip[0]))
    differences = {term: mine.time_terms_s.get(term, 0.0) - better.time_terms_s.get(term, 0.0)
                   for term in set(mine.time_terms_s) | set(better.time_terms_s)}
    slower = my_time - better.step_time_s
    lines = [f"dominated by front point #{index} ({better.plan.short()}): {slower:.3f} s "
             f"({slower / better.step_time_s:.1%}) slower per step, "
             f"{(mine.peak_memory_bytes - better.peak_memory_bytes) / GIB:+.1f} GiB peak memory"]
    # every term that moves by at least 1% of the gap, costs first then savings, so the lines add up to the gap
    for term, delta in sorted(differences.items(), key=lambda kv: -kv[1]):
        if abs(delta) < 0.01 * max(slower, 1e-12):
            continue
        if delta > 0:
            cause = _compute_cause(plan, better.plan) if term == "compute" else TERM_CAUSES.get(term, term)
            lines.append(f"  +{delta:.3f} s {term}: {cause}")
        else:
            lines.append(f"  {delta:.3f} s {term}: this plan spends less here than #{index}")
    shown = sum(d for d in differences.values() if abs(d) >= 0.01 * max(slower, 1e-12))
    if abs(shown - slower) > 0.005 * max(slower, 1e-12):
        lines.append(f"  {slower - shown:+.3f} s in smaller terms")
    return PlanExplanation(plan, "dominated", tuple(lines), front_index=index,
                           term_differences_s={k: float(v) for k, v in sorted(differences.items())})


__all__ = [
    "PlanExplanation",
    "explain_infeasible",
    "explain_plan",
    "outside_controls",
    "least_memory_plan",
    "memory_conflict",
    "structural_conflict",
]
