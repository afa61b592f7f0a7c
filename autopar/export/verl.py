"""verl (Megatron backend) Hydra overrides for one plan, for `python -m verl.trainer.main_ppo --config-name
ppo_megatron_trainer ...` (verl 0.9.1).

Key names from volcengine/verl verl/trainer/config/ppo_megatron_trainer.yaml and the files it composes:
actor/megatron_actor.yaml with engine/megatron.yaml (`megatron.tensor_model_parallel_size`,
`pipeline_model_parallel_size`, `virtual_pipeline_model_parallel_size`, `context_parallel_size`,
`expert_model_parallel_size`, `expert_tensor_parallel_size`, `sequence_parallel`, `use_distributed_optimizer`,
`use_megatron_fsdp`, `override_transformer_config` for Megatron-Core TransformerConfig fields and
`override_ddp_config` for DistributedDataParallelConfig fields), optim/megatron.yaml (`override_optimizer_config` for
OptimizerConfig fields), actor/actor.yaml (`ppo_mini_batch_size`,
`ppo_micro_batch_size_per_gpu`, `use_dynamic_bsz`), data/legacy_data.yaml (`train_batch_size`), trainer
(`nnodes`, `n_gpus_per_node`).

fp8 (Transformer Engine, which verl's Megatron backend builds on through Megatron-Bridge): TransformerConfig's fp8,
fp8_recipe and fp8_param on override_transformer_config (verl/workers/engine/megatron/transformer_impl.py
_build_tf_config: every key is set on the Megatron-Bridge model provider), fp8_param_gather (and MXFP8's
reuse_grad_buf_for_mxfp8_param_ag) on override_ddp_config (verl/utils/megatron_utils.py: the overrides go to
DistributedDataParallelConfig), the recipe (and the reuse flag) on the optimizer's override_optimizer_config
(verl/utils/megatron/optimizer.py init_megatron_optim_config: passed to OptimizerConfig), as
verl-project/verl-recipe low_precision/README.md sets them; fp8 parameters as priced (export.common.fp8_param_fields).

Hydra refuses an override of a key the composed defaults do not have unless it is prefixed with `+`
("Could not override ... Key ... is not in struct"), and refuses `+` for a key they do have; `DEFAULT_KEYS` lists
the defaults' keys under override_transformer_config / override_ddp_config / override_optimizer_config (verl 0.9.1
engine/megatron.yaml: override_ddp_config is empty; override_transformer_config has the recompute_* fields and
attention_backend; optim/megatron.yaml: override_optimizer_config is empty).

Batch: verl's validate_config (verl/utils/config.py) checks data.train_batch_size × rollout.n against the
Megatron data-parallel size × ppo_micro_batch_size_per_gpu, and the actor's validate that ppo_mini_batch_size
× rollout.n divides into it; the plan's global batch is one PPO mini-batch: train_batch_size = ppo_mini_batch_size =
the global batch with rollout.n = 1, one optimizer step per training step.
"""

from __future__ import annotations

from autopar.export.capabilities import TARGET_VERSIONS, require_runnable
from autopar.export.common import (MEGATRON_EXPERT_GEMM, LaunchConfig, data_parallel_overlap, expert_gemm_note,
                                   flash_version_note, fp8_param_fields, gradient_reduce_dtype, hf_model_source,
                                   mcore_cuda_graph_fields, mcore_moe_fields, mcore_offload_fields,
                                   mcore_parallel_fields, megatron_attention_backend, one_line, pipeline_p2p_overlap,
                                   plan_caption, shell_word)
from costmodels.errors import InputError
from autopar.export.megatron import ZERO_SHARDING_STRATEGY
from costmodels.scoring import Estimate

SOURCES = ("volcengine/verl verl/trainer/config/ppo_megatron_trainer.yaml",
           "volcengine/verl verl/trainer/config/engine/megatron.yaml",
           "volcengine/verl verl/trainer/config/optim/megatron.yaml",
           "volcengine/verl verl/trainer/config/actor/actor.yaml",
           "volcengine/verl verl/utils/config.py validate_config")

ACTOR = "actor_rollout_ref.actor"
MEGATRON_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                   "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                   "expert_tensor_parallel_size", "sequence_parallel")
OVERRIDE_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                   "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                   "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")
DEFAULT_KEYS = {"override_transformer_config": frozenset({"recompute_granularity", "recompute_modules",
                                                          "recompute_method", "recompute_num_layers",
                                                          "attention_backend"}),
                "override_ddp_config": frozenset(), "override_optimizer_config": frozenset()}
"""Keys verl 0.9.1's engine/megatron.yaml (optim/megatron.yaml) already has under each override dict (no `+` for
these, `+` for others)."""


def _value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):   # one shell word: Hydra's list, no spaces, quoted against the shell's globbing
        return shell_word("[" + ",".join(str(v) for v in value) + "]")
    return str(value)


ALGORITHMS = {"gae": True, "grpo": False, "reinforce_plus_plus": False, "reinforce_plus_plus_baseline": False,
              "remax": False, "rloo": False, "opo": False, "grpo_passk": False, "gpg": False}
"""verl 0.9.1's advantage estimators (verl/trainer/ppo/core_algos.py AdvantageEstimator) -> whether it trains a critic
(verl/trainer/ppo/utils.py need_critic: critic.enable unset, so adv_estimator == gae)."""
DEFAULT_ALGORITHM = "gae"
"""PPO with GAE: the algorithm verl's quickstart trains (docs/start/quickstart.rst, 'PPO training') and
ppo_megatron_trainer.yaml's algorithm.adv_estimator default."""
KL_LOSS_ALGORITHMS = frozenset({"grpo", "grpo_passk", "gpg"})
"""The estimators verl's docs run with the KL loss in the actor (actor.use_kl_loss=True, docs/algo/grpo.md), which
needs the reference policy (need_reference_policy)."""


def _override(section: str, name: str, value: object, engine: str = f"{ACTOR}.megatron",
              optim: str = f"{ACTOR}.optim") -> str:
    plus = "" if name in DEFAULT_KEYS[section] else "+"
    parent = optim if section == "override_optimizer_config" else engine
    return f"{plus}{parent}.{section}.{name}={_value(value)}"


def verl_algorithm(name: object) -> str:
    """The advantage estimator named by `--verl-algorithm` (case-insensitive), or InputError listing verl's."""
    key = str(name).strip().lower() if name is not None else DEFAULT_ALGORITHM
    if key not in ALGORITHMS:
        raise InputError("verl-algorithm", f"unknown verl algorithm {name!r}; use one of {', '.join(ALGORITHMS)}")
    return key


def sequence_lengths(seq_len: int) -> tuple[int, int]:
    """(data.max_prompt_length, data.max_response_length) whose sum is the priced sequence: the actor trains on
    prompt and response together (rollout.prompt_length / response_length interpolate from them), so only the sum
    is priced; half each."""
    return seq_len // 2, seq_len - seq_len // 2


def engine_overrides(estimate: Estimate, engine: str, optim: str) -> list[str]:
    """The Megatron engine settings of one worker (`engine`: the actor's or the critic's `.megatron` section,
    `optim` its optimizer section): the plan's parallel sizes, ZeRO, overlaps, gradient dtype, recompute, MoE and
    fp8 fields (engine/megatron.yaml, McoreEngineConfig)."""
    plan = estimate.plan
    fields = mcore_parallel_fields(plan, estimate.model.num_layers, moe=estimate.model.is_moe)

    def override(section: str, name: str, value: object) -> str:
        return _override(section, name, value, engine, optim)

    overrides = [f"{engine}.{name}={_value(fields[name])}" for name in MEGATRON_FIELDS if name in fields]
    overrides.append(f"{engine}.use_distributed_optimizer={_value(plan.zero >= 1)}")
    overrides.append(f"{engine}.use_megatron_fsdp={_value(plan.zero >= 2)}")
    overrides += [override("override_ddp_config", name, on) for name, on in data_parallel_overlap(estimate).items()]
    # an explicit override_ddp_config value wins over verl's own choice (engine/megatron/transformer_impl.py)
    overrides += [override("override_ddp_config", name, on) for name, on in gradient_reduce_dtype(estimate).items()]
    if plan.zero >= 2:
        overrides.append(override("override_ddp_config", "data_parallel_sharding_strategy",
                                  ZERO_SHARDING_STRATEGY[plan.zero]))
    # the recompute fields verl's defaults set are written even when null (verl's default recompute_modules is
    # Megatron-Core's own ['core_attn'], so it is written only when the plan's set differs)
    overrides += [override("override_transformer_config", name, fields[name]) for name in OVERRIDE_FIELDS
                  if fields[name] is not None
                  or (name in DEFAULT_KEYS["override_transformer_config"] and name != "recompute_modules")]
    overrides += [override("override_transformer_config", name, value)
                  for name, value in mcore_moe_fields(estimate).items()]
    overrides += [override("override_transformer_config", name, on)
                  for name, on in pipeline_p2p_overlap(estimate).items()]
    backend = megatron_attention_backend(estimate)
    if backend is not None:
        overrides.append(override("override_transformer_config", "attention_backend", backend))
    # the CUDA graphs the launches were priced with (TransformerConfig's default impl is none: written only then)
    graphs = mcore_cuda_graph_fields(estimate.training)
    if graphs["cuda_graph_impl"] != "none":
        overrides += [override("override_transformer_config", name, value) for name, value in graphs.items()]
    overrides += [override("override_transformer_config", name, value)
                  for name, value in mcore_offload_fields(estimate.training).items()]
    overrides += fp8_overrides(estimate, engine, optim)
    return overrides


def launch_config(estimate: Estimate, verl_algorithm_name: object = None, **_: object) -> LaunchConfig:
    require_runnable(estimate, "verl")
    algorithm = verl_algorithm(verl_algorithm_name)
    critic = ALGORITHMS[algorithm]
    plan, training, cluster = estimate.plan, estimate.training, estimate.cluster
    notes = []
    prompt, response = sequence_lengths(training.seq_len)
    overrides = [f"algorithm.adv_estimator={algorithm}",
                 f"actor_rollout_ref.model.path={hf_model_source(estimate.model)}",
                 f"data.max_prompt_length={prompt}", f"data.max_response_length={response}",
                 f"trainer.nnodes={cluster.num_nodes}",
                 f"trainer.n_gpus_per_node={min(cluster.gpus_per_node, cluster.num_gpus)}",
                 f"data.train_batch_size={training.global_batch_size}",
                 "actor_rollout_ref.rollout.n=1",
                 # the log-prob passes (rollout, reference) run on the same layout: the plan's micro-batch
                 f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={plan.mbs}",
                 f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={plan.mbs}",
                 f"{ACTOR}.strategy=megatron",
                 f"{ACTOR}.ppo_mini_batch_size={training.global_batch_size}",
                 f"{ACTOR}.ppo_micro_batch_size_per_gpu={plan.mbs}",
                 f"{ACTOR}.use_dynamic_bsz=False",
                 f"{ACTOR}.use_kl_loss={_value(algorithm in KL_LOSS_ALGORITHMS)}"]
    overrides += engine_overrides(estimate, f"{ACTOR}.megatron", f"{ACTOR}.optim")
    if critic:   # GAE's value model: its own Megatron engine, on the plan's layout (critic/megatron_critic.yaml)
        overrides += [f"critic.model.path={hf_model_source(estimate.model)}",
                      f"critic.ppo_micro_batch_size_per_gpu={plan.mbs}"]
        overrides += engine_overrides(estimate, "critic.megatron", "critic.optim")
        notes.append(f"{algorithm} trains a critic (a value model of the same shape, critic.model.path = the "
                     "actor's) with this layout: the estimate prices one model's training step, and the critic's "
                     "step and memory come beside it (verl runs the workers colocated)")
    notes += flash_version_note(estimate) + expert_gemm_note(estimate, *MEGATRON_EXPERT_GEMM)
    lines = [f"# {TARGET_VERSIONS['verl']}: {plan_caption(estimate)}",
             f"# python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer <these overrides> (algorithm "
             f"{algorithm}{', with a critic' if critic else ', no critic'})",
             f"# key names: {'; '.join(SOURCES)}",
             f"# data.train_batch_size = ppo_mini_batch_size = {training.global_batch_size} prompts with rollout.n = 1:"
             f" one optimizer step of {training.global_batch_size} sequences per training step",
             f"# sequence length {training.seq_len} = data.max_prompt_length {prompt} + data.max_response_length "
             f"{response} ({one_line(estimate.model.name)}; only the sum is priced)"]
    lines += [f"# note: {note}" for note in notes]
    text = "\n".join(lines) + "\n" + " \\\n".join(overrides) + "\n"
    return LaunchConfig(framework="verl", text=text, unexpressed=tuple(notes), sources=SOURCES,
                        target=TARGET_VERSIONS["verl"])


def fp8_overrides(estimate: Estimate, engine: str = f"{ACTOR}.megatron", optim: str = f"{ACTOR}.optim") -> list[str]:
    """fp8 as the estimate priced it (see the module docstring); none in bf16, verl's default. The format is hybrid
    (e4m3 forward, e5m2 gradients), as the Megatron-LM export writes it."""
    training = estimate.training
    if training.fp8_scaling is None:
        return []
    recipe = training.fp8_scaling.value
    params = fp8_param_fields(estimate)
    optimizer = {"fp8_recipe": recipe}
    if "reuse_grad_buf_for_mxfp8_param_ag" in params:   # MXFP8: the distributed optimizer reads its own copy
        optimizer["reuse_grad_buf_for_mxfp8_param_ag"] = params["reuse_grad_buf_for_mxfp8_param_ag"]
    return ([_override("override_transformer_config", name, value, engine, optim) for name, value in
             (("fp8", "hybrid"), ("fp8_recipe", recipe), ("fp8_param", params["fp8_param_gather"]))]
            + [_override("override_ddp_config", name, on, engine, optim) for name, on in params.items()]
            + [_override("override_optimizer_config", name, value, engine, optim) for name, value in optimizer.items()])
