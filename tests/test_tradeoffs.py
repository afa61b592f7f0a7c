"""The Parallelism Strategies Guide's trade-offs emerge from the cost model (no rule forces them).

Each test enumerates a small explicit plan space with the basic divisibility rules inline, evaluates it with
costmodels.evaluate.evaluate (memory and time), keeps the plans that fit in (1 - headroom) of HBM, and checks the
guide's statement on the fastest ones.
"""

from __future__ import annotations

import itertools

import numpy as np

from costmodels.evaluate import evaluate
from costmodels.hardware import load_profile
from costmodels.plan import Plan, Recompute
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec

H100 = load_profile("h100-80gb")
LLAMA_2_7B = ModelSpec(name="llama-2-7b", hidden_size=4096, num_layers=32, num_attention_heads=32,
                       ffn_hidden_size=11008, vocab_size=32000)
LLAMA_3_1_70B = ModelSpec(name="llama-3.1-70b", hidden_size=8192, num_layers=80, num_attention_heads=64,
                          num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)


def enumerate_plans(model: ModelSpec, num_gpus: int, training: TrainingSpec, tps=(1, 2, 4, 8), pps=(1, 2, 4, 8),
                    cps=(1,), mbss=(1, 2)) -> list[Plan]:
    """Plans obeying the DESIGN.md §3 rules world, heads, layers, sp_needs_tp, cp_needs_sp_tp, cp_seq, batch, vpp."""
    plans = []
    for tp, pp, cp, mbs, recompute, sp, zero, vpp in itertools.product(
            tps, pps, cps, mbss, Recompute, (False, True), (0, 1, 2, 3), (1, 2)):
        if num_gpus % (tp * pp * cp):
            continue
        dp = num_gpus // (tp * pp * cp)
        if training.global_batch_size % (dp * mbs):
            continue
        if model.num_attention_heads % tp or model.num_kv_heads % tp:
            continue
        if (sp and tp == 1) or (cp > 1 and not (sp and tp > 1)) or training.seq_len % (2 * cp):
            continue
        if (vpp > 1 and pp == 1) or model.num_layers % (pp * vpp):
            continue
        if vpp > 1 and (training.global_batch_size // (dp * mbs)) % pp:
            continue
        plans.append(Plan(tp=tp, pp=pp, cp=cp, mbs=mbs, recompute=recompute, sp=sp, zero=zero, vpp=vpp))
    return plans


def fitting_step_times(model, cluster, training, plans):
    evaluation = evaluate(model, cluster, training, plans)
    fits = evaluation.peak_memory_bytes <= cluster.memory_limit_bytes
    return np.where(fits, evaluation.step_time_s, np.inf)


def test_7b_on_8_gpus_at_4k_fastest_fitting_plan_has_no_pipeline():
    cluster = ClusterSpec(profile=H100, num_gpus=8)
    training = TrainingSpec(seq_len=4096, global_batch_size=128)
    plans = enumerate_plans(LLAMA_2_7B, 8, training)
    times = fitting_step_times(LLAMA_2_7B, cluster, training, plans)
    assert np.isfinite(times).any()
    fastest = plans[int(np.argmin(times))]
    assert fastest.pp == 1, fastest.short()


def test_growing_tp_from_8_to_16_across_nodes_is_slower():
    # the tp_node rule relaxed: TP=16 spans two nodes of 8 and its collectives cross InfiniBand
    cluster = ClusterSpec(profile=H100, num_gpus=16)
    training = TrainingSpec(seq_len=4096, global_batch_size=128)
    plans = [p for p in enumerate_plans(LLAMA_2_7B, 16, training, tps=(8, 16), pps=(1,)) if p.sp]
    times = fitting_step_times(LLAMA_2_7B, cluster, training, plans)
    best = {tp: min(t for p, t in zip(plans, times) if p.tp == tp) for tp in (8, 16)}
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
    plans = enumerate_plans(LLAMA_3_1_70B, 128, training, pps=(1, 2, 4, 8, 16), cps=(1, 2, 4, 8, 16), mbss=(1,))
    times = fitting_step_times(LLAMA_3_1_70B, cluster, training, plans)
    with_cp = min(t for p, t in zip(plans, times) if p.cp > 1)
    without_cp = min(t for p, t in zip(plans, times) if p.cp == 1)
    assert np.isfinite(with_cp) and with_cp < without_cp
