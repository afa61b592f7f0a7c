"""verl's Megatron-backend actor settings (`actor_rollout_ref.actor.*`) for one plan, as YAML.

Key names from volcengine/verl verl/trainer/config/actor/megatron_actor.yaml and engine/megatron.yaml
(`megatron.tensor_model_parallel_size`, `pipeline_model_parallel_size`, `virtual_pipeline_model_parallel_size`,
`context_parallel_size`, `expert_model_parallel_size`, `expert_tensor_parallel_size`, `sequence_parallel`,
`use_distributed_optimizer`, and `override_transformer_config` for Megatron-Core TransformerConfig fields such as
`recompute_granularity` and `num_layers_in_first_pipeline_stage`, and `override_ddp_config` for Megatron-Core
DistributedDataParallelConfig fields: `overlap_grad_reduce`, `overlap_param_gather`) and actor/actor.yaml (`ppo_mini_batch_size`,
`ppo_micro_batch_size_per_gpu`).
"""

from __future__ import annotations

from autopar.export.common import (LaunchConfig, data_parallel_overlap, mcore_parallel_fields, one_line,
                                   plan_caption)
from costmodels.scoring import Estimate
from costmodels.specs import Precision

SOURCES = ("volcengine/verl verl/trainer/config/actor/megatron_actor.yaml",
           "volcengine/verl verl/trainer/config/engine/megatron.yaml",
           "volcengine/verl verl/trainer/config/actor/actor.yaml")

MEGATRON_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                   "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                   "expert_tensor_parallel_size", "sequence_parallel")
OVERRIDE_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                   "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                   "recompute_granularity", "recompute_method", "recompute_num_layers")


def _yaml(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def launch_config(estimate: Estimate) -> LaunchConfig:
    plan, training = estimate.plan, estimate.training
    fields = mcore_parallel_fields(plan, estimate.model.num_layers, moe=estimate.model.is_moe)
    notes = []
    if plan.zero >= 2:
        notes.append(f"zero={plan.zero}: verl's Megatron backend shards only the optimizer "
                     "(use_distributed_optimizer); gradient/parameter sharding is not expressible")
    if training.precision is Precision.FP8:
        notes.append("fp8: verl's Megatron backend takes fp8 through override_transformer_config "
                     "(fp8: hybrid) only in some versions; set it there if yours supports it")
    lines = [f"# verl (Megatron backend): {plan_caption(estimate)}",
             f"# key names: {'; '.join(SOURCES)}",
             f"# ppo_mini_batch_size counts prompts; verl multiplies it by rollout.n: shown for rollout.n = 1, "
             f"i.e. {training.global_batch_size} sequences per optimizer step",
             f"# sequence length {training.seq_len} = data.max_prompt_length + data.max_response_length "
             f"({one_line(estimate.model.name)})"]
    lines += [f"# not expressible: {note}" for note in notes]
    lines += ["actor_rollout_ref:", "  actor:", "    strategy: megatron",
              f"    ppo_mini_batch_size: {training.global_batch_size}",
              f"    ppo_micro_batch_size_per_gpu: {plan.mbs}", "    use_dynamic_bsz: False", "    megatron:"]
    lines += [f"      {name}: {_yaml(fields[name])}" for name in MEGATRON_FIELDS if name in fields]
    lines.append(f"      use_distributed_optimizer: {_yaml(plan.zero >= 1)}")
    lines.append("      override_ddp_config:")
    lines += [f"        {name}: {_yaml(on)}" for name, on in data_parallel_overlap(estimate).items()]
    overrides = [(name, fields[name]) for name in OVERRIDE_FIELDS if fields[name] is not None]
    if overrides:
        lines.append("      override_transformer_config:")
        lines += [f"        {name}: {_yaml(value)}" for name, value in overrides]
    return LaunchConfig(framework="verl", text="\n".join(lines) + "\n", unexpressed=tuple(notes), sources=SOURCES)
