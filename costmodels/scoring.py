"""Scoring one plan: memory of every pipeline stage by named term, step time by term, throughput, broken rules.

`estimate(model, cluster, training, plan)` evaluates one plan through the same code path as the solver
(`costmodels.evaluate.evaluate` for step time and throughput) and adds the memory of *every* pipeline rank
(`costmodels.memory.memory_terms_bytes`), so a report can show which stage is the tight one and why. The rules come
from `costmodels.rules`, so estimate and solve agree on what is allowed; the memory verdict comes from the stage
memory computed here (each number once: the per-stage terms, and the peak as their maximum).

`Estimate` and `StageMemory` are plain frozen data in base units (bytes, seconds); `to_dict()` is the JSON-ready
form every report shares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from costmodels.errors import InputError
from costmodels.evaluate import throughput
from costmodels.memory import memory_terms_bytes
from costmodels.plan import Plan, PlanArrays, Recompute, layers_on_stage, num_microbatches, plan_to_dict
from costmodels.rules import RULES_BY_ID, Problem, active_rules, plan_violations
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec
from costmodels.steptime import require_precision_supported, step_time_terms_s
from costmodels.units import whole_bytes, whole_number

MEMORY_RULE = "memory"


# ---- the result ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageMemory:
    """Memory of one GPU on one pipeline rank, by named term (they sum to total_bytes)."""

    stage: int
    layers: float
    """Decoder layers on this rank."""
    terms_bytes: dict[str, float]

    @property
    def total_bytes(self) -> float:
        return sum(self.terms_bytes.values())

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "layers": whole_number(float(self.layers)),
                "total_bytes": whole_bytes(self.total_bytes),
                "terms_bytes": {term: whole_bytes(value) for term, value in self.terms_bytes.items()}}


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on one plan: memory per stage, step time by term, throughput, rule violations."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    plan: Plan
    num_microbatches: float
    stages: tuple[StageMemory, ...]
    """Every pipeline rank, in order."""
    worst_stage: int
    time_terms_s: dict[str, float]
    """Named step-time terms; they sum to step_time_s."""
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    violations: tuple[str, ...] = ()
    """Names of the rules this plan breaks (memory included); empty when feasible."""

    @property
    def dp(self) -> int:
        return self.plan.dp(self.cluster.num_gpus)

    @property
    def peak_memory_bytes(self) -> float:
        return self.stages[self.worst_stage].total_bytes

    @property
    def memory_limit_bytes(self) -> float:
        return self.cluster.memory_limit_bytes

    @property
    def step_time_s(self) -> float:
        return sum(self.time_terms_s.values())

    @property
    def fits(self) -> bool:
        """Within the memory limit: the one definition of "fits" that solve, estimate and every report use."""
        return self.peak_memory_bytes <= self.memory_limit_bytes

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": plan_to_dict(self.plan, self.cluster.num_gpus),
            "num_gpus": self.cluster.num_gpus,
            "label": self.plan.short(),
            "num_microbatches": whole_number(float(self.num_microbatches)),
            "peak_memory_bytes": whole_bytes(self.peak_memory_bytes),
            "memory_limit_bytes": whole_bytes(self.memory_limit_bytes),
            "fits": self.fits,
            "worst_stage": self.worst_stage,
            "stages": [s.to_dict() for s in self.stages],
            "step_time_s": self.step_time_s,
            "time_terms_s": dict(self.time_terms_s),
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "violations": list(self.violations),
        }


# ---- checks ----------------------------------------------------------------------------------------------------

def rule_violations(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                    relax: Iterable[str] = ()) -> dict[str, str]:
    """Every rule (DESIGN.md §3) except `memory` that `plan` breaks: rule name -> one-line reason with the fix.

    The wording, with the plan's numbers, comes from each rule's own `explain` (`Rule.why_broken`). Rules in `relax`
    are not checked (only relaxable ones may be named; see `costmodels.rules.active_rules`).
    """
    problem = Problem(model, cluster, training)
    names = plan_violations(problem, plan, active_rules(relax))
    return {name: RULES_BY_ID[name].why_broken(problem, plan) for name in names}


_RULE_FIELDS = {"world": "num_gpus", "heads": "tp", "layers": "pp", "experts": "ep", "sp_needs_tp": "sp",
                "moe_needs_sp": "sp", "cp_seq": "seq_len", "batch": "global_batch_size", "vpp": "vpp",
                "recompute": "recompute_layers", "zero_bubble_vpp": "vpp", "zero_bubble_recompute": "recompute",
                "fp8_delayed_recompute": "recompute_modules", "cuda_graph_recompute": "recompute"}
"""The input each build rule's message names (CLI flags in DESIGN.md §1 names)."""


def require_buildable(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                      relax: Iterable[str] = ()) -> dict[str, str]:
    """Raise InputError for the first broken rule Megatron needs; return the guide rules the plan breaks.

    The guide's rules (`Rule.relaxable` in costmodels.rules: tp_node, cp_needs_sp_tp) are advice Megatron runs
    without, so breaking one is reported in `Estimate.violations`; breaking any other rule means Megatron-LM cannot
    build the plan at all: a bad input (CLI exit 2).
    """
    if plan.recompute_layers and plan.recompute is not Recompute.FULL:
        raise InputError("recompute_layers", "only applies with --recompute full; drop --recompute-layers")
    broken = rule_violations(model, cluster, training, plan, relax)
    # tp against the heads first (tp=3 is wrong for 32 heads whatever num_gpus is), then the GPU count, then the
    # rest (a batch that does not split is usually a consequence of the two)
    first = {"heads": 0, "world": 1}
    for rule, reason in sorted(broken.items(), key=lambda item: first.get(item[0], 2)):
        if not RULES_BY_ID[rule].relaxable:
            raise InputError(_RULE_FIELDS.get(rule, rule), f"{reason} (rule {rule})")
    return broken


# ---- the estimate ----------------------------------------------------------------------------------------------

INPUT_TYPES = {"model": (ModelSpec, "autopar.load_model('llama-3.1-8b')"),
               "cluster": (ClusterSpec, "autopar.make_cluster(gpu='h100', num_gpus=8)"),
               "training": (TrainingSpec, "autopar.Training(seq_len=4096, global_batch_size=512)"),
               "plan": (Plan, "autopar.Plan(tp=8, pp=4)")}
"""What each argument of the Python API is, and how to make one (require_input_types)."""


def require_input_types(**arguments: object) -> None:
    """InputError naming the first argument (model, cluster, training, plan) that is not the spec the API takes, and
    how to build one: a planner passing a model name or a dict gets that, not an AttributeError deep inside."""
    for name, value in arguments.items():
        kind, example = INPUT_TYPES[name]
        if not isinstance(value, kind):
            shown = repr(value) if isinstance(value, (str, int, float)) else type(value).__name__
            raise InputError(name, f"give a {kind.__name__}, e.g. {example}; got {shown[:60]}")


def estimate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
             relax: Iterable[str] = ()) -> Estimate:
    """Memory of every pipeline stage, step time by term, throughput and broken rules of one plan.

    Raises InputError when an argument is not the spec it names (require_input_types), or the plan cannot be built
    at all (a rule that is not relaxable, or the precision is not supported by the GPU); guide rules (unless
    relaxed) and `memory` come back in `Estimate.violations`.
    """
    require_input_types(model=model, cluster=cluster, training=training, plan=plan)
    return plan_estimates(model, cluster, training, [plan], relax)[0]


def plan_estimates(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: Sequence[Plan],
                   relax: Iterable[str] = ()) -> tuple[Estimate, ...]:
    """`estimate` of each plan, in order, the plans without a layout (and the parents of those with one) priced in
    one vectorised evaluation: each gets the same numbers as alone (the cost functions are elementwise over plans).
    Raises InputError for the first plan that cannot be built. A plan with a layout is checked against the layout's
    own rules (costmodels.rules.layout_breaks), not its parent's split, which may not be whole
    (costmodels.layout.parent_plan): its parent is priced, never built."""
    from costmodels.layout import parent_plan

    require_precision_supported(cluster, training)
    relax = tuple(relax)
    for plan in plans:
        if plan.layout:
            require_layout_plan(model, training, plan)
    broken = {plan: tuple(require_buildable(model, cluster, training, plan, relax)) for plan in dict.fromkeys(plans)}
    parents = [parent_plan(model, cluster, training, plan) if plan.layout else plan for plan in plans]
    distinct = list(dict.fromkeys(parents))
    priced = dict(zip(distinct, estimates(model, cluster, training, PlanArrays.from_plans(distinct),
                                          [broken.get(parent, ()) for parent in distinct])))
    return tuple(layout_estimate(model, cluster, training, plan, priced[parent], broken[plan]) if plan.layout
                 else priced[plan] for plan, parent in zip(plans, parents))


def require_layout_plan(model: ModelSpec, training: TrainingSpec, plan: Plan) -> None:
    """InputError unless the plan's layout can be priced: a 1F1B schedule, pp > 1, every decoder layer placed."""
    from costmodels.layout import require_layout_schedule

    require_layout_schedule(training)
    if plan.pp < 2:
        raise InputError("layout", "a pipeline layout needs pp > 1")
    if sum(plan.layout) != model.num_layers:
        raise InputError("layout", f"places {sum(plan.layout)} decoder layers; {model.name} has {model.num_layers}")


def layout_estimate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                    base: Estimate, rules_broken: "tuple[str, ...]" = ()) -> Estimate:
    """A plan with a pipeline layout, every rank priced stage by stage (costmodels.layout); `base` is the estimate
    of its parent plan (costmodels.layout.parent_plan; `plan_estimates` checks the layout and prices the parent).

    The per-stage model and the uniform one differ slightly even on the same layout (the uniform model takes each
    term on its own worst stage, the per-stage model a rank's chunks summed), so a layout is compared with the plan
    it refines within one model: its terms are the per-stage model's plus `uniform_model_gap`, the uniform model's
    step time of the parent plan (same knobs, a valid first/last split) minus the per-stage time of the parent's own
    layout. The parent's own layout thus gets exactly the parent's estimate, and any other layout differs from it by
    exactly what the per-stage model says. Where no first/last split of the structure is whole (a layer count that
    only a layout runs), the parent is the even split itself, fractional (costmodels.layout.parent_layout), and the
    gap is the two models' difference on it. Memory: every rank's own terms on its own layers. `rules_broken`: the
    non-memory rules the plan breaks (costmodels.rules.plan_violations)."""
    from costmodels.layout import GAP_TERM, layout_breakdown, parent_layout, with_layout

    layout, parent = plan.layout, base.plan
    own = layout_breakdown(model, cluster, training, parent, parent_layout(model, parent))
    mine = layout_breakdown(model, cluster, training, parent, layout)
    terms = dict(mine.time_terms_s)
    terms[GAP_TERM] = base.step_time_s - own.step_time_s
    stages = tuple(StageMemory(stage=rank, layers=float(sum(mine.rank_layers[rank])), terms_bytes=rank_terms)
                   for rank, rank_terms in enumerate(mine.rank_memory_terms_bytes))
    worst = max(range(len(stages)), key=lambda s: stages[s].total_bytes)
    fits = stages[worst].total_bytes <= cluster.memory_limit_bytes
    violations = tuple(rules_broken) + (() if fits else (MEMORY_RULE,))
    speedup = base.step_time_s / sum(terms.values())
    return dataclasses.replace(
        base, plan=with_layout(parent, layout), stages=stages, worst_stage=worst, time_terms_s=terms,
        tokens_per_s=base.tokens_per_s * speedup, model_tflops_per_gpu=base.model_tflops_per_gpu * speedup,
        hardware_tflops_per_gpu=base.hardware_tflops_per_gpu * speedup, mfu=base.mfu * speedup,
        violations=violations)


def estimates(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              rules_broken: "Iterable[tuple[str, ...]] | None" = None) -> tuple[Estimate, ...]:
    """`Estimate`s of many plans at once (one vectorised evaluation), in order; no rule checks of their own.

    `rules_broken`, one tuple per plan, are the non-memory rules each plan is known to break (default none: the
    solver's plans pass every rule in force); `memory` is added where the plan does not fit.
    """
    time_terms = step_time_terms_s(model, cluster, training, plans)
    rates = throughput(model, cluster, training, plans, sum(time_terms.values()))
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    rules_broken = list(rules_broken) if rules_broken is not None else [()] * len(plans)
    every_stage = stage_memories(model, cluster, training, plans)
    results = []
    for i, plan in enumerate(plans):
        stages = every_stage[i]  # the peak is the fullest of these
        point = Estimate(
            model=model, cluster=cluster, training=training, plan=plan,
            num_microbatches=float(microbatches[i]),
            stages=stages, worst_stage=max(range(len(stages)), key=lambda s: stages[s].total_bytes),
            time_terms_s={term: float(values[i]) for term, values in time_terms.items()},
            tokens_per_s=float(rates["tokens_per_s"][i]),
            model_tflops_per_gpu=float(rates["model_tflops_per_gpu"][i]),
            hardware_tflops_per_gpu=float(rates["hardware_tflops_per_gpu"][i]),
            mfu=float(rates["mfu"][i]),
        )
        violations = tuple(rules_broken[i]) + (() if point.fits else (MEMORY_RULE,))
        results.append(dataclasses.replace(point, violations=violations))
    return tuple(results)


def stage_memories(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                   plans: PlanArrays) -> list[tuple[StageMemory, ...]]:
    """`stage_memory` of every plan, pipeline rank r of all plans evaluated together (the cost functions are
    elementwise over plans, so each plan gets the same numbers as alone)."""
    if len(plans) == 0:
        return []
    # row i·ranks + r: plan i on rank r (its last rank where r >= its pp), every rank of every plan in one evaluation
    ranks = int(plans.pp.max())
    rows = np.repeat(np.arange(len(plans)), ranks)
    on_ranks = plans.take(rows)
    stage = np.minimum(np.tile(np.arange(ranks), len(plans)), on_ranks.pp - 1)
    terms = {term: np.asarray(values, dtype=float).tolist() for term, values in
             memory_terms_bytes(model, cluster, training, on_ranks, stage).items()}
    layers = np.asarray(layers_on_stage(model.num_layers, on_ranks, stage), dtype=float).tolist()
    return [tuple(StageMemory(stage=rank, layers=layers[i * ranks + rank],
                              terms_bytes={term: values[i * ranks + rank] for term, values in terms.items()})
                  for rank in range(int(plans.pp[i])))
            for i in range(len(plans))]


def stage_memory(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 plans: PlanArrays) -> tuple[StageMemory, ...]:
    """Named memory terms on every pipeline rank of the single plan in `plans`."""
    assert len(plans) == 1, "stage_memory describes one plan"
    return stage_memories(model, cluster, training, plans)[0]
