"""NeMo 2 recipe overrides and Megatron-Bridge config overrides for one plan.

NeMo 2 (`nemo llm pretrain --factory <recipe> key=value ...`): the parallel sizes live on the Lightning
MegatronStrategy (`trainer.strategy.tensor_model_parallel_size`, ...), the batch on the data module
(`data.micro_batch_size`, `data.global_batch_size`, `data.seq_length`), Megatron-Core TransformerConfig fields on
`model.config.*`, the optimizer's on `optim.config.*`, precision as a `trainer.plugins` preset. Names as used in
NVIDIA/NeMo docs/source/features/parallelisms.rst and nemo/collections/llm/recipes (e.g. llama3_70b.py,
precision/mixed_precision.py: bf16_mixed and a preset per fp8 recipe, common.NEMO_FP8_PRESETS, named by their
dotted path: common.NEMO_PRECISION_MODULE). The preset's MegatronMixedPrecision parameters are overridden after it
(`trainer.plugins.<name>=`: grad_reduce_in_fp32, fp8_param_gather, reuse_grad_buf_for_mxfp8_param_ag; nemo/lightning/
pytorch/plugins/mixed_precision.py), and the plugin applies them over the model, optimizer and ddp configs at setup
(megatron_strategy.py update_config_with_dtype_overrides). Data-parallel overlap: the strategy's `ddp`
(Megatron-Core DistributedDataParallelConfig: `trainer.strategy.ddp.overlap_grad_reduce`, `.overlap_param_gather`),
as the recipes set it (nemo/collections/llm/recipes/*.py `ddp=run.Config(DistributedDataParallelConfig,
overlap_grad_reduce=True, overlap_param_gather=True, ...)`; docs/source/features/optimizations/
communication_overlap.rst). The interleaved schedule's P2P overlap (`model.config.overlap_p2p_comm` and its
opposite `batch_p2p_comm`; ModelParallelConfig leaves it off, NeMo's MegatronCommOverlapCallback turns it on for
vpp > 1) is written as the step time priced it.

Megatron-Bridge (`scripts/training/run_recipe.py --recipe <recipe> key=value ...`, Hydra/OmegaConf overrides on the
ConfigContainer): `model.*` for Megatron-Core fields, `train.micro_batch_size`, `train.global_batch_size`,
`dataset.seq_length`, `ddp.*`/`optimizer.*` for the distributed optimizer, `mixed_precision=<preset>`: a preset name,
or, where the estimate's fp8 parameters differ from the preset's, the preset's MixedPrecisionConfig spelled out as a
`_target_` node with fp8_param_gather changed (`bridge_mixed_precision`). Names from
NVIDIA-NeMo/Megatron-Bridge docs/megatron-lm-to-megatron-bridge.md and src/megatron/bridge/training/config.py;
Megatron-FSDP keys (dist/ddp.use_megatron_fsdp, ddp.data_parallel_sharding_strategy, checkpoint.ckpt_format) from
its docs/training/megatron-fsdp.md; precision presets from src/megatron/bridge/training/mixed_precision.py;
data-parallel overlap on the `ddp` DistributedDataParallelConfig (`ddp.overlap_grad_reduce`,
`ddp.overlap_param_gather`, as its recipes set them); the P2P overlap on `model.overlap_p2p_comm` /
`model.batch_p2p_comm` (Bridge's CommOverlapConfig sets them the same way for vpp > 1).
"""

from __future__ import annotations

from autopar.export.capabilities import TARGET_VERSIONS, require_runnable
from autopar.export.common import (BRIDGE_FP8_PRESETS, MEGATRON_EXPERT_GEMM, NEMO_FP8_PRESETS, NEMO_PRECISION_MODULE,
                                   LaunchConfig, data_parallel_overlap, expert_gemm_note, fp8_param_fields,
                                   fp8_preset_notes, gradient_reduce_dtype, hf_model_source, loss_fusion,
                                   loss_kernel_note, mcore_cuda_graph_fields, mcore_moe_fields, mcore_offload_fields,
                                   mcore_parallel_fields, mcore_router_fields, model_parallel_overlap, one_line,
                                   pipeline_p2p_overlap, plan_caption, preset_name, shell_word)
from autopar.export.megatron import ZERO_SHARDING_STRATEGY
from costmodels.scoring import Estimate
from costmodels.specs import MlpKind, NormKind, PositionEmbedding, Precision

NEMO_SOURCES = ("NVIDIA/NeMo docs/source/features/parallelisms.rst",
                "NVIDIA/NeMo nemo/collections/llm/recipes/precision/mixed_precision.py",
                "NVIDIA/NeMo nemo/lightning/pytorch/plugins/mixed_precision.py")
BRIDGE_SOURCES = ("NVIDIA-NeMo/Megatron-Bridge docs/megatron-lm-to-megatron-bridge.md",
                  "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py",
                  "NVIDIA-NeMo/Megatron-Bridge docs/training/megatron-fsdp.md",
                  "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/mixed_precision.py")

BRIDGE_MIXED_PRECISION_CONFIG = "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"
BRIDGE_PRESET_FIELDS: dict[str, dict[str, object]] = {
    "bf16_mixed": {"bf16": True, "params_dtype": "torch.bfloat16", "pipeline_dtype": "torch.bfloat16",
                   "autocast_enabled": False, "grad_reduce_in_fp32": True},
    "bf16_with_fp8_delayed_scaling_mixed": {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_margin": 0,
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                            "fp8_param_gather": True},
    "bf16_with_fp8_current_scaling_mixed": {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
                                            "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1,
                                            "fp8_param_gather": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False},
    "bf16_with_mxfp8_mixed": {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
                              "reuse_grad_buf_for_mxfp8_param_ag": True},
}
"""The MixedPrecisionConfig fields each Megatron-Bridge preset sets (src/megatron/bridge/training/mixed_precision.py,
0.6.2: every bf16 fp8 preset starts from bf16_mixed's); a torch dtype is written by its name. The conformance check
instantiates the real presets and compares (autopar/export/conformance.py _bridge_precision)."""

NEMO_RECIPES = {
    "llama-3.1-8b": "llama31_8b", "llama-3.1-70b": "llama31_70b", "llama-3.1-405b": "llama31_405b",
    "mixtral-8x7b": "mixtral_8x7b", "mixtral-8x22b": "mixtral_8x22b", "deepseek-v3": "deepseek_v3",
    "qwen3-8b": "qwen3_8b", "qwen3-30b-a3b": "qwen3_30b_a3b", "qwen3-235b-a22b": "qwen3_235b_a22b",
    "nemotron-4-15b": "nemotron4_15b", "nemotron-4-340b": "nemotron4_340b", "deepseek-v2-lite": "deepseek_v2_lite",
    "llama-2-7b": "llama2_7b", "mistral-7b": "mistral_7b", "qwen2.5-7b": "qwen25_7b",
    "llama-4-scout-17b-16e": "llama4_e16", "llama-4-maverick-17b-128e": "llama4_e128"}
"""NeMo 2.7.3's pretraining recipe (`nemo llm pretrain --factory NAME`, nemo/collections/llm/recipes/NAME.py) for each
bundled model that has one."""
NEMO_MODEL_FACTORIES = {"gpt-oss-20b": "gpt_oss_20b", "gpt-oss-120b": "gpt_oss_120b"}
NEMO_UNBUILDABLE_MODELS = {
    "gpt-oss-20b": "NeMo 2.7.3's GPTOSSConfig takes megatron.core.activations.quick_gelu, which the megatron-core it "
                   "runs on here (0.16.1; 0.19 drops modules NeMo 2.7.3 imports) lacks: its TransformerConfig refuses "
                   "the config ('When bias_activation_fusion is True, activation function should be either gelu, "
                   "swiglu, or quick_geglu'); emit Megatron-LM or Megatron-Bridge (gpt_oss recipes) instead"}
NEMO_UNBUILDABLE_MODELS["gpt-oss-120b"] = NEMO_UNBUILDABLE_MODELS["gpt-oss-20b"]
"""Bundled models NeMo 2.7.3 cannot build in its environment (nemo/collections/llm/gpt/model/gpt_oss.py:
safe_import_from('megatron.core.activations', 'quick_gelu', alt=object)), refused with the reason."""
"""Bundled models NeMo 2.7.3 has a model factory for but no pretraining recipe (recipes/gpt_oss_120b.py registers
`model` and a finetune recipe only): the family recipe's trainer with `model=NAME`, NeMo's GPTOSSModel and its
GPTOSSConfig."""
NEMO_FAMILY_RECIPES = (("moe", "qwen3_30b_a3b"), ("qk_layernorm", "qwen3_8b"), ("dense", "llama3_8b"))
"""For a model without a recipe: the NeMo 2.7.3 recipe whose model config class (Qwen3Config30B_A3B, Qwen3Config8B,
Llama3Config8B: nemo/collections/llm/gpt/model/{qwen3,llama}.py) the launch starts from, by architecture; the model's
own shape is written over its fields (`nemo_model_shape`)."""

BRIDGE_RECIPES = {
    "llama-3.1-8b": "llama31_8b_pretrain_config", "llama-3.1-70b": "llama31_70b_pretrain_config",
    "llama-3.1-405b": "llama31_405b_pretrain_config", "llama-2-7b": "llama2_7b_pretrain_config",
    "deepseek-v3": "deepseek_v3_pretrain_config", "deepseek-v2-lite": "deepseek_v2_lite_pretrain_config",
    "qwen3-8b": "qwen3_8b_pretrain_config", "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config", "qwen2.5-7b": "qwen25_7b_pretrain_config",
    "gpt-oss-20b": "gpt_oss_20b_pretrain_config", "gpt-oss-120b": "gpt_oss_120b_pretrain_config"}
"""Megatron-Bridge 0.6.2's pretraining recipe (megatron.bridge.recipes, `run_recipe.py --recipe NAME`) for each bundled
model that has one; another model is built by AutoBridge from its Hugging Face config (`bridge_base`)."""


def recipe_moe_fields(estimate: Estimate) -> dict[str, object]:
    """MoE switches NeMo's and Bridge's recipes turn on that the step time does not price: the shared experts'
    overlap with the dispatch (moe_shared_expert_overlap, set by the DeepSeek-V3 recipes; Megatron-Core also refuses
    it beside recomputing 'shared_experts'), written off."""
    moe = estimate.model.moe
    return {"moe_shared_expert_overlap": False} if moe is not None and moe.num_shared_experts else {}


def nemo_factory(estimate: Estimate) -> tuple[str, str | None, bool]:
    """(the `--factory` recipe, the model factory put in its place or None, whether the model's shape is written
    over its model config): the model's own recipe; else the family recipe of NEMO_FAMILY_RECIPES with NeMo's model
    factory for the model (NEMO_MODEL_FACTORIES), or with the model's shape over the family's config class."""
    model = estimate.model
    name = preset_name(model)
    if name in NEMO_RECIPES:
        return NEMO_RECIPES[name], None, False
    kind = "moe" if model.is_moe else "qk_layernorm" if model.qk_layernorm else "dense"
    if name in NEMO_MODEL_FACTORIES:
        return dict(NEMO_FAMILY_RECIPES)[kind], NEMO_MODEL_FACTORIES[name], False
    return dict(NEMO_FAMILY_RECIPES)[kind], None, True


def nemo_model_shape(estimate: Estimate) -> dict[str, object]:
    """The model's shape in NeMo's GPTConfig / TransformerConfig field names (nemo/collections/llm/gpt/model/base.py
    GPTConfig: seq_length, rotary_base, share_embeddings_and_output_weights; TransformerConfig's own)."""
    model = estimate.model
    shape: dict[str, object] = {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads, "num_query_groups": model.num_kv_heads,
        "kv_channels": model.head_dim, "share_embeddings_and_output_weights": model.tied_embeddings}
    if model.rope is not None:   # GPTConfig.rotary_base is an int field in the Llama and Qwen3 configs
        shape["rotary_base"] = int(model.rope.theta) if float(model.rope.theta).is_integer() else model.rope.theta
    if model.moe is not None:
        shape.update(num_moe_experts=model.moe.num_experts, moe_router_topk=model.moe.top_k,
                     moe_ffn_hidden_size=model.moe.expert_ffn_hidden_size)
    return shape


def bridge_base(estimate: Estimate) -> tuple[str, str]:
    """("recipe", the Megatron-Bridge recipe function) for a bundled model with one; ("provider", the provider class)
    for another bundled model (its Hugging Face architecture may have no Bridge converter: Mixtral and Nemotron-4 in
    0.6.2), built from the model's spec (`bridge_provider_fields`); ("autobridge", the folder or Hugging Face id)
    for a user's config.json, which AutoBridge.from_hf_pretrained converts with Bridge's own model bridge."""
    name = preset_name(estimate.model)
    if name in BRIDGE_RECIPES:
        return "recipe", BRIDGE_RECIPES[name]
    if name:
        return "provider", BRIDGE_GPT_PROVIDER
    return "autobridge", hf_model_source(estimate.model)


BRIDGE_GPT_PROVIDER = "megatron.bridge.models.gpt_provider.GPTModelProvider"
BRIDGE_ACTIVATIONS = {MlpKind.GATED: "torch.nn.functional.silu", MlpKind.PLAIN: "torch.nn.functional.gelu",
                      MlpKind.SQUARED_RELU: "megatron.core.activations.squared_relu"}
"""The activation a GPTModelProvider (TransformerConfig.activation_func) gets for each MLP kind: SwiGLU's silu under
gated_linear_unit, GELU, Nemotron-4's squared ReLU."""


def bridge_provider_fields(estimate: Estimate) -> dict[str, object]:
    """The model's spec as Megatron-Bridge GPTModelProvider fields (models/gpt_provider.py, TransformerConfig's):
    shape, norm, MLP, positions, MoE and router."""
    model = estimate.model
    fields: dict[str, object] = {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads, "num_query_groups": model.num_kv_heads,
        "kv_channels": model.head_dim, "vocab_size": model.vocab_size,
        "share_embeddings_and_output_weights": model.tied_embeddings, "add_bias_linear": model.linear_bias,
        "add_qkv_bias": model.qkv_bias, "qk_layernorm": model.qk_layernorm,
        "normalization": "RMSNorm" if model.norm is NormKind.RMSNORM else "LayerNorm",
        "gated_linear_unit": model.mlp is MlpKind.GATED,
        "activation_func": {"_target_": BRIDGE_ACTIVATIONS[model.mlp], "_call_": False},
        "position_embedding_type": {PositionEmbedding.ROPE: "rope",
                                    PositionEmbedding.LEARNED: "learned_absolute"}.get(model.position_embedding,
                                                                                       "none")}
    if model.rope is not None:
        fields.update(rotary_base=float(model.rope.theta), rotary_percent=float(model.rope.rotary_fraction))
    if model.moe is not None:
        fields.update(num_moe_experts=model.moe.num_experts, moe_router_topk=model.moe.top_k,
                      moe_ffn_hidden_size=model.moe.expert_ffn_hidden_size, **mcore_router_fields(model))
    return fields


STRATEGY_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                   "virtual_pipeline_model_parallel_size", "context_parallel_size", "sequence_parallel",
                   "expert_model_parallel_size", "expert_tensor_parallel_size")
"""Fields NeMo 2's MegatronStrategy takes directly; the rest go to model.config (TransformerConfig)."""

SPLIT_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
"""The pipeline split. NeMo 2's MegatronStrategy owns them (nemo/lightning/pytorch/strategies/megatron_strategy.py
__init__ and `parallelism`, copied onto the model's TransformerConfig at setup, overwriting model.config.*), and so
does a Megatron-Bridge model provider; recipes set them (NeMo's llama31_405b: account_for_* = True; Bridge's
Llama-3.1-405B and DeepSeek-V3 recipes: account_for_* and pipeline_model_parallel_layout), so every one is written,
cleared (null / false) when the plan does not use it, or the recipe's split runs instead of the plan's."""


def split_overrides(fields: dict[str, object]) -> dict[str, object]:
    """The pipeline split fields with explicit values: the plan's, else null (stage sizes) or false (slots), and
    pipeline_model_parallel_layout null (the plan's split is given by the fields above)."""
    explicit: dict[str, object] = {name: fields[name] for name in SPLIT_FIELDS[:2]}
    explicit.update({name: bool(fields[name]) for name in SPLIT_FIELDS[2:]})
    explicit["pipeline_model_parallel_layout"] = fields.get("pipeline_model_parallel_layout")
    return explicit


def _value(value: object) -> str:
    """An override's value as one shell word that reaches the program as both of its parsers read it: Hydra's
    override grammar (Megatron-Bridge's parse_hydra_overrides) and NeMo-Run's CLI parser (`nemo llm pretrain`,
    nemo_run/cli/cli_parser.py: literal_eval for a list, surrounding quotes stripped from a string). null, true/false,
    numbers and bare words as they are; a list as a Python list literal, strings quoted, ['a','b'] (both grammars); a
    string with Hydra's special characters (a layout) in quotes, 'Et*8|(t*4|)*3,t*7L' -- each inside shell quotes,
    which the shell strips (export.common.shell_word)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return shell_word("[" + ",".join(_quoted(v) if isinstance(v, str) else repr(v) for v in value) + "]")
    text = str(value)
    if isinstance(value, str) and any(c in text for c in "|*(),= '[]{}"):
        return shell_word(_quoted(text))
    return text


def _quoted(text: str) -> str:
    """A quoted string in Hydra's and Python's common syntax."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def nemo2_config(estimate: Estimate) -> LaunchConfig:
    require_runnable(estimate, "nemo")
    if preset_name(estimate.model) in NEMO_UNBUILDABLE_MODELS:
        from autopar.export.capabilities import Unsupported

        raise Unsupported("nemo", estimate.plan, (NEMO_UNBUILDABLE_MODELS[preset_name(estimate.model)],),
                          inputs_only=True)
    if estimate.training.offload_fraction != 1.0:
        from autopar.export.capabilities import Unsupported

        raise Unsupported("nemo", estimate.plan, ("an activation offload fraction below 1: megatron-core 0.16.1, which "
                                                  "NeMo 2.7.3 imports, has no activation_offload_fraction (it offloads "
                                                  "every group of --offload-modules)",), inputs_only=True)
    plan, training, cluster = estimate.plan, estimate.training, estimate.cluster
    fields = mcore_parallel_fields(plan, estimate.model.num_layers, moe=estimate.model.is_moe,
                                   num_mtp_layers=estimate.model.num_mtp_layers)
    factory, model_factory, reshape = nemo_factory(estimate)
    overrides = [f"trainer.num_nodes={cluster.num_nodes}",
                 f"trainer.devices={min(cluster.gpus_per_node, cluster.num_gpus)}"]
    if model_factory:
        overrides.append(f"model={model_factory}")
    if reshape:
        overrides += [f"model.config.{name}={_value(value)}" for name, value in nemo_model_shape(estimate).items()]
    overrides += [f"trainer.strategy.{name}={_value(fields[name])}" for name in STRATEGY_FIELDS if name in fields]
    overrides += [f"trainer.strategy.{name}={_value(value)}" for name, value in split_overrides(fields).items()]
    overrides += [f"model.config.{name}={_value(fields[name])}"
                  for name in ("recompute_granularity", "recompute_method", "recompute_num_layers",
                               "recompute_modules")]
    overrides += [f"model.config.{name}={_value(value)}" for name, value in
                  {**mcore_moe_fields(estimate), **recipe_moe_fields(estimate)}.items()]
    overrides += [f"model.config.{name}={_value(on)}" for name, on in loss_fusion(estimate).items()]
    overrides += [f"model.config.{name}={_value(on)}" for name, on in pipeline_p2p_overlap(estimate).items()]
    overrides += [f"model.config.{name}={_value(value)}" for name, value in nemo_cuda_graph_fields(estimate).items()]
    overrides += [f"model.config.{name}={_value(value)}" for name, value in mcore_offload_fields(training).items()]
    overrides += [f"data.micro_batch_size={plan.mbs}", f"data.global_batch_size={training.global_batch_size}",
                  f"data.seq_length={training.seq_len}", f"model.config.seq_length={training.seq_len}",
                  f"optim.config.use_distributed_optimizer={_value(plan.zero >= 1)}",
                  # fp32 main parameters and Adam moments, as the memory was priced (the DeepSeek-V3 recipe turns on
                  # the precision-aware optimizer with bf16 moments)
                  "optim.config.use_precision_aware_optimizer=false"]
    overrides += [f"optim.config.{name}=torch.float32"
                  for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")]
    overrides += [f"trainer.strategy.ddp.{name}={_value(on)}" for name, on in data_parallel_overlap(estimate).items()]
    if plan.zero >= 2:   # MegatronStrategy(fsdp="megatron") with the DDP config's sharding strategy
        overrides += ["trainer.strategy.fsdp=megatron", "trainer.strategy.ddp.use_megatron_fsdp=true",
                      f"trainer.strategy.ddp.data_parallel_sharding_strategy={ZERO_SHARDING_STRATEGY[plan.zero]}",
                      "trainer.strategy.save_ckpt_format=fsdp_dtensor"]
    # every preset by its dotted path: the plugins field is a Union NeMo-Run's parser cannot match a bare factory
    # name against ("Failed to parse 'bf16_mixed' as typing.Union[...Precision, ...]")
    overrides.append("trainer.plugins=" + NEMO_PRECISION_MODULE + "." + (
        NEMO_FP8_PRESETS[training.fp8_recipe.value] if training.precision is Precision.FP8 else "bf16_mixed"))
    # the plugin's dtype config is applied over the strategy's ddp at setup (megatron_strategy.py
    # update_config_with_dtype_overrides): MegatronMixedPrecision's grad_reduce_in_fp32 decides, both are written
    overrides += [f"{section}.{name}={_value(on)}" for name, on in gradient_reduce_dtype(estimate).items()
                  for section in ("trainer.strategy.ddp", "trainer.plugins")]
    # fp8 parameters as priced, over the preset's (MegatronMixedPrecision copies fp8_param_gather to fp8_param; the
    # dtype config sets them on the model, the optimizer and the ddp config at setup)
    overrides += [f"trainer.plugins.{name}={_value(on)}" for name, on in fp8_param_fields(estimate).items()]
    remarks = [f"recipe: {factory}"]
    if model_factory:
        remarks.append(f"NeMo 2.7.3 has no pretraining recipe for {one_line(estimate.model.name)}: {factory}'s "
                       f"trainer with NeMo's {model_factory} model (model={model_factory})")
    if reshape:
        remarks.append(f"NeMo 2.7.3 has no recipe for {one_line(estimate.model.name)}: {factory}'s model config class "
                       "with this model's shape written over its fields (model.config.*)")
    return _render("nemo", f"{TARGET_VERSIONS['nemo']} (nemo llm pretrain --factory {factory} <these overrides>): "
                   f"{plan_caption(estimate)}", NEMO_SOURCES, overrides,
                   loss_kernel_note(estimate) + expert_gemm_note(estimate, *MEGATRON_EXPERT_GEMM)
                   + fp8_preset_notes(estimate), remarks)


def bridge_config(estimate: Estimate) -> LaunchConfig:
    require_runnable(estimate, "bridge")
    plan, training = estimate.plan, estimate.training
    fields = mcore_parallel_fields(plan, estimate.model.num_layers, moe=estimate.model.is_moe,
                                   num_mtp_layers=estimate.model.num_mtp_layers)
    split = split_overrides(fields)
    model = {name: value for name, value in fields.items() if name not in split}
    model.update(mcore_moe_fields(estimate))
    model.update(recipe_moe_fields(estimate))
    model.update(split)
    model.update(loss_fusion(estimate))
    model.update(pipeline_p2p_overlap(estimate))
    model.update(bridge_cuda_graph_fields(estimate))
    model.update(mcore_offload_fields(training))
    model["seq_length"] = training.seq_len
    kind, base = bridge_base(estimate)
    if kind == "provider":   # the provider node carries every model field (a struct config has no model.* keys)
        overrides = ["++model=" + shell_word(_hydra_node({"_target_": base, **bridge_provider_fields(estimate),
                                                          **model}))]
    else:
        overrides = [f"model.{name}={_value(value)}" for name, value in model.items()]
    overrides += [f"train.micro_batch_size={plan.mbs}", f"train.global_batch_size={training.global_batch_size}",
                  f"dataset.seq_length={training.seq_len}",
                  f"ddp.use_distributed_optimizer={_value(plan.zero >= 1)}",
                  f"optimizer.use_distributed_optimizer={_value(plan.zero >= 1)}",
                  # fp32 main parameters and Adam moments, as the memory was priced (recipes such as DeepSeek-V3's
                  # turn on the precision-aware optimizer with bf16 moments)
                  "optimizer.use_precision_aware_optimizer=false"]
    overrides += [f"optimizer.{name}=" + shell_word("{_target_:torch.float32,_call_:false}")
                  for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")]
    if plan.zero >= 2:
        overrides += ["dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true",
                      f"ddp.data_parallel_sharding_strategy={ZERO_SHARDING_STRATEGY[plan.zero]}",
                      "checkpoint.ckpt_format=fsdp_dtensor"]
    overrides += [f"ddp.{name}={_value(on)}" for name, on in data_parallel_overlap(estimate).items()]
    overrides += [f"ddp.{name}={_value(on)}" for name, on in gradient_reduce_dtype(estimate).items()]
    if plan.zero >= 2 and training.grad_reduce_in_fp32:
        # Megatron-FSDP keeps its main gradients in megatron_fsdp_main_grads_dtype (None: the parameters' bf16); a
        # torch dtype is a node the override loader instantiates (omegaconf_utils._apply_overrides), as Bridge's
        # own recipes set it (recipes/nemotronh/gb200/nemotron_3_nano.py: torch.float32)
        overrides.append("ddp.megatron_fsdp_main_grads_dtype=" + shell_word("{_target_:torch.float32,_call_:false}"))
    if estimate.training.cuda_graph_full_iteration:
        # ConfigContainer.validate: 'check_for_nan_in_loss must be disabled when using full_iteration CUDA graph'
        overrides.append("rerun_state_machine.check_for_nan_in_loss=false")
    if not estimate.training.dataloader_attention_mask:   # the loader's masks as priced (cuda_graph_loader_batches)
        overrides.append("dataset.create_attention_mask=false")
    # `++`: replace the recipe's node whatever it holds (a dataclass node refuses a plain `=`: "Could not override")
    overrides.append("++comm_overlap=" + bridge_comm_overlap(estimate))
    precision = bridge_mixed_precision(estimate)
    overrides.append("++mixed_precision=" + precision)
    remarks = [] if precision in BRIDGE_PRESET_FIELDS else [
        f"mixed_precision: Megatron-Bridge's {_bridge_preset(estimate)} preset with grad_reduce_in_fp32 and "
        "fp8_param_gather as priced (a named preset would set its own over ddp at setup)"]
    if kind == "recipe":
        remarks.insert(0, f"recipe: {base}")
        launch = f"scripts/training/run_recipe.py --recipe {base} <these overrides>"
    elif kind == "provider":
        remarks.insert(0, "provider: GPTModelProvider")
        remarks.insert(1, f"Megatron-Bridge 0.6.2 has no recipe for {one_line(estimate.model.name)}: cfg = "
                          "recipes.common._pretrain_common(), then these overrides through "
                          "process_config_with_overrides(cfg, cli_overrides=...) (the ++model node is its "
                          "GPTModelProvider with the model's shape) and pretrain(cfg, forward_step)")
        launch = "the GPTModelProvider config below, <these overrides>"
    else:
        remarks.insert(0, f"autobridge: {base}")
        remarks.insert(1, f"Megatron-Bridge 0.6.2 has no recipe for {one_line(estimate.model.name)}: cfg = "
                          "recipes.common._pretrain_common(); cfg.model = AutoBridge.from_hf_pretrained("
                          f"{base!r}).to_megatron_provider(load_weights=False); then these overrides through "
                          "process_config_with_overrides(cfg, cli_overrides=...) and pretrain(cfg, forward_step)")
        launch = "the AutoBridge config below, <these overrides>"
    notes = loss_kernel_note(estimate) + expert_gemm_note(estimate, *MEGATRON_EXPERT_GEMM) + fp8_preset_notes(estimate)
    if model_parallel_overlap(estimate)["tp_comm_overlap"]:
        notes.append("tp_comm_overlap: Transformer Engine's default userbuffers settings (comm_overlap is written "
                     "whole, without a recipe's tuned tp_comm_overlap_cfg)")
    return _render("bridge", f"{TARGET_VERSIONS['bridge']} ({launch}): {plan_caption(estimate)}", BRIDGE_SOURCES,
                   overrides, notes, remarks)


def bridge_cuda_graph_fields(estimate: Estimate) -> dict[str, object]:
    """The CUDA graphs as priced (export.common.mcore_cuda_graph_fields), written whatever the recipe sets: the
    recipe's deprecated cuda_graph_scope cleared (TransformerConfig refuses it beside cuda_graph_modules) and the
    captured modules given as cuda_graph_modules when graphs were priced (Bridge clears them for impl none)."""
    graphs = mcore_cuda_graph_fields(estimate.training)
    fields: dict[str, object] = {"cuda_graph_impl": graphs["cuda_graph_impl"], "cuda_graph_scope": None}
    if graphs["cuda_graph_impl"] != "none":
        fields["cuda_graph_modules"] = graphs["cuda_graph_modules"]
    return fields


def nemo_cuda_graph_fields(estimate: Estimate) -> dict[str, object]:
    """The CUDA graphs as priced, in NeMo 2.7.3's megatron-core 0.16 names: cuda_graph_impl, and the captured modules
    as cuda_graph_scope, one comma-separated string ('full' for the whole layer; the whole iteration is impl local
    with scope full_iteration, 0.16 having no full_iteration impl). NeMo-Run's parser gives the field
    (Union[str, ..., List[CudaGraphScope]]) any value as its str, and TransformerConfig.__post_init__ splits a string
    scope on commas. NeMo's recipes set no graphs, so an eager estimate writes nothing."""
    graphs = mcore_cuda_graph_fields(estimate.training)
    if graphs["cuda_graph_impl"] == "none":
        return {}
    if graphs["cuda_graph_impl"] == "full_iteration":
        return {"cuda_graph_impl": "local", "cuda_graph_scope": "full_iteration"}
    modules = graphs["cuda_graph_modules"]
    return {"cuda_graph_impl": graphs["cuda_graph_impl"],
            "cuda_graph_scope": ",".join(modules) if isinstance(modules, list) and modules else "full"}


BRIDGE_COMM_OVERLAP_CONFIG = "megatron.bridge.training.comm_overlap.CommOverlapConfig"


def bridge_comm_overlap(estimate: Estimate) -> str:
    """The `comm_overlap=` value: a CommOverlapConfig node with every overlap the step time priced. Megatron-Bridge's
    runtime_config_update runs CommOverlapConfig.setup after the overrides (training/config.py), and setup writes its
    own choices over model.* and ddp.* (comm_overlap.py _get_optimizer_overlap_cfgs: overlap_grad_reduce and
    overlap_param_gather on whenever dp > 1; tp_comm_overlap from the recipe) except where the CommOverlapConfig's
    own field is set (_override_user_cfgs): so the priced values are written there, on a node that replaces the
    recipe's (or its None) whole and that the override loader instantiates."""
    fields = {"tp_comm_overlap": model_parallel_overlap(estimate)["tp_comm_overlap"],
              **data_parallel_overlap(estimate),
              **(pipeline_p2p_overlap(estimate) or {"overlap_p2p_comm": False,
                                                     "batch_p2p_comm": estimate.plan.pp > 1})}
    if estimate.model.is_moe:   # setup turns it off unless set (dense models have nothing to overlap)
        fields["overlap_moe_expert_parallel_comm"] = \
            model_parallel_overlap(estimate)["overlap_moe_expert_parallel_comm"]
    return shell_word(_hydra_node({"_target_": BRIDGE_COMM_OVERLAP_CONFIG, **fields}))


def bridge_mixed_precision(estimate: Estimate) -> str:
    """The `mixed_precision=` value for the estimate: the recipe's preset by name (bf16_mixed in bf16) where its
    fp8_param_gather is what the estimate priced; else the same preset as a MixedPrecisionConfig node,
    {_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,<its fields>}, with fp8_param_gather
    (and MXFP8's reuse_grad_buf_for_mxfp8_param_ag) as priced (`fp8_param_fields`). A preset is applied over
    model.fp8_param and the ddp and optimizer fields at setup (MixedPrecisionConfig.setup,
    update_config_with_precision_overrides), so no model./ddp. line can change them, and the recipe's
    mixed_precision is a string, which has no fields to override; a dict with a _target_ replaces it and is
    instantiated by the override loader (training/utils/omegaconf_utils.py _apply_overrides; `megatron.` and
    `torch.` targets are allowed, utils/instantiate_utils.py), a torch dtype as {_target_:torch.bfloat16,_call_:false}.
    MixedPrecisionConfig keeps fp8_param equal to fp8_param_gather (__setattr__, finalize)."""
    preset = _bridge_preset(estimate)
    fields = {**BRIDGE_PRESET_FIELDS["bf16_mixed"], **BRIDGE_PRESET_FIELDS[preset]}
    priced = {**fp8_param_fields(estimate), **gradient_reduce_dtype(estimate)}
    if all(fields.get(name, False) == on for name, on in priced.items()):
        return preset
    fields.update(priced)
    return shell_word(_hydra_node({"_target_": BRIDGE_MIXED_PRECISION_CONFIG, **fields}))


def _bridge_preset(estimate: Estimate) -> str:
    recipe = estimate.training.fp8_scaling
    return BRIDGE_FP8_PRESETS[recipe.value] if recipe is not None else "bf16_mixed"


def _hydra_node(fields: dict[str, object]) -> str:
    """A dict in Hydra's override grammar, {key:value,...}: booleans true/false, numbers and bare words as they are,
    a torch dtype's name as a node that resolves to the dtype itself (_call_: false)."""
    def value(v: object) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, dict):
            return _hydra_node(v)
        if isinstance(v, list):
            return "[" + ",".join(value(item) for item in v) + "]"
        if isinstance(v, str) and v.startswith("torch."):
            return f"{{_target_:{v},_call_:false}}"
        if isinstance(v, str) and any(c in v for c in "|*(),= '[]{}:"):
            return _quoted(v)
        return str(v)

    return "{" + ",".join(f"{name}:{v if name == '_target_' else value(v)}" for name, v in fields.items()) + "}"


def _render(framework: str, caption: str, sources: tuple[str, ...], overrides: list[str],
            notes: list[str], remarks: "list[str] | tuple[str, ...]" = ()) -> LaunchConfig:
    lines = [f"# {caption}", f"# key names: {'; '.join(sources)}"]
    lines += [f"# {remark}" for remark in remarks]
    lines += [f"# not expressible: {note}" for note in notes]
    text = "\n".join(lines) + "\n" + " \\\n".join(overrides) + "\n"
    return LaunchConfig(framework=framework, text=text, unexpressed=tuple(notes), sources=sources,
                        target=TARGET_VERSIONS[framework])
