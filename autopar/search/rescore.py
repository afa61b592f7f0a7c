"""Re-score a front with the float cost model in one vectorised pass.

`estimates(model, cluster, training, plans)` returns exactly what `[autopar.estimate.estimate(..., plan) for plan
in plans]` returns (same checks, same errors, same numbers: every cost function is elementwise over plans, so
evaluating the plans together gives each one its own values bit for bit), but evaluates the cost model once for
all plans and the memory of pipeline rank r once for every plan that has it, instead of once per plan.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from autopar.results import Estimate, StageMemory
from costmodels.errors import InputError
from costmodels.plan import PlanArrays, Recompute, layers_on_stage
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec


def estimates(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              relax: Iterable[str] = ()) -> tuple[Estimate, ...]:
    from autopar.estimate import _RULE_FIELDS, MEMORY_RULE, require_precision_supported
    from autopar.search.rules import RULES_BY_ID, Context, active_rules, violated_rules
    from costmodels.evaluate import evaluate
    from costmodels.memory import memory_terms_bytes

    relax = tuple(relax)
    require_precision_supported(cluster, training)
    if len(plans) == 0:
        return ()
    plan_list = list(plans)
    ctx = Context(model, cluster, training)
    rules = [r for r in active_rules(relax) if r.id != MEMORY_RULE]
    broken_per_plan = violated_rules(ctx, plans, rules)
    guide_broken: list[tuple[str, ...]] = []
    for plan, broken in zip(plan_list, broken_per_plan):      # autopar.estimate.require_buildable, plan by plan
        if plan.recompute_layers and plan.recompute is not Recompute.FULL:
            raise InputError("recompute_layers", "only applies with --recompute full; drop --recompute-layers")
        first = {"heads": 0, "world": 1}
        for rule in sorted(broken, key=lambda name: first.get(name, 2)):
            if not RULES_BY_ID[rule].relaxable:
                raise InputError(_RULE_FIELDS.get(rule, rule), f"{RULES_BY_ID[rule].why_broken(ctx, plan)} "
                                 f"(rule {rule})")
        guide_broken.append(broken)

    evaluation = evaluate(model, cluster, training, plans)
    pp = plans.pp
    per_rank = []
    for rank in range(int(pp.max())):
        stage = np.minimum(rank, pp - 1)
        per_rank.append((memory_terms_bytes(model, cluster, training, plans, stage),
                         layers_on_stage(model.num_layers, plans, stage)))

    out = []
    for i, plan in enumerate(plan_list):
        stages = tuple(StageMemory(stage=rank, layers=float(layers[i]),
                                   terms_bytes={term: float(values[i]) for term, values in terms.items()})
                       for rank, (terms, layers) in enumerate(per_rank[:plan.pp]))
        worst_stage = max(range(len(stages)), key=lambda s: stages[s].total_bytes)
        assert abs(stages[worst_stage].total_bytes - float(evaluation.peak_memory_bytes[i])) <= \
            1e-6 * max(1.0, stages[worst_stage].total_bytes), "per-stage memory disagrees with evaluate()'s peak"
        fits = stages[worst_stage].total_bytes <= cluster.memory_limit_bytes
        out.append(Estimate(
            model=model, cluster=cluster, training=training, plan=plan,
            num_microbatches=float(evaluation.num_microbatches[i]),
            stages=stages, worst_stage=worst_stage,
            time_terms_s={term: float(values[i]) for term, values in evaluation.time_terms_s.items()},
            tokens_per_s=float(evaluation.tokens_per_s[i]),
            model_tflops_per_gpu=float(evaluation.model_tflops_per_gpu[i]),
            hardware_tflops_per_gpu=float(evaluation.hardware_tflops_per_gpu[i]),
            mfu=float(evaluation.mfu[i]),
            violations=guide_broken[i] + (() if fits else (MEMORY_RULE,)),
        ))
    return tuple(out)
