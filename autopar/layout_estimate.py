"""`estimate` for a plan that carries a pipeline layout (Plan.layout): every rank priced stage by stage.

The per-stage model (costmodels.layout) and the uniform model (costmodels.steptime) differ slightly even on the
same layout: the uniform model takes each term on its own worst stage, the per-stage model a rank's chunks summed,
so it is never slower. To compare a layout with the plan it refines within one model, the estimate of a layout plan
is the per-stage model's terms plus `uniform_model_gap`: the uniform model's step time of the parent plan (the same
knobs with its own split) minus the per-stage model's time of the parent's layout. A layout equal to the parent's
own therefore gets exactly the parent's estimate, and a better layout is faster by exactly what the per-stage model
gains between the two layouts.
"""

from __future__ import annotations

import dataclasses

from autopar.results import Estimate, StageMemory
from costmodels.errors import InputError
from costmodels.layout import layout_breakdown, uniform_layout
from costmodels.plan import Plan
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

GAP_TERM = "uniform_model_gap"
MEMORY_RULE = "memory"


def parent_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan) -> Plan:
    """The plan without its layout, with the split of the search space closest to the layout's ends (a valid
    first/last split, so the uniform model and the rules apply)."""
    from autopar.search.space import layer_splits

    bare = dataclasses.replace(plan, layout=())
    splits = layer_splits(model.num_layers, plan.pp)
    if not splits:
        raise InputError("layout", f"pp={plan.pp} cannot hold {model.num_layers} layers")
    from autopar.search.rules import check_plan

    def distance(split):
        first, last = split
        return abs((first or -1) - plan.first_stage_layers) + abs((last or -1) - plan.last_stage_layers)

    for first, last in sorted(splits, key=distance):
        candidate = dataclasses.replace(bare, first_stage_layers=first, last_stage_layers=last)
        if "layers" not in check_plan(model, cluster, training, candidate):
            return candidate
    return bare


def layout_estimate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                    relax=()) -> Estimate:
    from autopar.estimate import estimate

    layout = plan.layout
    if sum(layout) != model.num_layers:
        raise InputError("layout", f"places {sum(layout)} decoder layers; {model.name} has {model.num_layers}")
    if plan.pp < 2:
        raise InputError("layout", "a pipeline layout needs pp > 1")
    parent = parent_plan(model, cluster, training, plan)
    base = estimate(model, cluster, training, parent, relax=relax)
    own = layout_breakdown(model, cluster, training, parent, uniform_layout(model, parent))
    mine = layout_breakdown(model, cluster, training, parent, layout)
    terms = dict(mine.time_terms_s)
    terms[GAP_TERM] = base.step_time_s - own.step_time_s
    stages = tuple(StageMemory(stage=r, layers=float(sum(mine.rank_layers[r])), terms_bytes=mine_terms)
                   for r, mine_terms in enumerate(mine.rank_memory_terms_bytes))
    worst = max(range(len(stages)), key=lambda s: stages[s].total_bytes)
    step_s = sum(terms.values())
    fits = stages[worst].total_bytes <= cluster.memory_limit_bytes
    violations = tuple(v for v in base.violations if v != MEMORY_RULE) + (() if fits else (MEMORY_RULE,))
    scale = base.step_time_s / step_s
    return dataclasses.replace(
        base, plan=dataclasses.replace(parent, layout=layout), stages=stages, worst_stage=worst,
        time_terms_s=terms, tokens_per_s=base.tokens_per_s * scale,
        model_tflops_per_gpu=base.model_tflops_per_gpu * scale,
        hardware_tflops_per_gpu=base.hardware_tflops_per_gpu * scale, mfu=base.mfu * scale, violations=violations)
