"""torchtitan Python config (torchtitan 0.3.0) for one plan.

torchtitan reads Python configs: `torchrun ... -m torchtitan.train --module autopar_plan --config autopar_plan`
imports `autopar_plan` (torchtitan/config/manager.py ConfigManager._load_config: `--module` may be any importable
module, `--config` names a function in it returning a `Trainer.Config`). The TOML job files and
`pipeline_parallel_split_points` are gone; pipeline stages are per-stage module lists,
`ParallelismConfig.module_fqns_per_model_part` (torchtitan/distributed/pipeline_parallel.py pipeline_llm; module
names `tok_embeddings`, `layers.N`, `norm`, `lm_head` as in its _generate_llm_fqn_per_model_part).

Field names from torchtitan/config/configs.py `ParallelismConfig` (data_parallel_replicate_degree,
data_parallel_shard_degree, fsdp_reshard_after_forward, tensor_parallel_degree, enable_sequence_parallel,
pipeline_parallel_degree, module_fqns_per_model_part, pipeline_parallel_schedule,
pipeline_parallel_microbatch_size, context_parallel_degree, expert_parallel_degree) and `TrainingConfig`
(local_batch_size, global_batch_size, seq_len), activation checkpointing from
torchtitan/distributed/activation_checkpoint.py (FullAC, SelectiveAC -- per-op SAC, what recompute selective prices
under engine torchtitan; `Trainer.Config.activation_checkpoint`).

zero maps onto torchtitan's two DP axes: zero 0 = replicate (DDP), zero 3 = FSDP with fsdp_reshard_after_forward =
"always", zero 2 = FSDP with parameters kept gathered between forward and backward ("never"); the policy is always
written, since torchtitan's "default" is "never" under pipeline parallelism. Zero 1, Megatron's module-level
selective recompute and partial recompute are written as torchtitan's nearest settings and priced again
(export.capabilities.PLAN_ADJUSTMENTS); plans with expert TP other than its own are refused, and so are estimates
with fp8 parameters (TrainingSpec.fp8_param_gather): torchao's fp8 linears keep bf16 weights. Every config sets
`training.disable_cuda_graphs`: the step priced is eager or compiled, not 0.3.0's whole-step CUDA graph, and with the
graph off torchtitan frees its gradients between steps, as the memory model prices.
"""

from __future__ import annotations

from autopar.export.capabilities import TARGET_VERSIONS, require_runnable
from autopar.export.common import (LaunchConfig, chunk_layers_in_model_order, expert_gemm_note, fp8_weight_copies_note,
                                   one_line, plan_caption)
from costmodels.engines import engine_loss
from costmodels.scoring import Estimate
from costmodels.plan import Recompute
from costmodels.specs import Engine, ExpertGemm, LaunchPath, ModelSpec, Precision

CROSS_ENTROPY_RUN = {False: "PyTorch's eager cross entropy on upcast logits",
                     True: "the loss compiled with the model (CompileConfig.components: model, loss)"}
"""What torchtitan 0.3.0 runs for the loss (components/loss.py cross_entropy_loss: F.cross_entropy on
`pred.float()`), eager or compiled (CompileConfig.components defaults to ['model', 'loss']); the kernels priced for
each are costmodels.engines.engine_loss's."""

SOURCES = ("pytorch/torchtitan torchtitan/config/configs.py", "pytorch/torchtitan torchtitan/config/manager.py",
           "pytorch/torchtitan torchtitan/distributed/pipeline_parallel.py")

TORCHTITAN_FP8_LINE = {
    "mxfp8": "# fp8: add MXFP8LinearConverter.Config() to the model_spec converters (torchao MXFP8, SM100)",
    **{recipe: f"# not expressible: fp8 recipe {recipe}: torchtitan 0.3.0's Float8LinearConverter runs torchao's "
                f"rowwise scaling (recipe_name rowwise), which this estimate did not price; estimate with "
                f"--fp8-recipe mxfp8 on Blackwell, or add Float8LinearConverter.Config() knowing the casts differ"
       for recipe in ("delayed", "tensorwise", "blockwise")},
}
"""The line a torchtitan 0.3.0 config gets for each fp8 recipe (torchtitan/components/quantization: float8.py
Float8LinearConverter, recipe_name 'rowwise' | 'rowwise_with_gw_hp'; mx.py MXFP8LinearConverter, SM100 and later)."""


REGISTRY_CONFIGS = (  # (words in the model name, torchtitan 0.3.0 model package, config function, flavor, bf16 base)
    (("deepseek", "v3"), "torchtitan.models.deepseek_v3", "deepseek_v3_671b", "671B", None),
    (("llama", "405b"), "torchtitan.models.llama3", "llama3_405b", "405B", "llama3_70b"),
    (("llama", "70b"), "torchtitan.models.llama3", "llama3_70b", "70B", None),
    (("llama", "8b"), "torchtitan.models.llama3", "llama3_8b", "8B", None),
    (("qwen3", "14b"), "torchtitan.models.qwen3", "qwen3_14b", "14B", None),
)
"""The torchtitan model config a plan starts from, by model name (none matched: torchtitan's defaults). A config that
converts the model's linears to float8 (llama3_405b: Float8LinearConverter, which needs torchao and an SM89+ GPU
even to build the config) is not a bf16 plan's: a bf16 plan starts from the named bf16 config of the same family and
swaps in the model (`model_registry(flavor)`), so precision is the plan's, not the recipe's."""


FSDP_RESHARD_AFTER_FORWARD = {0: "never", 2: "never", 3: "always"}
"""ParallelismConfig.fsdp_reshard_after_forward per ZeRO stage: ZeRO-3 frees the gathered parameters after each
forward ('always'), ZeRO-2 keeps them to the backward ('never'); ZeRO-0 has FSDP degree 1 (nothing is sharded), where
'never' saves fully_shard's no-op reshards."""


def registry_config(model: ModelSpec) -> tuple[str, str, str, bool] | None:
    """(model package, config function, flavor, bf16 base config or None) of the matching torchtitan config."""
    name = model.name.lower().replace("-", " ").replace("_", " ").replace(".", " ")
    words = set(name.split())
    for keys, package, function, flavor, fp8 in REGISTRY_CONFIGS:
        if all(any(key in word for word in words) for key in keys):
            return package, function, flavor, fp8
    return None


def module_fqns_per_model_part(num_layers: int, estimate: Estimate) -> list[list[str]]:
    """The modules of every (virtual) stage in model order: the embedding with the first, norm and head with the last
    (stage i runs on rank i % pp in torchtitan's looped schedules, as in Megatron-Core's interleaving)."""
    parts, start = [], 0
    chunks = chunk_layers_in_model_order(num_layers, estimate.plan)
    for index, count in enumerate(chunks):
        part = ["tok_embeddings"] if index == 0 else []
        part += [f"layers.{layer}" for layer in range(start, start + count)]
        if index == len(chunks) - 1:
            part += ["norm", "lm_head"]
        parts.append(part)
        start += count
    return parts


def launch_config(estimate: Estimate) -> LaunchConfig:
    require_runnable(estimate, "torchtitan")
    plan, training, model = estimate.plan, estimate.training, estimate.model
    dp = estimate.dp
    sharded = plan.zero >= 2
    parallelism: list[tuple[str, object]] = [
        ("data_parallel_replicate_degree", 1 if sharded else dp),
        ("data_parallel_shard_degree", dp if sharded else 1)]
    # always written: 'default' (torchtitan's) is False with pp > 1 (torchtitan/distributed/fsdp.py
    # get_fsdp_reshard_after_forward_policy), which keeps ZeRO-3's parameters gathered -- ZeRO-2
    parallelism.append(("fsdp_reshard_after_forward", FSDP_RESHARD_AFTER_FORWARD[plan.zero]))
    parallelism += [("tensor_parallel_degree", plan.tp), ("enable_sequence_parallel", plan.sp or plan.tp == 1),
                    ("context_parallel_degree", plan.cp), ("pipeline_parallel_degree", plan.pp)]
    if plan.pp > 1:
        parallelism += [("pipeline_parallel_schedule", "Interleaved1F1B" if plan.vpp > 1 else "1F1B"),
                        ("pipeline_parallel_microbatch_size", plan.mbs),
                        ("module_fqns_per_model_part", module_fqns_per_model_part(model.num_layers, estimate))]
    if model.is_moe:
        parallelism.append(("expert_parallel_degree", plan.ep))
    # With PP the whole per-rank batch is one schedule of microbatches; without it torchtitan accumulates
    # gradients global_batch_size / (local_batch_size * dp) times.
    local_batch = training.global_batch_size // dp if plan.pp > 1 and dp else plan.mbs
    base = registry_config(model)
    lines = [f"# {TARGET_VERSIONS['torchtitan']}: {plan_caption(estimate)}",
             "# save as autopar_plan.py on PYTHONPATH; run: torchrun ... -m torchtitan.train --module autopar_plan "
             "--config autopar_plan",
             f"# key names: {'; '.join(SOURCES)}"]
    if training.precision is Precision.FP8:
        lines.append(TORCHTITAN_FP8_LINE[training.fp8_recipe.value])
    lines += ["from torchtitan.config import CompileConfig, ParallelismConfig"]
    if plan.recompute is not Recompute.NONE:
        ac_class = "FullAC" if plan.recompute is Recompute.FULL else "SelectiveAC"
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {ac_class}")
    if base is None:
        lines += [f"# torchtitan has no registry config for {one_line(model.name)}: start from its defaults and set",
                  "# model_spec to your model", "from torchtitan.trainer import Trainer", "",
                  "base_config = Trainer.Config"]
    elif base[3] is not None and training.precision is not Precision.FP8:
        lines += [f"# torchtitan's {base[1]} converts linears to float8; this plan is bf16: the bf16 {base[3]} "
                  f"config with the {base[2]} model",
                  f"from {base[0]}.config_registry import {base[3]} as base_config",
                  f"from {base[0]} import model_registry"]
    else:
        lines += [f"from {base[0]}.config_registry import {base[1]} as base_config  # torchtitan's config for "
                  f"{one_line(model.name)}"]
    lines += ["", "", "def autopar_plan():", "    config = base_config()"]
    if base is not None and base[3] is not None and training.precision is not Precision.FP8:
        lines.append(f'    config.model_spec = model_registry("{base[2]}")')
    lines += ["    config.parallelism = ParallelismConfig("]
    lines += [f"        {name}={value!r}," for name, value in parallelism]
    lines += ["    )",
              f"    config.training.local_batch_size = {local_batch}",
              f"    config.training.global_batch_size = {training.global_batch_size}",
              f"    config.training.seq_len = {training.seq_len}",
              '    config.training.mixed_precision_param = "bfloat16"']
    # always off: autopar prices torchtitan's eager or compiled launches, not 0.3.0's whole-step CUDA graph (on by
    # default where torchtitan allows it: no pipeline, no host-synchronising EP dispatcher); with it off
    # Trainer.train_step frees the gradients between steps (zero_grad(set_to_none=disable_cuda_graphs)), as the
    # memory model prices (costmodels.memory.frees_gradients_between_steps)
    lines.append("    config.training.disable_cuda_graphs = True")
    if plan.recompute is Recompute.FULL:
        lines.append("    config.activation_checkpoint = FullAC.Config()")
    elif plan.recompute is Recompute.SELECTIVE:   # per-op SAC, as priced (costmodels.engines.per_op_sac)
        lines.append("    config.activation_checkpoint = SelectiveAC.Config()")
    else:
        lines.append("    config.activation_checkpoint = None  # no activation checkpointing")
    # always written: some registry configs compile (DeepSeek-V3's), and an eager estimate must run eager; the default
    # components compile the model's blocks and the loss
    compiled = training.launch is LaunchPath.COMPILE
    lines.append(f"    config.compile = CompileConfig(enable={compiled})")
    lines.append("    return config")
    loss = estimate.training.cross_entropy
    runs = engine_loss(Engine.TORCHTITAN, compiled)
    notes = () if loss is runs else (
        f"cross_entropy {loss.value}: torchtitan runs {CROSS_ENTROPY_RUN[compiled]} ({runs.value}), which the "
        "estimate did not price",)
    notes += tuple(expert_gemm_note(estimate, ExpertGemm.GROUPED, "torchtitan's GroupedExperts runs one "
                                    "torch._grouped_mm kernel over the local experts (MoEArgs.use_grouped_mm)"))
    notes += tuple(fp8_weight_copies_note(estimate, "torchao's float8 and MXFP8 linears do not keep (they save the "
                                                    "bf16 weight and quantize it again in the backward)"))
    if plan.recompute is Recompute.SELECTIVE and model.is_moe and plan.ep > 1 \
            and not estimate.training.sac_saves_all_to_all:
        notes += ("sac_saves_all_to_all off: torchtitan 0.3.0's SelectiveAC keeps the MoE all-to-all outputs "
                  "(_get_default_save_ops), more memory and fewer all-to-alls than the estimate priced",)
    capacity = estimate.training.moe_capacity_factor
    if estimate.model.is_moe and capacity is not None:
        notes += (f"moe_capacity_factor {capacity:g}: torchtitan's MoE has no expert capacity (its standard "
                  "all-to-all dispatcher drops no token; HybridEP's non_blocking_capacity_factor caps a buffer per "
                  "rank, not an expert), so the busiest expert can take more than the cap the estimate priced",)
    lines[1:1] = [f"# note: {note}" for note in notes]      # after the caption, which names the target
    text = "\n".join(lines) + "\n"
    return LaunchConfig(framework="torchtitan", text=text, unexpressed=notes, sources=SOURCES,
                        target=TARGET_VERSIONS["torchtitan"])
