"""Launch configs for every framework: the framework's own syntax parses, the values are the plan's, and what the
framework cannot express is said (as comments where the syntax has them)."""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest
import yaml

from autopar.export import FRAMEWORKS, emit, framework_name, launch_config
from autopar.export.common import chunk_layers_in_model_order, mcore_parallel_fields, stage_layers
from costmodels.errors import InputError
from costmodels.plan import Plan, Recompute
from costmodels.specs import Precision, TrainingSpec
from test_report_support import DENSE_PLANS, MOE_PLANS, cluster, dense_model, moe_model, synthetic_estimate

TRAINING = TrainingSpec(seq_len=4096, global_batch_size=512)


def estimate_of(plan: Plan, model=None, num_gpus: int = 64, training: TrainingSpec = TRAINING):
    return synthetic_estimate(model or moe_model(), cluster(num_gpus), training, plan)


def overrides(text: str) -> dict[str, str]:
    """key=value lines of a Hydra override list (comments and line continuations dropped)."""
    pairs = {}
    for line in text.splitlines():
        line = line.rstrip(" \\")
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def test_stage_layers_and_chunks_follow_megatron():
    plan = Plan(tp=1, pp=4, vpp=2, first_stage_layers=6, last_stage_layers=6)
    # 32 layers: 6 first, 6 last, (32 - 12) / 2 = 10 on each middle rank; vpp 2 halves each rank's layers
    assert stage_layers(32, plan) == [6, 10, 10, 6]
    assert chunk_layers_in_model_order(32, plan) == [3, 5, 5, 3, 3, 5, 5, 3]
    assert sum(chunk_layers_in_model_order(32, plan)) == 32


def test_embedding_and_loss_slots_follow_megatron_core():
    # Llama-3.1-405B's 126 layers on pp 16 with vpp 4: 126 + 2 slots = 8 per rank, 2 per chunk; the embedding takes a
    # layer's place in rank 0's first chunk, the loss in rank 15's last chunk
    plan = Plan(tp=8, pp=16, vpp=4, sp=True, first_stage_layers=7, last_stage_layers=7)
    chunks = chunk_layers_in_model_order(126, plan)
    assert len(chunks) == 64 and sum(chunks) == 126
    assert chunks[0] == 1 and chunks[-1] == 1 and set(chunks[1:-1]) == {2}
    fields = mcore_parallel_fields(plan, 126, moe=False)
    assert fields["account_for_embedding_in_pipeline_split"] and fields["account_for_loss_in_pipeline_split"]
    assert fields["num_layers_in_first_pipeline_stage"] is None and fields["num_layers_in_last_pipeline_stage"] is None
    # every Megatron-Core based export carries the slot split (NeMo 2, Megatron-Bridge, verl), torchtitan its chunks
    estimate = estimate_of(plan, model=dataclasses.replace(dense_model(), num_layers=126), num_gpus=128,
                           training=TrainingSpec(seq_len=4096, global_batch_size=256))
    for framework in ("nemo", "bridge", "verl"):
        text = emit(estimate, framework)
        assert "account_for_embedding_in_pipeline_split" in text and "account_for_loss_in_pipeline_split" in text
        assert "num_layers_in_first_pipeline_stage" not in text, framework
    megatron = emit(estimate, "megatron")
    assert "--account-for-embedding-in-pipeline-split" in megatron and "--decoder-first" not in megatron
    assert '"layers.1", "layers.3"' in emit(estimate, "torchtitan")
    # without interleaving the same split is an ordinary uneven one
    plain = Plan(tp=8, pp=16, sp=True, first_stage_layers=7, last_stage_layers=7)
    assert chunk_layers_in_model_order(126, plain) == [7] + [8] * 14 + [7]
    assert mcore_parallel_fields(plain, 126, moe=False)["account_for_embedding_in_pipeline_split"] is None
    assert mcore_parallel_fields(plain, 126, moe=False)["num_layers_in_first_pipeline_stage"] == 7


@pytest.mark.parametrize("plan", DENSE_PLANS + MOE_PLANS, ids=lambda p: p.short())
def test_every_framework_emits_parsable_text(plan):
    estimate = estimate_of(plan)
    assert launch_config(estimate, "deepspeed").text == emit(estimate, "deepspeed")
    ds = json.loads(emit(estimate, "deepspeed"))
    dp = estimate.dp
    # DeepSpeed: train_batch_size = micro-batch × accumulation × data-parallel size
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * dp
    assert ds["zero_optimization"]["stage"] == plan.zero
    assert ds["bf16"]["enabled"] is True

    actor = yaml.safe_load(emit(estimate, "verl"))["actor_rollout_ref"]["actor"]
    megatron = actor["megatron"]
    assert megatron["tensor_model_parallel_size"] == plan.tp
    assert megatron["pipeline_model_parallel_size"] == plan.pp
    assert megatron["virtual_pipeline_model_parallel_size"] == (plan.vpp if plan.vpp > 1 else None)
    assert megatron["context_parallel_size"] == plan.cp
    assert megatron["expert_model_parallel_size"] == plan.ep
    assert megatron["expert_tensor_parallel_size"] == plan.etp
    assert megatron["sequence_parallel"] is plan.sp
    assert megatron["use_distributed_optimizer"] is (plan.zero >= 1)
    assert actor["ppo_micro_batch_size_per_gpu"] == plan.mbs
    override = megatron.get("override_transformer_config", {})
    assert override.get("num_layers_in_first_pipeline_stage") == (plan.first_stage_layers or None)
    assert override.get("recompute_granularity") == (None if plan.recompute is Recompute.NONE
                                                     else plan.recompute.label)

    titan = tomllib.loads(emit(estimate, "torchtitan"))
    parallel = titan["parallelism"]
    assert parallel["data_parallel_replicate_degree"] * parallel["data_parallel_shard_degree"] == dp
    assert parallel["tensor_parallel_degree"] == plan.tp
    assert parallel["pipeline_parallel_degree"] == plan.pp
    assert parallel["context_parallel_degree"] == plan.cp
    if plan.pp > 1:
        # one split point between consecutive (virtual) stages
        assert len(parallel["pipeline_parallel_split_points"]) == plan.pp * plan.vpp - 1
        assert parallel["pipeline_parallel_schedule"] == ("Interleaved1F1B" if plan.vpp > 1 else "1F1B")
    assert titan["training"]["global_batch_size"] == TRAINING.global_batch_size
    assert titan["activation_checkpoint"]["mode"] == plan.recompute.label

    nemo = overrides(emit(estimate, "nemo"))
    assert nemo["trainer.strategy.tensor_model_parallel_size"] == str(plan.tp)
    assert nemo["trainer.strategy.virtual_pipeline_model_parallel_size"] == (str(plan.vpp) if plan.vpp > 1
                                                                             else "null")
    assert nemo["data.global_batch_size"] == str(TRAINING.global_batch_size)
    assert int(nemo["trainer.num_nodes"]) * int(nemo["trainer.devices"]) == 64

    bridge = overrides(emit(estimate, "bridge"))
    assert bridge["model.pipeline_model_parallel_size"] == str(plan.pp)
    assert bridge["train.micro_batch_size"] == str(plan.mbs)
    assert bridge["ddp.use_distributed_optimizer"] == ("true" if plan.zero >= 1 else "false")
    if plan.zero >= 2:
        assert bridge["ddp.data_parallel_sharding_strategy"] == {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]


def test_torchtitan_split_points_follow_the_uneven_split():
    plan = Plan(tp=2, pp=4, first_stage_layers=6, last_stage_layers=6, sp=True)
    titan = tomllib.loads(emit(estimate_of(plan, dense_model()), "torchtitan"))
    # stages hold 6, 10, 10, 6 layers: the later stages start at layers 6, 16, 26
    assert titan["parallelism"]["pipeline_parallel_split_points"] == ["layers.6", "layers.16", "layers.26"]
    # without PP torchtitan accumulates gradients: local batch = micro-batch
    titan = tomllib.loads(emit(estimate_of(Plan(tp=8, sp=True, mbs=2), dense_model()), "torchtitan"))
    assert titan["training"]["local_batch_size"] == 2
    assert titan["parallelism"]["data_parallel_replicate_degree"] == 8  # zero 0: DDP over the 64 / 8 ranks


def test_what_a_framework_cannot_express_is_listed_and_commented():
    plan = Plan(tp=4, pp=2, vpp=2, cp=2, ep=4, etp=2, sp=False, recompute=Recompute.FULL, recompute_layers=2,
                zero=2)
    estimate = estimate_of(plan, training=TrainingSpec(seq_len=8192, global_batch_size=512,
                                                       precision=Precision.FP8))
    deepspeed = launch_config(estimate, "deepspeed")
    joined = " ".join(deepspeed.unexpressed)
    for knob in ("pp=2", "cp=2", "ep=4", "recompute=full", "fp8", "zero=2 with pp > 1"):
        assert knob in joined, knob
    titan = launch_config(estimate, "torchtitan")
    assert any("recompute_layers=2" in note for note in titan.unexpressed)
    assert any("sp=false" in note for note in titan.unexpressed)
    assert any("etp=2" in note for note in titan.unexpressed)
    for note in titan.unexpressed:  # TOML comments carry the same notes
        assert f"# not expressible: {note}" in titan.text
    verl = launch_config(estimate, "verl")
    assert any("zero=2" in note for note in verl.unexpressed)
    assert "# not expressible: zero=2" in verl.text
    nemo = launch_config(estimate, "nemo")
    assert any("zero=2" in note for note in nemo.unexpressed)
    # Megatron-LM expresses all of it
    assert "--fp8-format hybrid" in emit(estimate, "megatron")
    assert "--data-parallel-sharding-strategy optim_grads" in emit(estimate, "megatron")


def test_a_model_name_cannot_break_out_of_a_comment():
    model = moe_model("evil\nrm -rf / #\n--tensor-model-parallel-size 64")
    estimate = estimate_of(Plan(tp=2, ep=8, etp=1, sp=True), model)
    for framework in FRAMEWORKS:
        text = emit(estimate, framework)
        for line in text.splitlines():
            assert not line.startswith("rm -rf"), framework
            assert not line.startswith("--tensor-model-parallel-size 64"), framework


def test_framework_names():
    assert framework_name("Megatron-LM") == "megatron"
    assert framework_name("nemo2") == "nemo"
    assert framework_name("megatron-bridge") == "bridge"
    with pytest.raises(InputError, match="unknown framework 'jax'"):
        framework_name("jax")


def test_dense_models_get_no_expert_settings():
    estimate = estimate_of(Plan(tp=8, pp=2, sp=True, zero=1), dense_model())
    for framework in ("megatron", "nemo", "bridge", "verl"):
        assert "expert" not in emit(estimate, framework), framework


# ---- overlap: the launch flags switch on what the user set for the step time, where it applies --------------------

OVERLAPPED = dataclasses.replace(TRAINING, overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True,
                                 moe_a2a_overlap=True)

@pytest.mark.parametrize("plan, num_gpus, grad_reduce, param_gather", [
    # 64 GPUs / (tp 8 · pp 1) = dp 8 > 1, distributed optimizer: both overlaps
    (Plan(tp=8, sp=True, zero=1), 64, True, True),
    # dp 8 without the distributed optimizer: grad reduce only (Megatron asserts param gather needs it)
    (Plan(tp=8, sp=True, zero=0), 64, True, False),
    # 8 GPUs / (tp 8) = dp 1, cp 1: no data-parallel traffic, no flags
    (Plan(tp=8, sp=True, zero=1), 8, False, False),
    # 16 GPUs / (tp 8 · cp 2) = dp 1, but gradients still reduce over dp·cp = 2
    (Plan(tp=8, cp=2, sp=True, zero=1), 16, True, True),
])
def test_dp_overlap_flags_follow_the_time_model(plan, num_gpus, grad_reduce, param_gather):
    estimate = estimate_of(plan, model=dense_model(), num_gpus=num_gpus, training=OVERLAPPED)
    megatron = emit(estimate, "megatron")
    assert ("--overlap-grad-reduce" in megatron) is grad_reduce
    assert ("--overlap-param-gather" in megatron) is param_gather
    nemo = overrides(emit(estimate, "nemo"))
    assert nemo["trainer.strategy.ddp.overlap_grad_reduce"] == str(grad_reduce).lower()
    assert nemo["trainer.strategy.ddp.overlap_param_gather"] == str(param_gather).lower()
    bridge = overrides(emit(estimate, "bridge"))
    assert (bridge["ddp.overlap_grad_reduce"], bridge["ddp.overlap_param_gather"]) == \
        (str(grad_reduce).lower(), str(param_gather).lower())
    verl = yaml.safe_load(emit(estimate, "verl"))["actor_rollout_ref"]["actor"]["megatron"]["override_ddp_config"]
    assert verl == {"overlap_grad_reduce": grad_reduce, "overlap_param_gather": param_gather}


def test_expert_gradients_alone_need_the_overlap():
    # MoE, 8 GPUs, tp 8: dense dp·cp = 1, but experts with ep 1, etp 1 reduce over edp = 8 / (1·1·1) = 8
    estimate = estimate_of(Plan(tp=8, sp=True, ep=1, etp=1, zero=1), num_gpus=8, training=OVERLAPPED)
    assert "--overlap-grad-reduce" in emit(estimate, "megatron")


def test_overlaps_are_off_unless_set():
    """Megatron-Core's defaults: no overlap flag is written when the user did not ask for one."""
    megatron = emit(estimate_of(Plan(tp=8, sp=True, ep=8, zero=1), num_gpus=64), "megatron")
    for flag in ("--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
                 "--overlap-moe-expert-parallel-comm"):
        assert flag not in megatron


def test_model_parallel_overlaps_written_where_they_apply():
    megatron = emit(estimate_of(Plan(tp=8, sp=True, ep=8, zero=1), num_gpus=64, training=OVERLAPPED), "megatron")
    assert "--tp-comm-overlap" in megatron and "--overlap-moe-expert-parallel-comm" in megatron
    # no SP: Megatron refuses TP overlap; ep 1: nothing to overlap
    plain = emit(estimate_of(Plan(tp=8, sp=False, ep=1, zero=1), num_gpus=64, training=OVERLAPPED), "megatron")
    assert "--tp-comm-overlap" not in plain and "--overlap-moe-expert-parallel-comm" not in plain
