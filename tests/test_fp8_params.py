"""FP8 parameters (TrainingSpec.fp8_param_gather, Megatron-LM --fp8-param-gather): the weights are Transformer
Engine's fp8 layouts with no bf16 copy, the data-parallel all-gather carries fp8 (MXFP8: bf16), the distributed
optimizer or FSDP is required (rule fp8_param_gather), and the CLI and the Megatron-LM reader carry the switch."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import autopar
from autopar.errors import Infeasible
from autopar.cli import main
from autopar.megatron_args import parse_megatron_args
from costmodels import memory, steptime
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.rules import Problem, RULES_BY_ID
from costmodels.scoring import estimate
from costmodels.specs import ClusterSpec, ModelSpec, MoESpec, TrainingSpec

H100 = load_profile("h100-80gb")
B200 = load_profile("b200-180gb")
LLAMA_70B = ModelSpec(name="llama-3.1-70b", hidden_size=8192, num_layers=80, num_attention_heads=64,
                      num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)
MOE = ModelSpec(name="moe-8x", hidden_size=4096, num_layers=16, num_attention_heads=32, num_kv_heads=8,
                ffn_hidden_size=14336, vocab_size=32000,
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
PLAN = Plan(tp=4, pp=2, sp=True, mbs=1, recompute="full", zero=1)


def fp8(recipe: str, params: bool, **fields) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=64, precision="fp8", fp8_recipe=recipe,
                        fp8_param_gather=params, **fields)


def terms(profile, training, plan=PLAN, model=LLAMA_70B, num_gpus=64):
    result = estimate(model, ClusterSpec(profile=profile, num_gpus=num_gpus), training, plan)
    return result, result.stages[result.worst_stage].terms_bytes


# ---- memory: the fp8 layouts are the weights ----------------------------------------------------------------------

@pytest.mark.parametrize("profile, recipe, bytes_per_weight", [
    (H100, "delayed", 2.0),                         # the uint8 buffer and the transpose a TN-only GPU keeps
    (H100, "tensorwise", 2.0),
    (B200, "delayed", 1.0),                         # one buffer for both usages on Blackwell
    (H100, "blockwise", 2 * (1 + 4 / 128**2)),      # rowwise and columnwise data, an fp32 scale per 128x128 block
    (B200, "mxfp8", 2 * (1 + 1 / 32)),              # both layouts, a byte of scale per 32 elements
])
def test_fp8_parameters_replace_the_bf16_weights_and_the_copies(profile, recipe, bytes_per_weight):
    _, bf16_weights = terms(profile, fp8(recipe, params=False))
    result, fp8_weights = terms(profile, fp8(recipe, params=True))
    layer_params = bf16_weights["weights"] / 2                         # bf16: 2 bytes a weight
    assert "fp8_weight_copies" in bf16_weights and "fp8_weight_copies" not in fp8_weights
    assert fp8_weights["weights"] == pytest.approx(layer_params * bytes_per_weight)
    assert bf16_weights["fp8_weight_copies"] == pytest.approx(fp8_weights["weights"])
    # the embedding and output layer stay bf16; gradients and optimizer states do not change
    for name in ("embedding_weights", "gradients", "optimizer_states"):
        assert fp8_weights[name] == bf16_weights[name], name
    saved = sum(bf16_weights.values()) - sum(fp8_weights.values())
    assert saved == pytest.approx(bf16_weights["weights"])             # exactly the bf16 copy
    assert result.peak_memory_bytes == pytest.approx(sum(fp8_weights.values()))


def test_routed_experts_are_fp8_parameters_too():
    plan = Plan(tp=2, sp=True, ep=4, etp=1, mbs=1, recompute="full", zero=1)
    _, bf16_weights = terms(H100, fp8("tensorwise", params=False), plan, MOE, 32)
    _, fp8_weights = terms(H100, fp8("tensorwise", params=True), plan, MOE, 32)
    assert fp8_weights["expert_weights"] == pytest.approx(bf16_weights["expert_weights"])   # 2 bytes either way
    _, b200_bf16 = terms(B200, fp8("tensorwise", params=False), plan, MOE, 32)
    _, b200_fp8 = terms(B200, fp8("tensorwise", params=True), plan, MOE, 32)
    assert b200_fp8["expert_weights"] == pytest.approx(b200_bf16["expert_weights"] / 2)      # one byte on B200


def test_megatron_fsdp_keeps_one_layout_and_gathers_one_layout():
    """zero 3 (optim_grads_params): the shards hold the rowwise fp8 data (MXFP8 its rowwise and transpose buffers);
    a gather brings one layout; the transpose Hopper needs, or block scaling's columnwise data, is made after the
    backward gather on the layer being computed and dropped at its release."""
    plan = Plan(tp=4, pp=2, sp=True, mbs=1, recompute="full", zero=3)
    for profile, recipe, second_layout in ((B200, "delayed", 0.0), (H100, "delayed", 1.0),
                                           (H100, "blockwise", 1 + 4 / 128**2)):
        _, bf16_weights = terms(profile, fp8(recipe, params=False), plan)
        _, fp8_weights = terms(profile, fp8(recipe, params=True), plan)
        layout = fp8(recipe, params=True).param_gather_bytes_by_zero[3]
        assert fp8_weights["weights"] == pytest.approx(bf16_weights["weights"] / 2 * layout), recipe
        two_layers_bf16 = bf16_weights["zero3_prefetch_buffers"]          # two gathered layers at 2 bytes a weight
        assert fp8_weights["zero3_prefetch_buffers"] == pytest.approx(
            two_layers_bf16 / 2 * layout + two_layers_bf16 / 4 * second_layout), (profile.name, recipe)
    _, bf16_weights = terms(B200, fp8("mxfp8", params=False), plan)
    _, mxfp8 = terms(B200, fp8("mxfp8", params=True), plan)
    assert mxfp8["weights"] == pytest.approx(bf16_weights["weights"] * (1 + 1 / 32))        # both buffers kept
    assert mxfp8["zero3_prefetch_buffers"] == pytest.approx(bf16_weights["zero3_prefetch_buffers"] / 2 * (1 + 1 / 32))
    zero2 = Plan(tp=4, pp=2, sp=True, mbs=1, recompute="full", zero=2)
    _, hopper = terms(H100, fp8("delayed", params=True), zero2)
    _, hopper_bf16 = terms(H100, fp8("delayed", params=False), zero2)
    assert hopper["weights"] == pytest.approx(hopper_bf16["weights"] / 2)      # no transpose kept at zero 2 either


def test_layer_weight_bytes_follow_the_recipe_the_switch_and_the_zero_stage():
    zero = np.arange(4)
    assert memory.layer_weight_bytes_per_param(H100, TrainingSpec(), zero).tolist() == [2, 2, 2, 2]
    assert memory.layer_weight_bytes_per_param(H100, fp8("delayed", params=False), zero).tolist() == [2, 2, 2, 2]
    assert memory.layer_weight_bytes_per_param(H100, fp8("delayed", params=True), zero).tolist() == [2, 2, 1, 1]
    assert memory.layer_weight_bytes_per_param(B200, fp8("delayed", params=True), zero).tolist() == [1, 1, 1, 1]


# ---- the data-parallel all-gather --------------------------------------------------------------------------------

def test_the_parameter_all_gather_carries_fp8_and_mxfp8_gathers_bf16():
    assert fp8("delayed", params=True).param_gather_bytes_by_zero == (1.0,) * 4
    assert fp8("blockwise", params=True).param_gather_bytes_by_zero == pytest.approx((1 + 4 / 128**2,) * 4)
    # the distributed optimizer gathers MXFP8 in bf16 and quantizes after; Megatron-FSDP gathers both of its buffers
    # once a step at zero 2, one a gather at zero 3
    assert fp8("mxfp8", params=True).param_gather_bytes_by_zero == pytest.approx((2, 2, 2 + 2 / 32, 1 + 1 / 32))
    assert fp8("delayed", params=False).param_gather_bytes_by_zero == (2.0,) * 4
    cluster = ClusterSpec(profile=H100, num_gpus=256)
    plans = PlanArrays.from_plans([Plan(tp=8, pp=2, sp=True, zero=1)])
    stage = np.zeros(1, dtype=int)
    bf16_reduce, bf16_gather, _, _ = steptime.dp_traffic_s(LLAMA_70B, cluster, plans, stage)
    fp8_reduce, fp8_gather, _, _ = steptime.dp_traffic_s(LLAMA_70B, cluster, plans, stage,
                                                         layer_param_bytes_by_zero=(1.0,) * 4)
    assert fp8_reduce[0] == bf16_reduce[0]                                  # gradients are not fp8
    # the embedding stage still gathers its bf16 embedding: more than half, less than all
    assert 0.5 * bf16_gather[0] < fp8_gather[0] < bf16_gather[0]
    middle = np.ones(1, dtype=int)                                           # stage 1 of 4: decoder layers only
    only_layers = PlanArrays.from_plans([Plan(tp=8, pp=4, sp=True, zero=1)])
    _, layer_gather, _, _ = steptime.dp_traffic_s(LLAMA_70B, cluster, only_layers, middle)
    _, layer_fp8_gather, _, _ = steptime.dp_traffic_s(LLAMA_70B, cluster, only_layers, middle,
                                                      layer_param_bytes_by_zero=(1.0,) * 4)
    assert layer_fp8_gather[0] < 0.6 * layer_gather[0]                      # a middle stage: layers only


def test_the_step_gathers_less_where_the_gather_is_exposed():
    bf16_run, _ = terms(H100, fp8("delayed", params=False), Plan(tp=8, pp=1, sp=True, zero=1), num_gpus=256)
    fp8_run, _ = terms(H100, fp8("delayed", params=True), Plan(tp=8, pp=1, sp=True, zero=1), num_gpus=256)
    assert fp8_run.time_terms_s["dp_comm"] < bf16_run.time_terms_s["dp_comm"]
    assert fp8_run.time_terms_s["compute"] == bf16_run.time_terms_s["compute"]


# ---- what Megatron-Core requires -------------------------------------------------------------------------------

def test_fp8_parameters_need_fp8():
    with pytest.raises(InputError, match="fp8 parameters need fp8 GEMMs"):
        TrainingSpec(fp8_param_gather=True)


def test_fp8_parameters_need_the_distributed_optimizer():
    rule = RULES_BY_ID["fp8_param_gather"]
    problem = Problem(LLAMA_70B, ClusterSpec(profile=H100, num_gpus=64), fp8("delayed", params=True))
    plans = PlanArrays.from_plans([dataclasses.replace(PLAN, zero=z) for z in range(4)])
    assert rule.holds(problem, plans).tolist() == [False, True, True, True]
    assert "--zero 1" in rule.why_broken(problem, dataclasses.replace(PLAN, zero=0))
    off = Problem(LLAMA_70B, ClusterSpec(profile=H100, num_gpus=64), fp8("delayed", params=False))
    assert rule.holds(off, plans).all()


def test_the_search_keeps_zero_at_one_or_more_and_both_solvers_agree():
    # a toy the differential tests also use: small enough for CP-SAT's epsilon walk to be quick
    model = ModelSpec(name="toy", hidden_size=512, num_layers=4, num_attention_heads=4, ffn_hidden_size=2048,
                      vocab_size=1000)
    cluster = ClusterSpec(profile=H100, num_gpus=4)
    training = TrainingSpec(seq_len=512, global_batch_size=8, precision="fp8", fp8_param_gather=True)
    options = {"bounds": {"mbs": (None, 2), "vpp": (None, 2)}}
    by_cpsat = autopar.solve(model, cluster, training, solver="cpsat", **options)
    by_oracle = autopar.solve(model, cluster, training, solver="oracle", **options)
    assert by_oracle.points and all(point.plan.zero >= 1 for point in by_oracle.points)
    assert [p.plan for p in by_cpsat] == [p.plan for p in by_oracle]
    # the rule is what excludes ZeRO-0: pinned there, the search finds plans without fp8 parameters and none with
    pinned = {**options, "fix": {"zero": 0}}
    assert autopar.solve(model, cluster, dataclasses.replace(training, fp8_param_gather=False), solver="oracle",
                         **pinned).points
    with pytest.raises(Infeasible):
        autopar.solve(model, cluster, training, solver="oracle", **pinned)


# ---- the Megatron-LM reader and the CLI --------------------------------------------------------------------------

COMMAND = ("--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 --global-batch-size 64 "
           "--seq-length 4096 --use-distributed-optimizer --bf16 --fp8-format e4m3")


def test_the_reader_takes_fp8_parameters_as_megatron_runs_them():
    assert parse_megatron_args(COMMAND + " --fp8-param-gather").training["fp8_param_gather"] is True
    assert parse_megatron_args(COMMAND).training["fp8_param_gather"] is False
    torch_fsdp = parse_megatron_args(COMMAND.replace("--use-distributed-optimizer", "--use-torch-fsdp2")
                                     + " --fp8-param-gather")
    assert torch_fsdp.training["fp8_param_gather"] is False
    assert any("validate_args turns it off" in note for note in torch_fsdp.notes)
    with pytest.raises(InputError, match="--fp8-param-gather without --fp8-format"):
        parse_megatron_args(COMMAND.replace(" --fp8-format e4m3", "") + " --fp8-param-gather")


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_prices_fp8_parameters_and_refuses_them_where_megatron_does(capsys):
    base = ("estimate", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8", "--tp", "2", "--precision", "fp8")
    code, out, _ = run_cli(capsys, *base, "--zero", "1", "--fp8-param-gather", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["inputs"]["training"]["fp8_param_gather"] is True
    code, out, _ = run_cli(capsys, *base, "--zero", "1", "--fp8-param-gather")
    assert code == 0 and "fp8 parameters" in out
    code, _, err = run_cli(capsys, *base, "--fp8-param-gather")                      # zero 0
    assert code == 2 and "rule fp8_param_gather" in err
    code, _, err = run_cli(capsys, "estimate", "llama-3.1-8b", "--gpus", "8", "--zero", "1", "--fp8-param-gather")
    assert code == 2 and "fp8 parameters need fp8 GEMMs" in err


def test_a_typed_switch_the_command_does_not_set_is_noted_not_priced(capsys):
    code, out, err = run_cli(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8",
                             "--fp8-param-gather", "--from-megatron-args", COMMAND, "--json")
    assert code == 0 and "--fp8-param-gather ignored" in err
    assert json.loads(out)["inputs"]["training"]["fp8_param_gather"] is False
