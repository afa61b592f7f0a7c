"""`autopar.remedies`: the guide's answer when a plan does not fit, applied step by step with the computed cost.

`remedies(...)` answers "memory exceeds GPU capacity" the way the Parallelism Strategies Guide's troubleshooting
section does (shared/seeds/000_813f7baad2e6f9ee.txt), in its order:

    1. enable the distributed optimizer (zero=1)   4. increase PP
    2. full activation recomputation               5. increase EP (MoE only)
    3. increase TP                                 6. reduce the micro-batch size

Each remedy is applied *cumulatively* on top of the ones before it (as an engineer following the list would), with
the *computed* peak memory and step time after it, and the walk stops at the first remedy after which the plan
fits. TP, PP and EP are raised step by step through the values the rules allow (the guide's "increase TP
incrementally ... stop when memory fits"); the micro-batch is lowered the same way. A remedy is skipped, with the
rule it would break, when no value of its knob satisfies the rules (TP beyond a node, PP not dividing the layers,
a GPU count the new sizes do not divide, ...), and it is not kept when it would not lower the peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from costmodels.evaluate import evaluate
from costmodels.plan import PLAN_FIELDS, Plan, PlanArrays, Recompute, plan_to_dict
from costmodels.scoring import rule_violations
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec
from costmodels.units import whole_bytes

# ---- remedies --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Remedy:
    """One step of the guide's "Memory exceeds GPU capacity" list, applied on top of the steps before it."""

    name: str
    """'distributed_optimizer', 'full_recompute', 'more_tp', 'more_pp', 'more_ep' or 'smaller_mbs'."""
    title: str
    """The guide's wording."""
    applied: bool
    change: str = ""
    """What changed, e.g. 'tp 4→8'; empty when skipped."""
    plan: Plan | None = None
    """The plan after this step and every applied step before it (None when skipped)."""
    peak_memory_bytes: float | None = None
    step_time_s: float | None = None
    fits_memory: bool = False
    """The plan after this step is within the memory limit."""
    still_breaks: tuple[str, ...] = ()
    """Rules (other than memory; relaxed ones excepted) the plan after this step still breaks: guide rules the
    user's own plan broke, which the memory remedies tolerate but do not repair."""
    skipped_because: str = ""
    broken_rules: tuple[str, ...] = ()
    """Rules that blocked the step (empty when applied, or skipped for another reason)."""

    @property
    def fits(self) -> bool:
        """A fit: within the memory limit AND breaking no rule. Never true for a plan that breaks a rule."""
        return self.applied and self.fits_memory and not self.still_breaks

    def to_dict(self, num_gpus: int) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "applied": self.applied, "change": self.change,
                "plan": plan_to_dict(self.plan, num_gpus) if self.plan is not None else None,
                "label": self.plan.short() if self.plan is not None else None,
                "peak_memory_bytes": whole_bytes(self.peak_memory_bytes) if self.peak_memory_bytes is not None
                else None,
                "step_time_s": self.step_time_s, "fits": self.fits, "fits_memory": self.fits_memory,
                "still_breaks": list(self.still_breaks),
                "skipped_because": self.skipped_because, "broken_rules": list(self.broken_rules)}


@dataclass(frozen=True)
class _Step:
    name: str
    title: str
    candidates: Callable[[ModelSpec, ClusterSpec, Plan], "list[Plan] | str"]
    """Plans to try in order (one knob moved further each time), or the reason the step does not apply."""


def _distributed_optimizer(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> "list[Plan] | str":
    if plan.zero >= 1:
        return f"already sharded (zero={plan.zero})"
    return [dataclasses.replace(plan, zero=1)]


def _full_recompute(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> "list[Plan] | str":
    if plan.recompute is Recompute.FULL and plan.recompute_layers == 0:
        return "already on"
    return [dataclasses.replace(plan, recompute=Recompute.FULL, recompute_layers=0)]


def _more_tp(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> "list[Plan] | str":
    # Sequence parallelism comes with TP (the guide's configurations all pair them); experts follow TP when they
    # followed it before (Megatron's default etp = tp).
    return [dataclasses.replace(plan, tp=tp, sp=True, etp=tp if plan.etp == plan.tp else plan.etp)
            for tp in _larger_divisors(cluster.num_gpus, plan.tp)] or f"tp={plan.tp} already uses every GPU"


def _more_pp(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> "list[Plan] | str":
    return [dataclasses.replace(plan, pp=pp, first_stage_layers=0, last_stage_layers=0)
            for pp in _larger_divisors(cluster.num_gpus, plan.pp)] or f"pp={plan.pp} already uses every GPU"


def _more_ep(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> "list[Plan] | str":
    if model.moe is None:
        return "MoE only; the model is dense"
    return [dataclasses.replace(plan, ep=ep) for ep in _larger_divisors(cluster.num_gpus, plan.ep)] \
        or f"ep={plan.ep} already uses every GPU"


def _smaller_mbs(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> "list[Plan] | str":
    if plan.mbs == 1:
        return "already 1"
    return [dataclasses.replace(plan, mbs=mbs) for mbs in range(plan.mbs - 1, 0, -1)]


def _larger_divisors(num_gpus: int, current: int) -> list[int]:
    """Sizes above `current` that can divide the GPU count, smallest first."""
    return [size for size in range(current + 1, num_gpus + 1) if num_gpus % size == 0]


REMEDY_STEPS: tuple[_Step, ...] = (
    _Step("distributed_optimizer", "Enable distributed optimizer", _distributed_optimizer),
    _Step("full_recompute", 'Enable recompute_granularity: "full"', _full_recompute),
    _Step("more_tp", "Increase TP", _more_tp),
    _Step("more_pp", "Increase PP", _more_pp),
    _Step("more_ep", "Increase EP (MoE only)", _more_ep),
    _Step("smaller_mbs", "Reduce micro_batch_size", _smaller_mbs),
)
"""The guide's troubleshooting order for "Memory exceeds GPU capacity"."""


def remedies(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
             relax: Iterable[str] = ()) -> tuple[Remedy, ...]:
    """The guide's remedies, applied cumulatively until the plan fits in memory; empty when it already does.

    A step may not break a new rule (rules in `relax`, and guide rules the user's own plan already breaks, are
    tolerated). Those tolerated guide rules are not repaired by a memory remedy, so a step whose plan still breaks
    one is within memory (`fits_memory`) but never a fit (`fits`), and says which rules it still breaks.
    """
    current = _score(model, cluster, training, [plan])[0]
    if current.fits:
        return ()
    relax = tuple(relax)
    tolerated = frozenset(relax) | frozenset(rule_violations(model, cluster, training, plan, relax))
    steps: list[Remedy] = []
    for step in REMEDY_STEPS:
        remedy, current = _apply(step, model, cluster, training, current, tolerated, relax)
        steps.append(remedy)
        if remedy.applied and remedy.fits_memory:  # the later steps are memory remedies too: nothing more to gain
            break
    return tuple(steps)


@dataclass(frozen=True)
class ScoredPlan:
    """A plan with the two numbers a remedy step compares: peak memory and step time (one evaluate() call)."""

    plan: Plan
    peak_memory_bytes: float
    step_time_s: float
    fits: bool


def _score(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: Iterable[Plan]) -> list[ScoredPlan]:
    plans = list(plans)
    evaluation = evaluate(model, cluster, training, PlanArrays.from_plans(plans))
    return [ScoredPlan(plan, float(evaluation.peak_memory_bytes[i]), float(evaluation.step_time_s[i]),
                    bool(evaluation.peak_memory_bytes[i] <= cluster.memory_limit_bytes))
            for i, plan in enumerate(plans)]


def _apply(step: _Step, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, current: ScoredPlan,
           tolerated: frozenset[str], relax: tuple[str, ...] = ()) -> tuple[Remedy, ScoredPlan]:
    """Try one step on top of `current`: the first rule-abiding candidate that fits, else the lowest-memory one.

    Rules in `tolerated` (relaxed, or guide rules the user's own plan already breaks) do not block a step.
    """
    candidates = step.candidates(model, cluster, current.plan)
    if isinstance(candidates, str):
        return Remedy(step.name, step.title, applied=False, skipped_because=candidates), current
    valid, first_block = [], None
    for candidate in candidates:
        broken = {rule: reason for rule, reason in rule_violations(model, cluster, training, candidate).items()
                  if rule not in tolerated}
        if broken:
            first_block = first_block or (candidate, broken)
        else:
            valid.append(candidate)
    if not valid:
        candidate, broken = first_block
        rule, text = next(iter(broken.items()))  # the first in DESIGN.md §3 order; the rest often follow from it
        others = f" (also {', '.join(list(broken)[1:])})" if len(broken) > 1 else ""
        return Remedy(step.name, step.title, applied=False, broken_rules=tuple(broken),
                      skipped_because=f"{_change(current.plan, candidate)} breaks rule {rule}: "
                                      f"{text.split('; ')[0]}{others}"), current
    scored = _score(model, cluster, training, valid)
    chosen = next((s for s in scored if s.fits), min(scored, key=lambda s: s.peak_memory_bytes))
    if chosen.peak_memory_bytes >= current.peak_memory_bytes:
        return Remedy(step.name, step.title, applied=False,
                      skipped_because=f"{_change(current.plan, chosen.plan)} does not lower peak memory"), current
    still_breaks = tuple(rule_violations(model, cluster, training, chosen.plan, relax))
    return Remedy(step.name, step.title, applied=True, change=_change(current.plan, chosen.plan), plan=chosen.plan,
                  peak_memory_bytes=chosen.peak_memory_bytes, step_time_s=chosen.step_time_s,
                  fits_memory=chosen.fits, still_breaks=still_breaks), chosen


def _change(before: Plan, after: Plan) -> str:
    """'tp 4→8, sp off→on': the knobs that differ, in DESIGN.md §1 names."""
    parts = []
    etp_follows_tp = before.etp == before.tp and after.etp == after.tp  # Megatron's default: not worth a word
    for name in PLAN_FIELDS:
        old, new = getattr(before, name), getattr(after, name)
        if old != new and not (name == "etp" and etp_follows_tp):
            show = (lambda v: v.label) if name == "recompute" else \
                (lambda v: "on" if v else "off") if name == "sp" else str
            parts.append(f"{name} {show(old)}→{show(new)}")
    return ", ".join(parts)
