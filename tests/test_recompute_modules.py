"""Per-module selective recompute (Megatron-Core --recompute-modules): the knob, its memory and time per module,
its place in the search, and the Megatron-LM flags written and read back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.export import emit
from autopar.megatron_args import parse_megatron_args
from autopar.search.space import selective_module_sets
from costmodels.errors import InputError
from costmodels.evaluate import evaluate
from costmodels.hardware import load_profile
from costmodels.memory import BF16_BYTES
from costmodels.plan import Plan, PlanArrays, Recompute, RecomputeModule, selective_modules
from costmodels.specs import ClusterSpec, MoESpec, ModelSpec, TrainingSpec
from test_report_support import cluster, synthetic_estimate

H100 = load_profile("h100-80gb")
DENSE = ModelSpec(name="dense", hidden_size=4096, num_layers=8, num_attention_heads=32, num_kv_heads=8,
                  ffn_hidden_size=14336, vocab_size=32000)
MOE = ModelSpec(name="moe", hidden_size=2048, num_layers=8, num_attention_heads=16, num_kv_heads=4,
                ffn_hidden_size=8192, vocab_size=32000,
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=8)


def sel(modules: str) -> Plan:
    return Plan(recompute=Recompute.SELECTIVE, recompute_modules=modules, zero=1)


def run(model, plans, num_gpus=1):
    return evaluate(model, ClusterSpec(profile=H100, num_gpus=num_gpus), TRAINING, PlanArrays.from_plans(plans))


def test_module_names_and_the_default():
    assert Plan(recompute="selective", recompute_modules="core_attn").recompute_modules == 0   # Megatron's default
    assert sel("layernorm,moe_act").recompute_modules == RecomputeModule.LAYERNORM | RecomputeModule.MOE_ACT
    assert sel("layernorm moe_act").short().endswith("sel(ln+act) z1")
    assert Plan(recompute="full", recompute_modules="mlp").recompute_modules == 0              # selective only
    with pytest.raises(InputError, match="unknown module 'attn'"):
        sel("attn")
    plans = PlanArrays.from_plans([Plan(), Plan(recompute="selective"), sel("mlp")])
    assert list(selective_modules(plans)) == [0, RecomputeModule.CORE_ATTN, RecomputeModule.MLP]


def test_each_dense_module_saves_its_bytes_and_costs_time():
    result = run(DENSE, [sel("core_attn"), sel("core_attn,layernorm"), sel("core_attn,mlp")])
    stored = result.memory_terms_bytes["layer_activations"]
    compute_s = result.time_terms_s["compute"]
    tokens = 4096                                                         # mbs 1, tp 1, no SP: s tokens
    # layernorm recomputes nothing here: Megatron-Core's TE layers fuse both norms into the linear layers after them
    # (input_layernorm and a dense layer's pre_mlp_layernorm are IdentityOp)
    assert stored[0] == stored[1] and compute_s[0] == compute_s[1]
    # mlp drops the SwiGLU interior: 6 bytes per intermediate column per token
    assert stored[0] - stored[2] == pytest.approx(8 * 6 * 14336 * tokens)
    assert compute_s[0] < compute_s[2]


def test_layernorm_recomputes_the_norms_that_are_modules_of_their_own():
    """A MoE layer's pre-MLP norm (the router reads it) and, under MLA, the input norm: their outputs go (2h bytes
    per token each) and their kernels re-run; a dense layer's fused norms neither."""
    result = run(MOE, [sel("core_attn"), sel("core_attn,layernorm")])
    stored = result.memory_terms_bytes["layer_activations"]
    tokens = 4096
    assert stored[0] - stored[1] == pytest.approx(MOE.num_moe_layers * BF16_BYTES * MOE.hidden_size * tokens)
    assert result.time_terms_s["compute"][0] < result.time_terms_s["compute"][1]
    assert (MOE.num_separate_norms(moe_layer=True), MOE.num_separate_norms(moe_layer=False)) == (1, 0)


def test_moe_modules_drop_expert_activations_and_rerun_the_all_to_all():
    plans = [sel("core_attn"), sel("moe_act"), sel("moe"), Plan(ep=8, recompute="selective", zero=1),
             Plan(ep=8, recompute="selective", recompute_modules="moe", zero=1)]
    result = evaluate(MOE, ClusterSpec(profile=H100, num_gpus=8), TRAINING, PlanArrays.from_plans(plans))
    expert = result.memory_terms_bytes["expert_mlp_activations"]
    assert expert[1] < expert[0] and expert[2] == 0.0
    assert result.memory_terms_bytes["moe_dispatch_activations"][2] == 0.0
    assert result.time_terms_s["ep_comm"][4] == pytest.approx(1.5 * result.time_terms_s["ep_comm"][3])   # 6 vs 4


def test_searched_sets_are_few_and_model_aware():
    core, norm, mlp = (int(m) for m in (RecomputeModule.CORE_ATTN, RecomputeModule.LAYERNORM, RecomputeModule.MLP))
    assert selective_module_sets(DENSE) == [0, core | mlp]                       # layernorm recomputes nothing here
    moe_sets = selective_module_sets(MOE)
    assert 0 in moe_sets and len(moe_sets) == 5
    assert all(not s & RecomputeModule.MLP for s in moe_sets)                  # no dense layers to recompute


def test_megatron_flags_round_trip():
    plan = Plan(ep=8, recompute="selective", recompute_modules="layernorm,moe", zero=1)
    estimate = synthetic_estimate(MOE, cluster(8), TRAINING, plan)
    text = emit(estimate, "megatron")
    assert "--recompute-modules layernorm moe" in text
    assert parse_megatron_args(text).plan == plan
    default = emit(synthetic_estimate(MOE, cluster(8), TRAINING, Plan(ep=8, recompute="selective", zero=1)),
                   "megatron")
    assert "--recompute-modules" not in default


def test_solve_can_pick_a_module_set():
    import autopar
    model = ModelSpec(name="moe-big", hidden_size=4096, num_layers=16, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=32000,
                      moe=MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=8192))
    front = autopar.solve(model, autopar.make_cluster(gpu="h100-80gb", num_gpus=8),
                          TrainingSpec(seq_len=8192, global_batch_size=32), solver="oracle",
                          fix={"recompute": "selective", "tp": 1, "pp": 1})
    assert front and {p.plan.recompute_modules for p in front} - {0}
    assert np.all([p.plan.recompute is Recompute.SELECTIVE for p in front])


def test_modules_a_model_lacks_are_warned_about():
    """moe/moe_act/shared_experts on a dense model and mla_up_proj without MLA recompute nothing: said, per kind."""
    import autopar
    from autopar.commands import plan_input_warnings

    dense = autopar.load_model("llama-3.1-8b")
    warnings = plan_input_warnings(dense, TrainingSpec(), sel("moe,mla_up_proj,layernorm"))
    assert len(warnings) == 3 and "moe has no effect" in warnings[0] and "mla_up_proj has no effect" in warnings[1]
    assert "layernorm has no effect" in warnings[2] and "IdentityOp" in warnings[2]
    assert plan_input_warnings(dense, TrainingSpec(), sel("mlp")) == []
    moe = autopar.load_model("deepseek-v3")
    assert plan_input_warnings(moe, TrainingSpec(), sel("moe_act,mla_up_proj,shared_experts")) == []


SHARED = ModelSpec(name="moe-shared", hidden_size=2048, num_layers=8, num_attention_heads=16, num_kv_heads=4,
                   ffn_hidden_size=8192, vocab_size=32000,
                   moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024, num_shared_experts=1,
                               shared_expert_ffn_hidden_size=4096))


def test_moe_module_recomputes_the_shared_experts_it_checkpoints():
    """Module moe checkpoints MoELayer's custom_forward, which runs shared_experts_compute first (Megatron-Core
    moe_layer.py): the shared experts' interior is not kept and they re-run with it. Listing shared_experts too
    nests their own checkpoint inside, which re-runs them once more in its backward."""
    from costmodels import compute

    plans = PlanArrays.from_plans([sel("moe"), sel("moe,shared_experts"), sel("shared_experts"), sel("moe_act")])
    result = run(SHARED, [sel("moe"), sel("moe,shared_experts"), sel("shared_experts"), sel("moe_act")])
    stored = result.memory_terms_bytes["layer_activations"]
    tokens = 4096
    shared_interior = SHARED.num_moe_layers * 6 * 4096 * tokens           # SwiGLU interior, 6 bytes a column
    assert stored[0] == stored[1] == stored[2]
    assert stored[3] - stored[2] == pytest.approx(shared_interior)
    _, moe_rerun_s = compute.selective_recompute_s(SHARED, H100, TRAINING, plans, np.zeros(len(plans)))
    shared_s = compute._gemms_time_s(H100, TRAINING, compute.moe_mlp_gemms(SHARED, TRAINING, plans)[-2:])
    routed_only = dataclasses.replace(SHARED, moe=dataclasses.replace(SHARED.moe, num_shared_experts=0,
                                                                       shared_expert_ffn_hidden_size=0))
    _, routed_rerun_s = compute.selective_recompute_s(routed_only, H100, TRAINING, plans, np.zeros(len(plans)))
    assert moe_rerun_s[0] == pytest.approx(routed_rerun_s[0] + shared_s[0])
    assert moe_rerun_s[1] - moe_rerun_s[0] == pytest.approx(shared_s[1])
    assert moe_rerun_s[2] == pytest.approx(shared_s[2])


def test_mla_projections_as_megatron_core_runs_them():
    """Megatron-Core's MLA down projections are duplicated linears on the rank's sequence-parallel shard (s/tp
    tokens; the up projections gather the latents), torchtitan's replicated on every token; without a q latent,
    module mla_up_proj re-runs the q projection with the kv up projection (qkv_up_proj_and_rope_apply)."""
    from autopar.models import load_model
    from costmodels import compute
    from costmodels.specs import Engine, LaunchPath

    v3, lite = load_model("deepseek-v3"), load_model("deepseek-v2-lite")
    plans = PlanArrays.from_plans([Plan(tp=4, sp=True), Plan(tp=4, sp=False)])
    tokens, h = 4096.0, v3.hidden_size
    kv_down, q_down = (compute.attention_gemms(v3, TRAINING, plans)[i] for i in (0, 3))
    assert kv_down.m[0] == tokens / 4 and kv_down.m[1] == tokens
    assert q_down.flops[0] == pytest.approx(2 * tokens / 4 * h * v3.mla.q_lora_rank)
    titan = TrainingSpec(seq_len=4096, global_batch_size=8, engine=Engine.TORCHTITAN, launch=LaunchPath.EAGER)
    assert compute.attention_gemms(v3, titan, plans)[0].m[0] == tokens
    one = PlanArrays.from_plans([sel("mla_up_proj")])
    _, rerun_s = compute.selective_recompute_s(lite, H100, TRAINING, one, np.zeros(1))
    gemms = compute.attention_gemms(lite, TRAINING, one)
    assert rerun_s[0] == pytest.approx(compute._gemms_time_s(H100, TRAINING, [gemms[1], gemms[3]])[0])


def test_hardware_flops_count_the_modules_recomputed():
    """Hardware FLOPs add what the selected modules re-run: the attention core for core_attn (the default), a dense
    MLP for mlp, the whole MoE MLP for moe; layernorm re-runs no GEMM."""
    from costmodels import compute

    plans = PlanArrays.from_plans([sel("core_attn"), sel("layernorm"), sel("moe"), sel("core_attn,moe"), Plan(zero=1)])
    hardware = compute.hardware_flops_per_step(SHARED, TRAINING, plans)
    parts = compute._forward_flops_per_sequence(SHARED, TRAINING)
    flash_extra = hardware[4] - compute.model_flops_per_step(SHARED, TRAINING)
    per_step = TRAINING.global_batch_size
    assert hardware[0] - hardware[4] == pytest.approx(parts["attention_core"] * per_step)
    assert hardware[1] == pytest.approx(hardware[4])
    assert hardware[2] - hardware[4] == pytest.approx(parts["moe_mlp"] * per_step)
    assert hardware[3] - hardware[2] == pytest.approx(parts["attention_core"] * per_step)
    assert flash_extra > 0
