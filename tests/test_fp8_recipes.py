"""FP8 recipes (TrainingSpec.fp8_recipe, Megatron-Core --fp8-recipe): where Transformer Engine runs each, what its
casts move, the fp8 sequence-parallel all-gather and current scaling's amax all-reduce, and how the CLI, the
Megatron-LM reader and the exports carry the recipe."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from autopar.cli import main
from autopar.export import launch_config
from autopar.megatron_args import parse_megatron_args
from costmodels import compute, memory, steptime
from costmodels.comm import group_collective_time_s, tp_group
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays, RecomputeModule
from costmodels.scoring import estimate
from costmodels.specs import ClusterSpec, Fp8Recipe, ModelSpec, TrainingSpec

H100 = load_profile("h100-80gb")
B200 = load_profile("b200-180gb")
LLAMA_70B = ModelSpec(name="llama-3.1-70b", hidden_size=8192, num_layers=80, num_attention_heads=64,
                      num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)
TP8 = Plan(tp=8, sp=True, mbs=1, recompute="full", zero=1)


def fp8(recipe: str, **fields) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=64, precision="fp8", fp8_recipe=recipe, **fields)


def step(profile, training, plan=TP8, model=LLAMA_70B):
    return estimate(model, ClusterSpec(profile=profile, num_gpus=64), training, plan)


# ---- where each recipe runs (TE pytorch/quantization.py) ---------------------------------------------------------

@pytest.mark.parametrize("profile, recipe, runs", [
    (H100, "delayed", True), (H100, "tensorwise", True), (H100, "blockwise", True), (H100, "mxfp8", False),
    (B200, "delayed", True), (B200, "tensorwise", True), (B200, "blockwise", True), (B200, "mxfp8", True),
])
def test_each_recipe_runs_where_transformer_engine_runs_it(profile, recipe, runs):
    if runs:
        step(profile, fp8(recipe))
    else:
        with pytest.raises(InputError, match="mxfp8 needs compute capability 10.x.*9.0: use --fp8-recipe"):
            step(profile, fp8(recipe))


def test_a_profile_without_compute_capability_takes_per_tensor_recipes_only():
    unstated = dataclasses.replace(B200, compute_capability=0.0)
    step(unstated, fp8("delayed"))
    with pytest.raises(InputError, match="states no compute.compute_capability"):
        step(unstated, fp8("mxfp8"))


def test_an_unknown_recipe_names_the_choices():
    with pytest.raises(InputError, match="unknown fp8 recipe 'nvfp4'; use delayed, tensorwise, blockwise, mxfp8"):
        TrainingSpec(precision="fp8", fp8_recipe="nvfp4")


def test_delayed_scaling_does_not_recompute_layernorm_or_moe_act():
    """Megatron-Core refuses them under delayed scaling; other recipes and other modules pass, and no fp8 front
    searched with delayed scaling holds one."""
    from costmodels.scoring import rule_violations

    modules = Plan(tp=2, sp=True, mbs=1, zero=1, recompute="selective", recompute_modules=("core_attn", "layernorm"))
    cluster = ClusterSpec(profile=H100, num_gpus=64)
    broken = rule_violations(LLAMA_70B, cluster, fp8("delayed"), modules)
    message = broken["fp8_delayed_recompute"]
    assert "layernorm" in message and "--fp8-recipe tensorwise" in message
    assert "fp8_delayed_recompute" not in rule_violations(LLAMA_70B, cluster, fp8("tensorwise"), modules)
    assert "fp8_delayed_recompute" not in rule_violations(LLAMA_70B, cluster, TrainingSpec(), modules)
    core = dataclasses.replace(modules, recompute_modules=("core_attn",))
    assert "fp8_delayed_recompute" not in rule_violations(LLAMA_70B, cluster, fp8("delayed"), core)
    from autopar.models import load_model
    from autopar.search.solve import solve

    front = solve(load_model("mixtral-8x7b"), cluster, fp8("delayed"))
    refused = int(RecomputeModule.LAYERNORM | RecomputeModule.MOE_ACT)
    assert front.points and not any(p.plan.recompute_modules & refused for p in front.points)
    # what Megatron-Core allows under delayed scaling is still searched: the routed MLP's recompute (moe)
    from autopar.search.space import selective_module_sets

    searched = selective_module_sets(load_model("mixtral-8x7b"), fp8("delayed"))
    assert any(s & RecomputeModule.MOE for s in searched) and not any(s & refused for s in searched)
    assert any(s & RecomputeModule.LAYERNORM for s in selective_module_sets(load_model("mixtral-8x7b"),
                                                                          fp8("tensorwise")))


# ---- what the casts move ---------------------------------------------------------------------------------------

def test_cast_bytes_follow_each_recipes_kernels():
    """(per element cast, per element of the gathered tensor). Unfused, not gathered: read 2 bytes, write each copy;
    Hopper's TN-only FP8 GEMMs need a transposed copy under per-tensor scaling, Blackwell's do not; block scaling
    writes both layouts everywhere, with its scales; current scaling reads the input once more for the amax."""
    def per(profile, recipe, **how):
        return compute.fp8_cast_bytes_per_element(profile, recipe, **how)

    assert per(H100, Fp8Recipe.DELAYED) == (4.0, 0.0) and per(B200, Fp8Recipe.DELAYED) == (3.0, 0.0)
    assert per(H100, Fp8Recipe.TENSORWISE) == (6.0, 0.0)
    assert per(B200, Fp8Recipe.MXFP8)[0] == pytest.approx(4.0 + 2.0 / 32.0)
    assert per(H100, Fp8Recipe.BLOCKWISE)[0] == per(B200, Fp8Recipe.BLOCKWISE)[0] == pytest.approx(4.0 + 8.0 / 128.0)
    # a sequence-parallel input on Hopper: the shard cast rowwise only, the gathered tensor transposed after
    assert per(H100, Fp8Recipe.DELAYED, gathered=True) == (3.0, 2.0)
    assert per(B200, Fp8Recipe.DELAYED, gathered=True) == (3.0, 0.0)
    # a norm fused into the layer casts in the norm kernel: delayed writes fp8 itself (only Hopper's transpose
    # stays), current scaling takes its amax from the norm; block scaling is not fused
    assert per(H100, Fp8Recipe.DELAYED, norm_fused=True) == (2.0, 0.0)
    assert per(H100, Fp8Recipe.DELAYED, norm_fused=True, gathered=True) == (0.0, 2.0)
    assert per(B200, Fp8Recipe.DELAYED, norm_fused=True) == (0.0, 0.0)
    assert per(H100, Fp8Recipe.TENSORWISE, norm_fused=True) == (4.0, 0.0)
    # which GPUs' FP8 GEMMs take only TN (TE nvte_is_non_tn_fp8_gemm_supported): Hopper and 12.x, not 10.x or 13.x
    assert [compute.fp8_tn_only(dataclasses.replace(B200, compute_capability=cc)) for cc in (9.0, 10.0, 12.0, 13.0)] \
        == [True, False, True, False]
    assert per(B200, Fp8Recipe.MXFP8, norm_fused=True) == per(B200, Fp8Recipe.MXFP8)


def test_a_sequence_parallel_input_is_cast_on_its_own_shard():
    """QKV reads the all-gathered sequence; TE casts the GPU's 1/tp shard before the gather (and on Hopper transposes
    the gathered tensor after it), while the row-parallel input of the projection is already per rank."""
    training = fp8("tensorwise")
    with_sp, without = (PlanArrays.from_plans([Plan(tp=8, sp=sp, mbs=1)]) for sp in (True, False))
    tokens = 8192.0
    qkv, proj = compute.attention_gemms(LLAMA_70B, training, with_sp)[:2]
    assert qkv.norm_fused_input and qkv.sp_gathered_input and not proj.sp_gathered_input
    shard, gathered = compute.fp8_cast_bytes_per_element(H100, Fp8Recipe.TENSORWISE, norm_fused=True, gathered=True)
    whole, _ = compute.fp8_cast_bytes_per_element(H100, Fp8Recipe.TENSORWISE, norm_fused=True)
    plain, _ = compute.fp8_cast_bytes_per_element(H100, Fp8Recipe.TENSORWISE)
    qkv_elements, proj_elements = tokens * 8192, tokens * LLAMA_70B.q_size / 8
    for plans, qkv_bytes in ((with_sp, shard / 8 + gathered), (without, whole)):
        cast = compute.fp8_cast_bytes([qkv, proj], H100, training, plans)
        assert float(cast[0]) == pytest.approx(qkv_elements * qkv_bytes + proj_elements * plain)
    assert float(compute.fp8_cast_bytes([qkv, proj], H100, TrainingSpec(), with_sp)[0]) == 0.0


# ---- the fp8 all-gather and the amax all-reduce ---------------------------------------------------------------

def test_fp8_gathers_carry_one_byte_an_element_and_reduce_scatters_stay_bf16():
    cluster = ClusterSpec(profile=H100, num_gpus=64)
    plans = PlanArrays.from_plans([TP8])
    elements = 8192.0 * LLAMA_70B.hidden_size
    bf16 = steptime.tp_block_s(LLAMA_70B, cluster, TrainingSpec(seq_len=8192, global_batch_size=64), plans)
    delayed = steptime.tp_block_s(LLAMA_70B, cluster, fp8("delayed"), plans)
    group = tp_group(plans, cluster.nvlink_domain_gpus)
    assert float(delayed[2][0]) == pytest.approx(float(group_collective_time_s(H100, group, "all_gather",
                                                                                elements * 1.0)[0]))
    assert float(bf16[2][0]) == pytest.approx(float(group_collective_time_s(H100, group, "all_gather",
                                                                             elements * 2.0)[0]))
    assert float(delayed[3][0]) == float(bf16[3][0])                        # the reduce-scatter
    assert float(delayed[4][0]) == float(bf16[4][0]) == 0.0                 # no amax all-reduce


def test_block_scaling_gathers_both_layouts_in_the_backward():
    """The row-parallel backward gathers its output gradient with rowwise and columnwise data under MXFP8 (and
    blockwise): two copies with their scales, against one in the forward and under per-tensor recipes."""
    cluster = ClusterSpec(profile=B200, num_gpus=64)
    plans = PlanArrays.from_plans([TP8])
    group = tp_group(plans, cluster.nvlink_domain_gpus)
    elements = 8192.0 * LLAMA_70B.hidden_size

    def gather(bytes_per_element):
        return float(group_collective_time_s(B200, group, "all_gather", elements * bytes_per_element)[0])

    mxfp8 = steptime.tp_block_s(LLAMA_70B, cluster, fp8("mxfp8"), plans)
    copy = 1.0 + 1.0 / 32.0
    assert float(mxfp8[2][0]) == pytest.approx(gather(copy))
    assert float(mxfp8[5][0]) == pytest.approx(gather(2 * copy) - gather(copy))
    assert float(steptime.tp_block_s(LLAMA_70B, cluster, fp8("delayed"), plans)[5][0]) == 0.0


def test_delayed_scaling_all_reduces_its_amaxes_over_the_stage_once_a_pass(monkeypatch):
    """Megatron-Core's one fp8 autocast per stage: TE all-reduces the pass's amaxes over tp·cp·dp on leaving it,
    forward and backward (and a recomputed forward)."""
    from costmodels.comm import stage_group

    cluster = ClusterSpec(profile=H100, num_gpus=64)
    stage = np.zeros(1, dtype=int)
    plans = PlanArrays.from_plans([Plan(tp=8, sp=True, mbs=1, zero=1)])
    one_pass = float(steptime.fp8_delayed_amax_reduction_s(LLAMA_70B, cluster, fp8("delayed"), plans, stage)[0])
    amax_bytes = 4 * LLAMA_70B.num_layers * steptime.AMAXES_PER_LINEAR_PASS * 4
    assert one_pass > 0.0 and one_pass == pytest.approx(float(group_collective_time_s(
        H100, stage_group(plans, 64, cluster.nvlink_domain_gpus), "all_reduce", amax_bytes)[0]))
    for training in (fp8("tensorwise"), fp8("blockwise"), TrainingSpec()):
        assert float(steptime.fp8_delayed_amax_reduction_s(LLAMA_70B, cluster, training, plans, stage)[0]) == 0.0
    for plan, passes in ((Plan(tp=8, sp=True, mbs=1, zero=1), 2.0), (TP8, 3.0)):       # TP8: full recompute
        plans = PlanArrays.from_plans([plan])
        times = compute.layer_times_s(LLAMA_70B, H100, fp8("delayed"), plans)
        with_amax = float(steptime.tp_comm_s(LLAMA_70B, cluster, fp8("delayed"), plans, stage, times.tp_overlap)[0])
        with monkeypatch.context() as patch:
            patch.setattr(steptime, "fp8_delayed_amax_reduction_s", lambda *args: np.zeros(1))
            without = float(steptime.tp_comm_s(LLAMA_70B, cluster, fp8("delayed"), plans, stage, times.tp_overlap)[0])
        assert with_amax - without == pytest.approx(passes * one_pass)


@pytest.mark.parametrize("tp_comm_overlap", [False, True])
def test_current_scaling_pays_an_amax_all_reduce_per_tp_block_and_pass(tp_comm_overlap):
    """Forward (column-parallel input), backward (row-parallel output gradient) and the recomputed forward each
    all-reduce one amax over the tp group per TP block; userbuffers do not carry it, so it stays with the overlap."""
    cluster = ClusterSpec(profile=H100, num_gpus=64)
    plans = PlanArrays.from_plans([TP8])
    delayed, tensorwise = (fp8(r, tp_comm_overlap=tp_comm_overlap) for r in ("delayed", "tensorwise"))
    amax_s = float(steptime.fp8_amax_reduction_s(cluster, tensorwise, plans)[0])
    assert amax_s == pytest.approx(float(group_collective_time_s(
        H100, tp_group(plans, cluster.nvlink_domain_gpus), "all_reduce", 4.0)[0]))
    times = compute.layer_times_s(LLAMA_70B, H100, delayed, plans)
    stage = np.zeros(1, dtype=int)
    extra = (steptime.tp_comm_s(LLAMA_70B, cluster, tensorwise, plans, stage, times.tp_overlap)
             - steptime.tp_comm_s(LLAMA_70B, cluster, delayed, plans, stage, times.tp_overlap))
    passes = 3.0                                            # full recompute: forward, backward, recomputed forward
    blocks = 2.0 * LLAMA_70B.num_layers                     # attention and MLP per layer
    delayed_own = passes * float(steptime.fp8_delayed_amax_reduction_s(LLAMA_70B, cluster, delayed, plans, stage)[0])
    assert float(extra[0]) == pytest.approx(passes * blocks * amax_s - delayed_own)
    no_sp = PlanArrays.from_plans([dataclasses.replace(TP8, sp=False)])
    assert float(steptime.fp8_amax_reduction_s(cluster, tensorwise, no_sp)[0]) == 0.0


def test_recipes_order_as_their_kernels_on_one_layout():
    h100 = {r: step(H100, fp8(r)).step_time_s for r in ("delayed", "tensorwise", "blockwise")}
    assert h100["delayed"] < h100["blockwise"] < h100["tensorwise"]
    b200 = {r: step(B200, fp8(r)).step_time_s for r in ("delayed", "mxfp8", "tensorwise")}
    assert b200["delayed"] < b200["mxfp8"] < b200["tensorwise"]
    bf16 = step(H100, TrainingSpec(seq_len=8192, global_batch_size=64)).step_time_s
    assert max(h100.values()) < bf16


# ---- what fp8 activations keep ---------------------------------------------------------------------------------

def layer_activations(training, plan, model=LLAMA_70B, profile=H100):
    cluster = ClusterSpec(profile=profile, num_gpus=64)
    plans = PlanArrays.from_plans([plan])
    return float(memory.memory_terms_bytes(model, cluster, training, plans, 0,
                                           only=("layer_activations",))["layer_activations"][0])


@pytest.mark.parametrize("recipe", ["delayed", "mxfp8"])
def test_fp8_layers_keep_the_quantized_linear_inputs(recipe):
    """Transformer Engine keeps the fp8 copy of a linear layer's input for the weight gradient: per token the QKV and
    fc1 inputs (h each, outside TP) and fc2's (F, inside TP) drop from 2 bytes to one plus scales. The projection
    keeps flash attention's bf16 output, and under delayed scaling an fp8 copy beside it (+ q_size, inside TP;
    Megatron-Core has the other recipes keep the original, attention.py set_save_original_input)."""
    plan = Plan(tp=8, sp=True, mbs=1, zero=1)
    bf16, fp8_ = (layer_activations(t, plan, profile=B200) for t in (
        TrainingSpec(seq_len=8192, global_batch_size=64), fp8(recipe)))
    copy = 1.0 + (1.0 / 32.0 if recipe == "mxfp8" else 0.0)
    h, f, q = LLAMA_70B.hidden_size, LLAMA_70B.ffn_hidden_size, LLAMA_70B.q_size
    tokens = 8192 / 8                                                      # SP: every term is per 1/tp of the tokens
    shape = memory.stage_shape(LLAMA_70B, ClusterSpec(profile=B200, num_gpus=64), fp8(recipe),
                               PlanArrays.from_plans([plan]), 0)
    projection_copy = copy * q if recipe == "delayed" else 0.0
    per_layer = tokens * ((2 - copy) * (2 * h + f) - projection_copy)
    assert bf16 - fp8_ == pytest.approx(per_layer * float(shape.layers[0]) * float(shape.in_flight[0]))
    assert fp8_ < bf16


@pytest.mark.parametrize("profile, recipe, per_param", [
    (H100, "delayed", 2.0), (H100, "tensorwise", 2.0), (H100, "blockwise", 2.0 * (1 + 4.0 / 128**2)),
    (B200, "delayed", 1.0), (B200, "tensorwise", 1.0), (B200, "mxfp8", 2.0 * (1 + 1.0 / 32.0)),
])
def test_transformer_engine_keeps_fp8_copies_of_the_layer_weights(profile, recipe, per_param):
    """TE caches each fp8 linear's quantized weight across micro-batches (is_first_microbatch), both layouts: a
    transpose beside a per-tensor copy on Hopper (TN-only), one buffer on Blackwell, two block-scaled copies for
    MXFP8 and blockwise; the layers' weights only (dense and routed experts), whole under ZeRO-3 too (Megatron-FSDP
    unshards into the parameters, and TE caches the whole weight), none in bf16."""
    from test_report_support import moe_model

    for model, plan in ((LLAMA_70B, Plan(tp=8, sp=True, mbs=1, zero=1)), (moe_model(), Plan(tp=2, ep=4, mbs=1))):
        cluster, plans = ClusterSpec(profile=profile, num_gpus=64), PlanArrays.from_plans([plan])
        terms = memory.memory_terms_bytes(model, cluster, fp8(recipe), plans, 0)
        shape = memory.stage_shape(model, cluster, fp8(recipe), plans, 0)
        weights = float(shape.layer_params_per_gpu[0] + shape.expert_params_per_gpu[0])
        assert float(terms["fp8_weight_copies"][0]) == pytest.approx(weights * per_param)
        assert "fp8_weight_copies" not in memory.memory_terms_bytes(model, cluster, TrainingSpec(), plans, 0)
    zero1, zero3 = (PlanArrays.from_plans([Plan(tp=8, sp=True, mbs=1, zero=zero)]) for zero in (1, 3))
    copies = [float(memory.memory_terms_bytes(LLAMA_70B, ClusterSpec(profile=profile, num_gpus=64), fp8(recipe), p,
                                              0)["fp8_weight_copies"][0]) for p in (zero1, zero3)]
    assert copies[1] == copies[0] > 0


def test_layernorm_recompute_drops_a_moe_layers_pre_mlp_norm_in_fp8_as_in_bf16():
    """The pre-MLP norm of a MoE layer is a module of its own (the router keeps its bf16 output, and under fp8 the
    shared expert keeps the original too): recomputing it drops 2h bytes per token in either precision."""
    from autopar.models import load_model

    model = load_model("qwen3-30b-a3b")
    base = Plan(tp=2, sp=True, ep=8, etp=1, mbs=1, zero=1, recompute="selective", recompute_modules=("core_attn",))
    with_norm = dataclasses.replace(base, recompute_modules=("core_attn", "layernorm"))
    for training in (TrainingSpec(seq_len=8192, global_batch_size=64), fp8("tensorwise")):
        shape = memory.stage_shape(model, ClusterSpec(profile=H100, num_gpus=64), training,
                                   PlanArrays.from_plans([with_norm]), 0)
        dropped = 2 * model.hidden_size * 8192 / 2 * float(shape.moe_layers[0]) * float(shape.in_flight[0])
        assert layer_activations(training, base, model=model) - layer_activations(training, with_norm, model=model) \
            == pytest.approx(dropped)


# ---- CLI, reader and exports -----------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


ESTIMATE = ("estimate", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--sp", "--mbs", "1", "--zero", "1",
            "--seq-len", "4096", "--global-batch", "64")


def test_cli_refuses_a_recipe_the_gpu_or_the_precision_does_not_run(capsys):
    code, _, err = run_cli(capsys, *ESTIMATE, "--gpu", "h100", "--precision", "fp8", "--fp8-recipe", "mxfp8")
    assert code == 2 and "mxfp8 needs compute capability 10.x" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, *ESTIMATE, "--gpu", "h100", "--fp8-recipe", "tensorwise")
    assert code == 2 and "--fp8-recipe tensorwise only applies with --precision fp8" in err


def test_cli_prints_and_writes_the_recipe(capsys):
    code, out, _ = run_cli(capsys, *ESTIMATE, "--gpu", "b200", "--precision", "fp8", "--fp8-recipe", "mxfp8",
                           "--json")
    assert code == 0
    assert json.loads(out)["inputs"]["training"]["fp8_recipe"] == "mxfp8"
    code, out, _ = run_cli(capsys, *ESTIMATE, "--gpu", "h100", "--precision", "fp8", "--fp8-recipe", "tensorwise")
    assert code == 0 and "fp8 (tensorwise scaling)" in " ".join(out.split())


def test_megatron_command_round_trips_the_recipe():
    point = step(H100, fp8("blockwise"), Plan(tp=2, sp=True, mbs=1), model=LLAMA_70B)
    text = launch_config(point, "megatron").text
    run = parse_megatron_args(text)
    assert run.training["precision"] == "fp8" and run.training["fp8_recipe"] == "blockwise"
    assert parse_megatron_args("--bf16 --fp8-format hybrid").training["fp8_recipe"] == "delayed"
    without = parse_megatron_args("--bf16 --fp8-recipe mxfp8")
    assert "fp8_recipe" not in without.training and any("without --fp8-format" in n for n in without.notes)
    with pytest.raises(InputError, match="--fp8-recipe custom"):
        parse_megatron_args("--bf16 --fp8-format hybrid --fp8-recipe custom")


def test_a_typed_recipe_that_contradicts_the_command_is_bad_input(capsys):
    command = ("--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 --global-batch-size 64 "
               "--seq-length 4096 --use-distributed-optimizer --bf16 --fp8-format hybrid")
    code, _, err = run_cli(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8",
                           "--from-megatron-args", command, "--fp8-recipe", "tensorwise")
    assert code == 2 and "contradicts the Megatron-LM command's fp8 recipe delayed" in err
    code, _, _ = run_cli(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8",
                         "--from-megatron-args", command + " --fp8-recipe tensorwise", "--fp8-recipe", "tensorwise")
    assert code == 0
    code, _, err = run_cli(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8",
                           "--from-megatron-args", command, "--precision", "bf16")
    assert code == 2 and "--precision bf16 contradicts the Megatron-LM command's fp8 (--fp8-format)" in err
    run = parse_megatron_args(command + " --fp8-param-gather")
    assert run.training["fp8_param_gather"] and not any("--fp8-param-gather" in note for note in run.notes)
    with pytest.raises(InputError, match="--first-last-layers-bf16 with delayed scaling"):
        parse_megatron_args(command + " --first-last-layers-bf16")
    assert parse_megatron_args(command + " --fp8-recipe tensorwise --first-last-layers-bf16").notes
    code, _, err = run_cli(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8",
                           "--from-megatron-args", command, "--precision", "fp9")
    assert code == 2 and "unknown precision 'fp9'" in err


@pytest.mark.parametrize("recipe, nemo, bridge", [
    ("delayed", "bf16_with_fp8_mixed", "bf16_with_fp8_delayed_scaling_mixed"),
    ("tensorwise", "bf16_with_fp8_current_scaling_mixed", "bf16_with_fp8_current_scaling_mixed"),
    ("blockwise", "bf16_with_fp8_subchannel_scaling_mixed", "bf16_with_fp8_subchannel_scaling_mixed"),
])
def test_nemo_and_bridge_get_the_recipes_preset(recipe, nemo, bridge):
    """Priced with the preset's own fp8 parameters (all but the subchannel presets keep them), each framework runs
    the preset: NeMo's by its dotted path (only bf16_mixed and fp16_mixed are NeMo-Run CLI factories), Bridge's by
    name."""
    point = step(H100, fp8(recipe, fp8_param_gather=recipe != "blockwise"), Plan(tp=2, sp=True, mbs=1, zero=1))
    nemo_text, bridge_text = launch_config(point, "nemo").text, launch_config(point, "bridge").text
    assert f"trainer.plugins=nemo.collections.llm.recipes.precision.mixed_precision.{nemo} \\\n" in nemo_text
    assert f"mixed_precision={bridge}\n" in bridge_text
    if recipe == "tensorwise":   # the preset's bf16 first and last layers are not what was priced: said
        assert "first_last_layers_bf16" in nemo_text and "first_last_layers_bf16" in bridge_text


@pytest.mark.parametrize("params", [False, True])
def test_preset_notes_leave_fp8_parameters_to_the_written_setting(params):
    """fp8 parameters are written as priced over NeMo's and Bridge's presets (export.common.fp8_param_fields), so
    no note says a preset runs other weights or gathers than the estimate priced; the current-scaling preset's bf16
    first and last layers, which no override turns off here, are still said."""
    for recipe in ("delayed", "tensorwise", "blockwise"):
        point = step(H100, fp8(recipe, fp8_param_gather=params), Plan(tp=2, sp=True, mbs=1, zero=1))
        for framework in ("nemo", "bridge"):
            notes = " ".join(launch_config(point, framework).unexpressed)
            assert "fp8_param" not in notes and "fp8 parameters" not in notes, (recipe, framework)
            assert ("first_last_layers_bf16" in notes) is (recipe == "tensorwise")


def test_frameworks_without_transformer_engines_weight_cache_say_what_the_estimate_counted():
    """torchao's fp8 linears (torchtitan) and TE layers called without is_first_microbatch (DeepSpeed) keep no fp8
    weight copies: the exports name the GiB the estimate counted; in bf16 there is nothing to say."""
    for precision in ("fp8", "bf16"):
        training = fp8("mxfp8") if precision == "fp8" else TrainingSpec(seq_len=8192, global_batch_size=64)
        point = step(B200, training, Plan(tp=1, mbs=1, zero=2, recompute="full"))
        for framework in ("torchtitan", "deepspeed"):
            said = " ".join(launch_config(point, framework).unexpressed)
            assert ("the estimate counts Transformer Engine's fp8 copies of the weights" in said) is (
                precision == "fp8"), (framework, precision)


def test_torchtitan_gets_mxfp8_or_a_note_for_recipes_it_lacks():
    mxfp8 = launch_config(step(B200, fp8("mxfp8"), Plan(tp=2, sp=True, mbs=1)), "torchtitan").text
    assert "MXFP8LinearConverter" in mxfp8
    delayed = launch_config(step(H100, fp8("delayed"), Plan(tp=2, sp=True, mbs=1)), "torchtitan").text
    assert "# not expressible: fp8 recipe delayed" in delayed
