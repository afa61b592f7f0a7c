"""DeepSpeed config JSON for one plan.

Key names from deepspeedai/DeepSpeed docs/_pages/config-json.md (train_batch_size, train_micro_batch_size_per_gpu,
gradient_accumulation_steps, zero_optimization.stage, bf16.enabled) and docs/_tutorials/autotp-training.md
(tensor_parallel.autotp_size). DeepSpeed checks train_batch_size = micro batch × accumulation × data-parallel size;
deepspeed/runtime/pipe/engine.py asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".

JSON has no comments: what DeepSpeed's config cannot express (pipeline stages and MoE expert-parallel size are set in
model code, Megatron-style SP and CP do not exist) is in `LaunchConfig.unexpressed`, which the CLI prints to stderr.
"""

from __future__ import annotations

import json

from autopar.export.common import LaunchConfig, gradient_accumulation_steps
from costmodels.scoring import Estimate
from costmodels.plan import Recompute
from costmodels.specs import Precision

SOURCES = ("deepspeedai/DeepSpeed docs/_pages/config-json.md",
           "deepspeedai/DeepSpeed docs/_tutorials/autotp-training.md")


def launch_config(estimate: Estimate) -> LaunchConfig:
    plan, training = estimate.plan, estimate.training
    notes = []
    if plan.pp > 1:
        notes.append(f"pp={plan.pp}: pipeline stages are set in code (deepspeed.pipe.PipelineModule(num_stages="
                     f"{plan.pp})), not in the config")
        if plan.zero >= 2:
            notes.append(f"zero={plan.zero} with pp > 1: DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 "
                         "only")
    if plan.vpp > 1 or plan.first_stage_layers or plan.last_stage_layers:
        notes.append("interleaved / uneven pipeline stages: not expressible (PipelineModule partition_method "
                     "splits layers itself)")
    if plan.cp > 1:
        notes.append(f"cp={plan.cp}: DeepSpeed has no ring context parallelism (Ulysses sequence parallelism, "
                     "sequence_parallel_size, is a different algorithm)")
    if plan.sp:
        notes.append("sp: Megatron-style sequence parallelism is not expressible")
    if plan.ep > 1 or plan.etp != plan.tp:
        notes.append(f"ep={plan.ep}, etp={plan.etp}: expert parallelism is set in model code "
                     "(deepspeed.moe.layer.MoE(ep_size=...))")
    if plan.recompute is not Recompute.NONE:
        notes.append(f"recompute={plan.recompute.label}: activation checkpointing is applied in model code "
                     "(deepspeed.checkpointing.checkpoint around each layer)")
    if training.precision is Precision.FP8:
        notes.append("fp8: DeepSpeed's config has no fp8 switch; use Transformer Engine layers in the model")
    config: dict[str, object] = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": gradient_accumulation_steps(estimate),
        "zero_optimization": {"stage": plan.zero},
        "bf16": {"enabled": True},
    }
    if plan.tp > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    text = json.dumps(config, indent=2) + "\n"
    return LaunchConfig(framework="deepspeed", text=text, unexpressed=tuple(notes), sources=SOURCES)
