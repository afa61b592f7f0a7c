"""torchtitan's per-op selective activation checkpointing (costmodels.engines.per_op_sac) and PyTorch FSDP's weights:
hand-derived bytes and seconds on toy models (arithmetic in comments), and the export that launches it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.export import emit, launch_config
from costmodels import compute, engines, memory, steptime
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.scoring import estimate as estimate_plan
from costmodels.specs import ClusterSpec, Engine, MlpKind, ModelSpec, MoESpec, NormKind, TrainingSpec

PROFILE = load_profile("h100-80gb")

# A toy Llama: h=64, 4 query heads and 2 KV heads of d=16 (q=64, kv=32), gated MLP F=128, 2 layers.
TOY = ModelSpec(name="toy-llama", hidden_size=64, num_layers=2, num_attention_heads=4, num_kv_heads=2,
                ffn_hidden_size=128, vocab_size=128, mlp=MlpKind.GATED, norm=NormKind.RMSNORM)
TOY_MOE = dataclasses.replace(TOY, name="toy-moe", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32))
TITAN = TrainingSpec(seq_len=16, global_batch_size=8, engine=Engine.TORCHTITAN)


def one(**fields) -> PlanArrays:
    return PlanArrays.from_plans([Plan(**fields)])


def terms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, gpus: int = 1) -> dict[str, float]:
    cluster = ClusterSpec(profile=PROFILE, num_gpus=gpus, gpus_per_node=8)
    return {name: float(value[0]) for name, value in memory.memory_terms_bytes(model, cluster, training, plans,
                                                                                0).items()}


def test_kept_matmuls_are_every_other_one_in_forward_order():
    # wq, wk, wv, wo, w1, w3, w2: the first, third, fifth and seventh are kept -- wq (q), wv (kv), w1 (F), w2 (h)
    kept = engines.sac_kept_matmuls(TOY, moe_layer=False)
    assert [(m.d_out, m.split) for m in kept] == [(64, "column"), (32, "column"), (128, "column"), (64, "row")]
    # a MoE layer without shared experts: the router's gate and the grouped experts are not counted
    assert [m.d_out for m in engines.sac_kept_matmuls(TOY_MOE, moe_layer=True)] == [64, 32]


def test_sac_keeps_the_block_input_and_the_saved_op_outputs_only():
    # s=16, mbs=1, tp=1: per layer and token kept wq 2·64 + wv 2·32 + w1 2·128 + w2 2·64 = 576, the attention
    # output 2·64 = 128 and its log-sum-exp 4·4 = 16: 720 a token, 16 tokens, 2 layers: 23040 bytes; the inputs
    # 2·64·16·2 = 4096; nothing else of the layers is stored
    sac = terms(TOY, TITAN, one(recompute=Recompute.SELECTIVE))
    assert sac["sac_saved_activations"] == pytest.approx(23040)
    assert sac["recomputed_layer_inputs"] == pytest.approx(4096)
    assert sac["layer_activations"] == 0
    # the same plan under Megatron-Core is its module-level selective recompute: every layer's activations but
    # the attention core's stay, and there is no SAC term
    megatron = terms(TOY, dataclasses.replace(TITAN, engine=Engine.MEGATRON), one(recompute=Recompute.SELECTIVE))
    assert "sac_saved_activations" not in megatron and megatron["layer_activations"] > 0
    # full AC under torchtitan keeps the inputs alone
    assert terms(TOY, TITAN, one(recompute=Recompute.FULL))["sac_saved_activations"] == 0


def test_sac_keeps_the_moe_all_to_all_outputs_where_the_policy_saves_them():
    # 2 GPUs, ep 2, 16 tokens, top-2: per MoE layer the dispatched copies received (16·2 balanced) and the combined
    # copies returned (16·2), 2·64 bytes each: 64·128 = 8192 a layer, 16384 for the two layers
    plans = one(recompute=Recompute.SELECTIVE, ep=2, zero=3)
    saved = terms(TOY_MOE, TITAN, plans, gpus=2)["sac_saved_activations"]
    unsaved = terms(TOY_MOE, dataclasses.replace(TITAN, sac_saves_all_to_all=False), plans,
                    gpus=2)["sac_saved_activations"]
    assert saved - unsaved == pytest.approx(16384)


def test_fsdp_keeps_no_bf16_weights_under_zero3():
    # FSDP's sharded fp32 parameter is the master weight: no bf16 copy persists at zero 3; at zero 2 the gathered
    # bf16 parameters stay from forward to backward; Megatron-FSDP keeps its bf16 shard
    assert terms(TOY, TITAN, one(zero=3))["weights"] == 0
    assert terms(TOY, TITAN, one(zero=2))["weights"] > 0
    assert terms(TOY, dataclasses.replace(TITAN, engine=Engine.MEGATRON), one(zero=3))["weights"] > 0


def test_sac_recompute_is_the_forward_less_the_kept_ops():
    training = dataclasses.replace(TITAN, seq_len=4096, global_batch_size=2)
    plans = one(recompute=Recompute.SELECTIVE)
    times = compute.layer_times_s(TOY, PROFILE, training, plans)
    kept = compute.sac_kept_gemms_s(TOY, PROFILE, training, plans, moe_layer=False)
    expected = times.dense_layer_fwd_s - times.attention_core_fwd_s - kept
    assert times.selective_dense_fwd_s == pytest.approx(expected)
    assert 0 < kept[0] < times.dense_layer_fwd_s[0] - times.attention_core_fwd_s[0]


def test_sac_reruns_the_all_to_alls_unless_it_keeps_them():
    cluster = ClusterSpec(profile=PROFILE, num_gpus=2, gpus_per_node=8)
    plans = one(recompute=Recompute.SELECTIVE, ep=2, zero=3)
    stage = np.zeros(1, dtype=np.int64)
    kept = steptime.ep_all_to_all_s(TOY_MOE, cluster, TITAN, plans, stage)
    rerun = steptime.ep_all_to_all_s(TOY_MOE, cluster, dataclasses.replace(TITAN, sac_saves_all_to_all=False),
                                     plans, stage)
    assert rerun[0] == pytest.approx(kept[0] * 6 / 4)     # dispatch and combine again in the recompute


def test_torchtitan_launches_selective_as_selective_ac_where_it_was_priced():
    cluster = ClusterSpec(profile=PROFILE, num_gpus=8, gpus_per_node=8)
    plan = Plan(recompute=Recompute.SELECTIVE, zero=3)
    config = emit(estimate_plan(TOY, cluster, TITAN, plan), "torchtitan")
    assert "SelectiveAC.Config()" in config and "FullAC" not in config
    # priced as Megatron's selective recompute, it is written as torchtitan's and priced again with its engine
    megatron = estimate_plan(TOY, cluster, dataclasses.replace(TITAN, engine=Engine.MEGATRON), plan)
    config = launch_config(megatron, "torchtitan")
    assert "SelectiveAC.Config()" in config.text and "per-op SAC" in config.text.splitlines()[0]
    assert config.priced.training.engine is Engine.TORCHTITAN


def test_hardware_flops_count_what_per_op_sac_reruns():
    """Per-op SAC re-runs a block's forward but the attention kernel and the matmuls it keeps (every other one):
    hardware FLOPs add the layers' forward less those, not the attention core."""
    from autopar.models import load_model
    from costmodels import compute

    model = load_model("llama-3.1-8b")
    training = TrainingSpec(seq_len=8192, global_batch_size=64, engine="torchtitan")
    plans = PlanArrays.from_plans([Plan(recompute="selective", zero=3), Plan(zero=3)])
    hardware = compute.hardware_flops_per_step(model, training, plans)
    parts = compute._forward_flops_per_sequence(model, training)
    kept = compute.sac_kept_flops_per_sequence(model, training)
    # wq, wv, w1, w2 of every layer: the 1st, 3rd, 5th and 7th of wq wk wv wo w1 w3 w2
    h, kv, f = 4096, 1024, 14336
    assert kept == pytest.approx(32 * 2 * 8192 * (h * h + h * kv + h * f + f * h))
    assert hardware[0] - hardware[1] == pytest.approx(
        (parts["layers"] - parts["attention_core"] - kept) * training.global_batch_size)
