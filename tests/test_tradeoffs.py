"""The Parallelism Strategies Guide's trade-offs emerge from the cost model (no rule forces them).

Each test takes the search's own plan space and rules (autopar.search.space, costmodels.rules), narrowed by
the same pins and bounds a user would give `autopar solve`, evaluates every plan with costmodels.evaluate.evaluate
(memory and time), keeps the plans that fit in (1 - headroom) of HBM, and checks the guide's statement on the
fastest ones.
"""

from __future__ import annotations

import math

import numpy as np

from costmodels.rules import Problem, active_rules, structural_mask
from autopar.search.space import Controls, build_space, mixed_radix, plan_arrays
from costmodels.evaluate import evaluate
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

H100 = load_profile("h100-80gb")
LLAMA_2_7B = ModelSpec(name="llama-2-7b", hidden_size=4096, num_layers=32, num_attention_heads=32,
                       ffn_hidden_size=11008, vocab_size=32000)
LLAMA_3_1_70B = ModelSpec(name="llama-3.1-70b", hidden_size=8192, num_layers=80, num_attention_heads=64,
                          num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)


def valid_plans(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *, fix=None, minimum=None,
                maximum=None, relax: tuple[str, ...] = ()) -> PlanArrays:
    """Every plan of the search's own space (autopar.search.space.build_space) within `fix`/`minimum`/`maximum`
    that keeps the search's own rules (costmodels.rules), memory aside: what `autopar solve` would weigh."""
    controls = Controls(fix=fix or {}, minimum=minimum or {}, maximum=maximum or {}, relax=relax)
    space = build_space(model, cluster, training, controls)
    factors = space.factors(("split", "recompute") + space.free_knobs)
    sizes = [len(values) for _, values in factors]
    plans = plan_arrays(space.columns_from_factors(factors, mixed_radix(sizes, 0, math.prod(sizes))))
    keep = structural_mask(Problem(model, cluster, training), plans, active_rules(relax))
    assert keep.any()
    return plans.take(np.flatnonzero(keep))


def fitting_step_times(model, cluster, training, plans):
    evaluation = evaluate(model, cluster, training, plans)
    fits = evaluation.peak_memory_bytes <= cluster.memory_limit_bytes
    return np.where(fits, evaluation.step_time_s, np.inf)


def test_7b_on_8_gpus_at_4k_fastest_fitting_plan_has_no_pipeline():
    cluster = ClusterSpec(profile=H100, num_gpus=8)
    training = TrainingSpec(seq_len=4096, global_batch_size=128)
    plans = valid_plans(LLAMA_2_7B, cluster, training, fix={"recompute_layers": 0}, maximum={"mbs": 2, "vpp": 2})
    times = fitting_step_times(LLAMA_2_7B, cluster, training, plans)
    assert np.isfinite(times).any() and set(plans.pp.tolist()) == {1, 2, 4, 8}
    fastest = plans.plan(int(np.argmin(times)))
    assert fastest.pp == 1, fastest.short()


def test_growing_tp_from_8_to_16_across_nodes_is_slower():
    # the tp_node rule relaxed: TP=16 spans two nodes of 8 and its collectives cross InfiniBand
    cluster = ClusterSpec(profile=H100, num_gpus=16)
    training = TrainingSpec(seq_len=4096, global_batch_size=128)
    plans = valid_plans(LLAMA_2_7B, cluster, training, fix={"pp": 1, "sp": 1, "recompute_layers": 0},
                        minimum={"tp": 8}, maximum={"mbs": 2}, relax=("tp_node",))
    times = fitting_step_times(LLAMA_2_7B, cluster, training, plans)
    assert set(plans.tp.tolist()) == {8, 16}
    best = {tp: times[plans.tp == tp].min() for tp in (8, 16)}
    assert np.isfinite(best[8])
    assert best[16] > best[8]
    # and plan by plan: the same layout with tp=16 is slower than with tp=8
    for plan in [Plan(tp=8, sp=True, zero=1), Plan(tp=8, sp=True, recompute=Recompute.SELECTIVE)]:
        wider = Plan(**{**plan.__dict__, "tp": 16, "etp": 16})
        pair = evaluate(LLAMA_2_7B, cluster, training, [plan, wider]).step_time_s
        assert pair[1] > pair[0]


def test_70b_at_128k_context_parallel_beats_the_best_plan_without_it():
    cluster = ClusterSpec(profile=H100, num_gpus=128)
    training = TrainingSpec(seq_len=131072, global_batch_size=16)
    plans = valid_plans(LLAMA_3_1_70B, cluster, training, fix={"mbs": 1, "recompute_layers": 0},
                        maximum={"pp": 16, "cp": 16, "vpp": 2})
    times = fitting_step_times(LLAMA_3_1_70B, cluster, training, plans)
    assert set(plans.cp.tolist()) == {1, 2, 4, 8, 16}
    with_cp = times[plans.cp > 1].min()
    without_cp = times[plans.cp == 1].min()
    assert np.isfinite(with_cp) and with_cp < without_cp
