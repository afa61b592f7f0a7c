"""Launch configs for every framework: the framework's own syntax parses, the values are the plan's, and what the
framework cannot express is said (as comments where the syntax has them)."""

from __future__ import annotations

import ast
import dataclasses
import json

import pytest

from autopar.export import FRAMEWORKS, emit, framework_name, launch_config
from autopar.export.capabilities import TARGET_VERSIONS, Unsupported, refusals
from costmodels.rules import Problem as Context
from autopar.export.common import NEMO_FP8_PRESETS, chunk_layers_in_model_order, mcore_parallel_fields, stage_layers
from costmodels.errors import InputError
from costmodels.plan import Plan, Recompute
from costmodels.scoring import estimate as score
from costmodels.specs import Engine, Precision, TrainingSpec
from test_report_support import DENSE_PLANS, MOE_PLANS, cluster, dense_model, moe_model, synthetic_estimate

TRAINING = TrainingSpec(seq_len=4096, global_batch_size=512)
BF16_GRADS = TrainingSpec(seq_len=4096, global_batch_size=512, grad_reduce_in_fp32=False)
"""What Megatron-FSDP (zero >= 2 in NeMo, Megatron-Bridge and verl) runs: its main gradients in the parameters' bf16."""


def estimate_of(plan: Plan, model=None, num_gpus: int = 64, training: TrainingSpec = TRAINING):
    return synthetic_estimate(model or moe_model(), cluster(num_gpus), training, plan)


def megatron_fsdp_estimate_of(plan: Plan, model=None, num_gpus: int = 64):
    """The estimate NeMo, Megatron-Bridge and verl launch `plan` as: fp32 gradients under the distributed optimizer,
    bf16 under Megatron-FSDP (capabilities: megatron_fsdp_grads)."""
    return estimate_of(plan, model, num_gpus, TRAINING if plan.zero <= 1 else BF16_GRADS)


def titan(text: str) -> tuple[dict[str, object], dict[str, object]]:
    """(ParallelismConfig keywords, config.training.* assignments) of an emitted torchtitan Python config, read with
    `ast` (torchtitan itself is not installed in the default test environment; tests/test_conformance_torchtitan.py
    loads the file with torchtitan)."""
    tree = ast.parse(text)
    parallelism, training = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ParallelismConfig":
            parallelism = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and ast.unparse(node.targets[0]).startswith("config.training.")):
            training[node.targets[0].attr] = ast.literal_eval(node.value)
    return parallelism, training


def runnable(estimate, framework: str) -> bool:
    return not refusals(Context(estimate.model, estimate.cluster, estimate.training), estimate.plan, framework)


def overrides(text: str) -> dict[str, str]:
    """key=value lines of a Hydra override list (comments and line continuations dropped)."""
    pairs = {}
    for line in text.splitlines():
        line = line.rstrip(" \\")
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.removeprefix("++")] = value   # `++key=`: Hydra's replace-whatever-is-there
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
    nemo = overrides(emit(estimate, "nemo"))
    assert nemo["trainer.strategy.account_for_embedding_in_pipeline_split"] == "true"
    assert nemo["trainer.strategy.account_for_loss_in_pipeline_split"] == "true"
    # NeMo's strategy owns the split (it overwrites model.config.*), and the recipe's stage sizes are cleared
    assert nemo["trainer.strategy.num_layers_in_first_pipeline_stage"] == "null"
    assert not any(key.startswith("model.config.account_for") or key.startswith("model.config.num_layers_in")
                   for key in nemo)
    bridge = overrides(emit(estimate, "bridge"))
    assert bridge["model.account_for_embedding_in_pipeline_split"] == "true"
    assert bridge["model.num_layers_in_first_pipeline_stage"] == "null"
    assert bridge["model.pipeline_model_parallel_layout"] == "null"
    verl = overrides(emit(estimate, "verl"))
    key = "+actor_rollout_ref.actor.megatron.override_transformer_config.account_for_embedding_in_pipeline_split"
    assert verl[key] == "True" and "num_layers_in_first_pipeline_stage" not in emit(estimate, "verl")
    megatron = emit(estimate, "megatron")
    assert "--account-for-embedding-in-pipeline-split" in megatron and "--decoder-first" not in megatron
    parts = titan(emit(estimate, "torchtitan"))[0]["module_fqns_per_model_part"]
    assert parts[0] == ["tok_embeddings", "layers.0"] and parts[1] == ["layers.1", "layers.2"]
    assert parts[-1] == ["layers.125", "norm", "lm_head"] and len(parts) == 64
    # without interleaving the same split is an ordinary uneven one
    plain = Plan(tp=8, pp=16, sp=True, first_stage_layers=7, last_stage_layers=7)
    assert chunk_layers_in_model_order(126, plain) == [7] + [8] * 14 + [7]
    assert mcore_parallel_fields(plain, 126, moe=False)["account_for_embedding_in_pipeline_split"] is None
    assert mcore_parallel_fields(plain, 126, moe=False)["num_layers_in_first_pipeline_stage"] == 7


@pytest.mark.parametrize("plan", DENSE_PLANS + MOE_PLANS, ids=lambda p: p.short())
def test_every_framework_emits_parsable_text(plan):
    estimate = estimate_of(plan)
    dp = estimate.dp
    if runnable(estimate, "deepspeed"):
        assert launch_config(estimate, "deepspeed").text == emit(estimate, "deepspeed")
        ds = json.loads(emit(estimate, "deepspeed"))
        # DeepSpeedConfig's batch assertion, with DeepSpeed's world size: dp under a pipeline, every rank without
        world = dp if plan.pp > 1 else 64
        assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world
        assert ds["gradient_accumulation_steps"] * ds["train_micro_batch_size_per_gpu"] * dp == 512
        assert ds["zero_optimization"]["stage"] == plan.zero
    else:
        with pytest.raises(Unsupported, match="deepspeed .*cannot run plan"):
            emit(estimate, "deepspeed")

    megatron_family = megatron_fsdp_estimate_of(plan)
    verl = overrides(emit(megatron_family, "verl"))
    actor = "actor_rollout_ref.actor."
    assert verl[actor + "megatron.tensor_model_parallel_size"] == str(plan.tp)
    assert verl[actor + "megatron.pipeline_model_parallel_size"] == str(plan.pp)
    assert verl[actor + "megatron.virtual_pipeline_model_parallel_size"] == (str(plan.vpp) if plan.vpp > 1 else "null")
    assert verl[actor + "megatron.context_parallel_size"] == str(plan.cp)
    assert verl[actor + "megatron.expert_model_parallel_size"] == str(plan.ep)
    assert verl[actor + "megatron.expert_tensor_parallel_size"] == str(plan.etp)
    assert verl[actor + "megatron.use_distributed_optimizer"] == str(plan.zero >= 1)
    assert verl[actor + "megatron.use_megatron_fsdp"] == str(plan.zero >= 2)
    assert verl[actor + "ppo_micro_batch_size_per_gpu"] == str(plan.mbs)
    # verl's validate_config: train_batch_size (rollout.n = 1) divides into dp × micro-batch, and is the mini-batch
    assert verl["data.train_batch_size"] == verl[actor + "ppo_mini_batch_size"] == str(TRAINING.global_batch_size)
    assert int(verl["data.train_batch_size"]) % (dp * plan.mbs) == 0
    override = actor + "megatron.override_transformer_config."
    assert verl[override + "recompute_granularity"] == ("null" if plan.recompute is Recompute.NONE
                                                         else plan.recompute.label)
    if plan.first_stage_layers and not verl.get("+" + override + "account_for_embedding_in_pipeline_split"):
        assert verl["+" + override + "num_layers_in_first_pipeline_stage"] == str(plan.first_stage_layers)

    # torchtitan runs the plan as asked, or its nearest setting priced again (capabilities.PLAN_ADJUSTMENTS), or not
    try:
        config = launch_config(estimate, "torchtitan")
    except Unsupported as refused:
        assert not runnable(estimate, "torchtitan") and "torchtitan" in str(refused)
    else:
        priced = config.priced or estimate
        assert runnable(priced, "torchtitan") and (config.priced is None) is runnable(estimate, "torchtitan")
        ran = priced.plan
        parallel, training = titan(config.text)
        assert parallel["data_parallel_replicate_degree"] * parallel["data_parallel_shard_degree"] == dp
        assert parallel["tensor_parallel_degree"] == ran.tp == plan.tp
        assert parallel["pipeline_parallel_degree"] == ran.pp == plan.pp
        assert parallel["context_parallel_degree"] == ran.cp == plan.cp
        if ran.pp > 1:  # one module list per (virtual) stage, every layer once
            parts = parallel["module_fqns_per_model_part"]
            assert len(parts) == ran.pp * ran.vpp
            layers = [name for part in parts for name in part if name.startswith("layers.")]
            assert layers == [f"layers.{i}" for i in range(estimate.model.num_layers)]
            assert parallel["pipeline_parallel_schedule"] == ("Interleaved1F1B" if ran.vpp > 1 else "1F1B")
        assert training["global_batch_size"] == TRAINING.global_batch_size
        assert ("FullAC.Config()" in config.text) is (ran.recompute is Recompute.FULL)
        assert ("SelectiveAC.Config()" in config.text) is (ran.recompute is Recompute.SELECTIVE)

    nemo = overrides(emit(megatron_family, "nemo"))
    assert nemo["trainer.strategy.tensor_model_parallel_size"] == str(plan.tp)
    assert nemo["trainer.strategy.virtual_pipeline_model_parallel_size"] == (str(plan.vpp) if plan.vpp > 1
                                                                             else "null")
    assert nemo["data.global_batch_size"] == str(TRAINING.global_batch_size)
    assert int(nemo["trainer.num_nodes"]) * int(nemo["trainer.devices"]) == 64

    bridge = overrides(emit(megatron_family, "bridge"))
    assert bridge["model.pipeline_model_parallel_size"] == str(plan.pp)
    assert bridge["train.micro_batch_size"] == str(plan.mbs)
    assert bridge["ddp.use_distributed_optimizer"] == ("true" if plan.zero >= 1 else "false")
    if plan.zero >= 2:
        assert bridge["ddp.data_parallel_sharding_strategy"] == {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]


def test_torchtitan_module_lists_follow_the_uneven_split():
    plan = Plan(tp=2, pp=4, first_stage_layers=6, last_stage_layers=6, sp=True)
    parallel, _ = titan(emit(estimate_of(plan, dense_model()), "torchtitan"))
    # stages hold 6, 10, 10, 6 layers: the later stages start at layers 6, 16, 26
    parts = parallel["module_fqns_per_model_part"]
    assert [len([m for m in part if m.startswith("layers.")]) for part in parts] == [6, 10, 10, 6]
    assert parts[1][0] == "layers.6" and parts[2][0] == "layers.16" and parts[3][0] == "layers.26"
    assert "pipeline_parallel_split_points" not in emit(estimate_of(plan, dense_model()), "torchtitan")
    # without PP torchtitan accumulates gradients: local batch = micro-batch
    parallel, training = titan(emit(estimate_of(Plan(tp=8, sp=True, mbs=2), dense_model()), "torchtitan"))
    assert training["local_batch_size"] == 2
    assert parallel["data_parallel_replicate_degree"] == 8  # zero 0: DDP over the 64 / 8 ranks


@pytest.mark.parametrize("plan, framework, knob", [
    # DeepSpeed's pipeline engine: ZeRO-2/3 with pp > 1; native MoE with ZeRO-3; no ring CP; no interleaving
    (Plan(tp=1, pp=2, ep=8, etp=1, zero=2), "deepspeed", "zero >= 2 with pp > 1"),
    (Plan(tp=1, ep=8, etp=1, zero=3), "deepspeed", "MoE with zero=3"),
    (Plan(tp=2, cp=2, sp=True, ep=4, etp=1, zero=1), "deepspeed", "cp > 1"),
    (Plan(tp=1, pp=2, vpp=2, ep=8, etp=1, zero=1), "deepspeed", "vpp > 1"),
    (Plan(tp=2, sp=True, ep=8, etp=1, zero=1), "deepspeed", "sp=true"),
    # torchtitan: expert TP is 1 with EP and tp without (its ZeRO-1 and recompute have nearest settings: below)
    (Plan(tp=4, sp=True, ep=4, etp=2, zero=3), "torchtitan", "expert TP"),
])
def test_a_plan_the_framework_cannot_run_is_refused_with_the_knob(plan, framework, knob):
    estimate = estimate_of(plan)
    with pytest.raises(Unsupported) as refused:
        launch_config(estimate, framework)
    assert knob in str(refused.value) and f"--framework {framework}" in str(refused.value)
    assert TARGET_VERSIONS[framework] in str(refused.value)


@pytest.mark.parametrize("plan, written, text", [
    # FSDP2 has no ZeRO-1: ZeRO-2, parameters kept gathered from forward to backward
    (Plan(tp=2, sp=True, ep=8, etp=1, zero=1), Plan(tp=2, sp=True, ep=8, etp=1, zero=2),
     "fsdp_reshard_after_forward='never'"),
    # Megatron's selective recompute: torchtitan's per-op SAC, priced with its engine
    (Plan(tp=1, ep=8, etp=1, zero=3, recompute=Recompute.SELECTIVE, recompute_modules="layernorm,moe_act"),
     Plan(tp=1, ep=8, etp=1, zero=3, recompute=Recompute.SELECTIVE), "SelectiveAC.Config()"),
    # recompute of k layers per stage: full AC of every block
    (Plan(tp=2, sp=True, pp=2, ep=8, etp=1, zero=3, recompute=Recompute.FULL, recompute_layers=2),
     Plan(tp=2, sp=True, pp=2, ep=8, etp=1, zero=3, recompute=Recompute.FULL), "FullAC.Config()"),
])
def test_torchtitan_writes_its_nearest_setting_priced_and_said(plan, written, text):
    estimate = estimate_of(plan)
    config = launch_config(estimate, "torchtitan")
    assert config.priced is not None and config.priced.plan == written and text in config.text
    assert config.text.startswith("# note: written with ") and "as asked:" in config.text.splitlines()[0]
    assert (config.priced.training.engine is Engine.TORCHTITAN) is (plan.recompute is Recompute.SELECTIVE)
    assert config.priced.step_time_s != estimate.step_time_s


def test_every_config_names_the_framework_version_it_targets():
    estimate = estimate_of(Plan(tp=1, ep=8, etp=1, zero=3))
    for framework in ("megatron", "nemo", "bridge", "verl", "torchtitan"):
        config = launch_config(estimate if framework in ("megatron", "torchtitan")
                               else megatron_fsdp_estimate_of(estimate.plan), framework)
        assert config.target == TARGET_VERSIONS[framework] and config.target in config.text.splitlines()[0]
    deepspeed = launch_config(estimate_of(Plan(tp=1, ep=8, etp=1, zero=2)), "deepspeed")
    assert TARGET_VERSIONS["deepspeed"] in deepspeed.unexpressed[0]  # JSON has no comments: stderr notes


def test_megatron_sets_cuda_device_max_connections_as_megatron_asserts():
    # TP or CP without Megatron-FSDP: =1 (arguments.py validate_args); Megatron-FSDP: unset; neither: untouched
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun" in emit(estimate_of(Plan(tp=2, sp=True, ep=8, etp=1, zero=1)),
                                                             "megatron")
    assert "env -u CUDA_DEVICE_MAX_CONNECTIONS torchrun" in emit(estimate_of(Plan(tp=2, sp=True, ep=8, etp=1,
                                                                                   zero=3)), "megatron")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in emit(estimate_of(Plan(tp=1, ep=8, etp=1, zero=1)), "megatron")


def test_nemo_and_verl_express_megatron_fsdp():
    estimate = megatron_fsdp_estimate_of(Plan(tp=2, sp=True, ep=8, etp=1, zero=2))
    nemo = overrides(emit(estimate, "nemo"))
    assert nemo["trainer.strategy.fsdp"] == "megatron"
    assert nemo["trainer.strategy.ddp.data_parallel_sharding_strategy"] == "optim_grads"
    verl = overrides(emit(estimate, "verl"))
    assert verl["actor_rollout_ref.actor.megatron.use_megatron_fsdp"] == "True"
    # override_ddp_config is empty in verl's defaults: Hydra needs '+' to add a key there
    assert verl["+actor_rollout_ref.actor.megatron.override_ddp_config.data_parallel_sharding_strategy"] == \
        "optim_grads"


def test_a_model_name_cannot_break_out_of_a_comment():
    model = moe_model("evil\nrm -rf / #\n--tensor-model-parallel-size 64")
    estimate = estimate_of(Plan(tp=2, ep=8, etp=1, sp=True), model)
    for framework in FRAMEWORKS:
        if not runnable(estimate, framework):
            continue
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
    verl = overrides(emit(estimate, "verl"))
    ddp = "+actor_rollout_ref.actor.megatron.override_ddp_config."
    assert (verl[ddp + "overlap_grad_reduce"], verl[ddp + "overlap_param_gather"]) == (str(grad_reduce),
                                                                                      str(param_gather))


def test_expert_gradients_alone_need_the_overlap():
    # MoE, 8 GPUs, tp 8: dense dp·cp = 1, but experts with ep 1, etp 1 reduce over edp = 8 / (1·1·1) = 8
    estimate = estimate_of(Plan(tp=8, sp=True, ep=1, etp=1, zero=1), num_gpus=8, training=OVERLAPPED)
    assert "--overlap-grad-reduce" in emit(estimate, "megatron")


def test_torchtitan_bf16_plan_does_not_start_from_a_float8_config():
    # torchtitan 0.3.0's llama3_405b converts linears to float8 (torchao, SM89+); a bf16 plan starts from the bf16
    # llama3 config with the 405B model instead, so the precision run is the plan's
    model = dataclasses.replace(dense_model(), name="llama-3.1-405b")
    text = emit(estimate_of(Plan(tp=8, sp=True, zero=3), model), "torchtitan")
    assert "import llama3_70b as base_config" in text and 'model_registry("405B")' in text
    assert "llama3_405b as base_config" not in text
    fp8 = estimate_of(Plan(tp=8, sp=True, zero=3), model, training=TrainingSpec(seq_len=4096, global_batch_size=512,
                                                                              precision=Precision.FP8))
    assert "llama3_405b as base_config" in emit(fp8, "torchtitan")


@pytest.mark.parametrize("plan", [Plan(tp=8, sp=True, zero=3), Plan(tp=4, pp=2, sp=True, zero=3)])
def test_torchtitan_runs_the_launch_path_priced_without_its_step_cuda_graph(plan):
    """torchtitan 0.3.0 captures the whole forward-backward in a CUDA graph unless told not to, and then keeps its
    gradients between steps (zero_grad(set_to_none=disable_cuda_graphs)); autopar prices eager or compiled launches
    and gradients freed between steps, so every config turns the graph off, with or without a pipeline."""
    text = emit(estimate_of(plan, num_gpus=16), "torchtitan")
    assert "    config.training.disable_cuda_graphs = True\n" in text


def test_overlaps_are_off_unless_set():
    """Megatron-Core's defaults: no overlap flag is written when the user did not ask for one."""
    megatron = emit(estimate_of(Plan(tp=8, sp=True, ep=8, zero=1), num_gpus=64), "megatron")
    for flag in ("--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
                 "--overlap-moe-expert-parallel-comm"):
        assert flag not in megatron


@pytest.mark.parametrize("overlap", [True, False])
def test_interleaved_p2p_overlap_is_written_as_the_step_time_priced_it(overlap):
    """On by default in Megatron-LM (only --no-overlap-p2p-communication is written); off by default in
    ModelParallelConfig, so NeMo, Bridge and verl get both fields (Megatron-Core refuses overlap with
    batch_p2p_comm)."""
    training = dataclasses.replace(TRAINING, overlap_p2p_comm=overlap)
    estimate = estimate_of(Plan(tp=2, pp=4, vpp=2, sp=True, zero=1), model=dense_model(), training=training)
    assert ("--no-overlap-p2p-communication" in emit(estimate, "megatron")) is not overlap
    expected = (str(overlap).lower(), str(not overlap).lower())
    nemo = overrides(emit(estimate, "nemo"))
    assert (nemo["model.config.overlap_p2p_comm"], nemo["model.config.batch_p2p_comm"]) == expected
    bridge = overrides(emit(estimate, "bridge"))
    assert (bridge["model.overlap_p2p_comm"], bridge["model.batch_p2p_comm"]) == expected
    verl = overrides(emit(estimate, "verl"))
    key = "+actor_rollout_ref.actor.megatron.override_transformer_config."
    assert (verl[key + "overlap_p2p_comm"], verl[key + "batch_p2p_comm"]) == (str(overlap), str(not overlap))
    # without interleaving Megatron-LM turns the overlap off itself: nothing is written (Bridge's CommOverlapConfig
    # node states the non-interleaved schedule's batched P2P, as its setup would set it)
    flat = estimate_of(Plan(tp=2, pp=4, sp=True, zero=1), model=dense_model(), training=training)
    for framework in ("megatron", "nemo", "verl"):
        assert "overlap-p2p" not in emit(flat, framework) and "overlap_p2p" not in emit(flat, framework), framework
    assert "overlap_p2p_comm:false,batch_p2p_comm:true" in overrides(emit(flat, "bridge"))["comm_overlap"]


def test_model_parallel_overlaps_written_where_they_apply():
    megatron = emit(estimate_of(Plan(tp=8, sp=True, ep=8, zero=1), num_gpus=64, training=OVERLAPPED), "megatron")
    assert "--tp-comm-overlap" in megatron and "--overlap-moe-expert-parallel-comm" in megatron
    # no SP: Megatron refuses TP overlap; ep 1: nothing to overlap
    plain = emit(estimate_of(Plan(tp=8, sp=False, ep=1, zero=1), num_gpus=64, training=OVERLAPPED), "megatron")
    assert "--tp-comm-overlap" not in plain and "--overlap-moe-expert-parallel-comm" not in plain


def test_the_gradient_reduce_dtype_is_written_as_the_memory_and_reduce_were_priced():
    """The distributed optimizer (zero <= 1): Megatron-LM's --grad-reduce-in-bf16; NeMo's plugin field, which is
    applied over the strategy's ddp at setup, beside the ddp field; verl's override_ddp_config (an explicit value
    wins over verl's own). Megatron-FSDP (zero >= 2) reads neither: Megatron-LM gets its
    --megatron-fsdp-main-grads-dtype, and NeMo, Bridge and verl, which cannot set that torch.dtype field, run only
    its bf16 default. DeepSpeed's communication_data_type is written either way (its own bf16 default). Megatron-
    Bridge gets the dtype inside its mixed_precision node (a named preset re-applies fp32) and Megatron-FSDP's fp32
    main gradients as a torch.float32 node; NeMo 2.7.3 (megatron-core 0.16) reads grad_reduce_in_fp32 under
    Megatron-FSDP too. verl cannot set fp32 under Megatron-FSDP and torchtitan reduces in float32 only: each is
    written with the dtype it runs, priced again, and said in a note (export.capabilities.ADJUSTMENTS)."""
    for training, on in ((TRAINING, True), (BF16_GRADS, False)):
        estimate = estimate_of(Plan(tp=2, pp=2, sp=True, zero=1), model=dense_model(), training=training)
        assert ("--grad-reduce-in-bf16" in emit(estimate, "megatron")) is not on
        nemo = overrides(emit(estimate, "nemo"))
        assert nemo["trainer.strategy.ddp.grad_reduce_in_fp32"] == nemo["trainer.plugins.grad_reduce_in_fp32"] \
            == str(on).lower()
        verl = overrides(emit(estimate, "verl"))
        assert verl["+actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32"] == str(on)
        fsdp = emit(estimate_of(Plan(tp=2, zero=3), model=dense_model(), training=training), "megatron")
        assert f"--megatron-fsdp-main-grads-dtype {'fp32' if on else 'bf16'}" in fsdp
        assert "--grad-reduce-in-bf16" not in fsdp          # Megatron-FSDP does not read it
        deepspeed = json.loads(emit(estimate_of(Plan(tp=1, zero=2), model=dense_model(), training=training),
                                    "deepspeed"))
        assert deepspeed["communication_data_type"] == ("fp32" if on else "bf16")
    assert overrides(emit(estimate_of(Plan(tp=2, zero=1), model=dense_model()), "bridge"))[
        "ddp.grad_reduce_in_fp32"] == "true"
    bridge = overrides(emit(estimate_of(Plan(tp=2, zero=1), model=dense_model(), training=BF16_GRADS), "bridge"))
    assert "grad_reduce_in_fp32:false" in bridge["mixed_precision"]
    fsdp32 = overrides(emit(estimate_of(Plan(tp=2, zero=3), model=dense_model()), "bridge"))
    assert fsdp32["ddp.megatron_fsdp_main_grads_dtype"] == '"{_target_:torch.float32,_call_:false}"'
    assert runnable(estimate_of(Plan(tp=2, zero=3), model=dense_model()), "nemo")
    for framework, asked, runs in (("torchtitan", BF16_GRADS, True), ("verl", TRAINING, False)):
        estimate = estimate_of(Plan(tp=2, zero=3), model=dense_model(), training=asked)
        config = launch_config(estimate, framework)
        assert config.priced.training.grad_reduce_in_fp32 is runs and config.unexpressed[0].startswith("written with")
        assert config.text.startswith("# note: written with")
        assert config.priced.step_time_s == score(estimate.model, estimate.cluster, config.priced.training,
                                                  estimate.plan).step_time_s


FP8_PRESET_HAS_PARAMS = {"delayed": True, "tensorwise": True, "blockwise": False, "mxfp8": True}
"""Whether NeMo's and Megatron-Bridge's preset for the recipe sets fp8_param_gather (the subchannel ones do not)."""


def fp8_estimate_of(recipe: str, params: bool, plan: Plan = Plan(tp=2, sp=True, zero=1), fp32_grads: bool = True):
    """A dense fp8 estimate (MXFP8 on B200, the other recipes on H100) with fp8 parameters or without."""
    training = TrainingSpec(seq_len=4096, global_batch_size=512, precision="fp8", fp8_recipe=recipe,
                            fp8_param_gather=params, grad_reduce_in_fp32=fp32_grads)
    return synthetic_estimate(dense_model(), cluster(64, "b200-180gb" if recipe == "mxfp8" else "h100-80gb"),
                              training, plan)


@pytest.mark.parametrize("params", [False, True])
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise", "mxfp8"])
def test_fp8_parameters_are_written_as_priced_whatever_the_preset(recipe, params):
    """TrainingSpec.fp8_param_gather, in both directions: Megatron-LM's --fp8-param-gather (with
    --reuse-grad-buf-for-mxfp8-param-ag for MXFP8 under the distributed optimizer), NeMo's plugin fields over its
    preset, Megatron-Bridge's preset where it agrees and the preset's MixedPrecisionConfig with the setting changed
    where it does not, verl's TransformerConfig / DDP / optimizer overrides; torchtitan and DeepSpeed keep bf16
    weights and refuse fp8 parameters by the input alone."""
    estimate = fp8_estimate_of(recipe, params)
    mxfp8 = recipe == "mxfp8"
    megatron = emit(estimate, "megatron")
    assert ("--fp8-param-gather \\\n" in megatron) is params
    assert ("--reuse-grad-buf-for-mxfp8-param-ag" in megatron) is (params and mxfp8)
    nemo = overrides(emit(estimate, "nemo"))
    assert nemo["trainer.plugins"].endswith("." + NEMO_FP8_PRESETS[recipe])
    assert nemo["trainer.plugins.fp8_param_gather"] == str(params).lower()
    assert nemo.get("trainer.plugins.reuse_grad_buf_for_mxfp8_param_ag") == (str(params).lower() if mxfp8 else None)
    assert "fp8_params" not in " ".join(nemo)   # NeMo raises on fp8_params beside a differing fp8_param_gather
    bridge = overrides(emit(estimate, "bridge"))["mixed_precision"]
    if FP8_PRESET_HAS_PARAMS[recipe] == params:
        assert bridge.startswith("bf16_with_") and "{" not in bridge
    else:   # the preset's fields, spelled out, with fp8_param_gather as priced
        assert bridge.startswith('"{_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,')
        assert f"fp8_recipe:{recipe}," in bridge and f"fp8_param_gather:{str(params).lower()}" in bridge
        assert ("reuse_grad_buf_for_mxfp8_param_ag:false" in bridge) is mxfp8
    verl = overrides(emit(estimate, "verl"))
    megatron_key = "+actor_rollout_ref.actor.megatron."
    assert verl[megatron_key + "override_transformer_config.fp8"] == "hybrid"
    assert verl[megatron_key + "override_transformer_config.fp8_recipe"] == recipe
    assert verl[megatron_key + "override_transformer_config.fp8_param"] == str(params)
    assert verl[megatron_key + "override_ddp_config.fp8_param_gather"] == str(params)
    assert verl["+actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe"] == recipe
    assert verl.get(megatron_key + "override_ddp_config.reuse_grad_buf_for_mxfp8_param_ag") == \
        verl.get("+actor_rollout_ref.actor.optim.override_optimizer_config.reuse_grad_buf_for_mxfp8_param_ag") == \
        (str(params) if mxfp8 else None)
    sharded = fp8_estimate_of(recipe, params, Plan(tp=1, zero=2))   # a plan both run in bf16
    for framework in ("torchtitan", "deepspeed"):
        if params:
            with pytest.raises(Unsupported, match=r"fp8 parameters \(--fp8-param-gather\).*no layout changes that"):
                emit(sharded, framework)
        else:
            assert emit(sharded, framework)


def test_mxfp8_parameters_under_megatron_fsdp_are_gathered_without_the_gradient_buffer():
    """Megatron-FSDP (zero >= 2) has no distributed-optimizer gradient buffer to gather MXFP8 parameters through
    (Megatron-LM's validate_args and Bridge turn reuse_grad_buf_for_mxfp8_param_ag off there): the fp8 parameters are
    written, the reuse flag off; Bridge's preset (whose reuse flag Bridge itself switches off under FSDP) goes in a
    node for the bf16 gradients priced."""
    estimate = fp8_estimate_of("mxfp8", True, Plan(tp=2, sp=True, zero=3), fp32_grads=False)   # Megatron-FSDP's
    megatron = emit(estimate, "megatron")
    assert "--fp8-param-gather" in megatron and "--reuse-grad-buf-for-mxfp8-param-ag" not in megatron
    assert overrides(emit(estimate, "nemo"))["trainer.plugins.reuse_grad_buf_for_mxfp8_param_ag"] == "false"
    node = overrides(emit(estimate, "bridge"))["mixed_precision"]
    assert "fp8_recipe:mxfp8,fp8_param_gather:true" in node and "grad_reduce_in_fp32:false" in node
    assert overrides(emit(estimate, "verl"))[
        "+actor_rollout_ref.actor.megatron.override_ddp_config.reuse_grad_buf_for_mxfp8_param_ag"] == "False"


def test_bf16_writes_no_fp8_parameters():
    estimate = estimate_of(Plan(tp=2, sp=True, zero=1), model=dense_model())
    assert "fp8" not in emit(estimate, "megatron")
    assert not [key for key in overrides(emit(estimate, "nemo")) if "fp8" in key]
    assert overrides(emit(estimate, "bridge"))["mixed_precision"] == "bf16_mixed"
    assert not [key for key in overrides(emit(estimate, "verl")) if "fp8" in key]
