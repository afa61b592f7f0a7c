"""DeepSpeed config JSON for one plan (DeepSpeed 0.19.8).

Key names from deepspeedai/DeepSpeed docs/_pages/config-json.md (train_batch_size, train_micro_batch_size_per_gpu,
gradient_accumulation_steps, zero_optimization.stage, bf16.enabled) and docs/_tutorials/autotp-training.md
(tensor_parallel.autotp_size).

The batch triple must satisfy DeepSpeedConfig._batch_assertion (deepspeed/runtime/config.py):
train_batch_size == train_micro_batch_size_per_gpu × gradient_accumulation_steps × world_size, where world_size is
DeepSpeed's own count, not autopar's data-parallel size (`deepspeed_world_size`):

* pp > 1: `deepspeed.initialize` builds the config with the PipelineModule's topology as `mpu`
  (deepspeed/__init__.py: `mpu = model.mpu(); DeepSpeedConfig(config, mpu)`), so world_size =
  mpu.get_data_parallel_world_size() = dp; tensor parallelism then comes from the topology (model code).
* pp = 1: no mpu and no mesh (AutoTP is set up later, in the engine), so world_size = dist.get_world_size(), every
  rank -- with AutoTP the tp ranks of one replica each count a micro-batch, and train_batch_size is tp × the plan's
  global batch while every rank still reads `train_micro_batch_size_per_gpu` samples per micro-step.

Plans DeepSpeed cannot run (pp > 1 with ZeRO >= 2, MoE with ZeRO-3, cp, interleaving, Megatron SP, expert TP) are
refused (export.capabilities), and so are estimates with fp8 parameters (TrainingSpec.fp8_param_gather): its engine
and ZeRO hold and gather bf16 weights. JSON has no comments: what is set in model code (pipeline stages, the MoE layer's
ep_size, activation checkpointing) is in `LaunchConfig.unexpressed`, which the CLI prints to stderr.
"""

from __future__ import annotations

import json

from autopar.export.capabilities import TARGET_VERSIONS, require_runnable
from autopar.export.common import LaunchConfig, fp8_weight_copies_note, gradient_accumulation_steps
from costmodels.scoring import Estimate
from costmodels.plan import Recompute
from costmodels.specs import Precision

SOURCES = ("deepspeedai/DeepSpeed docs/_pages/config-json.md",
           "deepspeedai/DeepSpeed docs/_tutorials/autotp-training.md",
           "deepspeedai/DeepSpeed deepspeed/runtime/config.py DeepSpeedConfig (world size, batch assertion)")


def deepspeed_world_size(estimate: Estimate) -> int:
    """The world size DeepSpeedConfig multiplies the micro-batch by (see the module docstring)."""
    return estimate.dp if estimate.plan.pp > 1 else estimate.cluster.num_gpus


def launch_config(estimate: Estimate) -> LaunchConfig:
    require_runnable(estimate, "deepspeed")
    plan, training = estimate.plan, estimate.training
    accumulation = gradient_accumulation_steps(estimate)
    world = deepspeed_world_size(estimate)
    notes = [f"{TARGET_VERSIONS['deepspeed']} config; "
             f"train_batch_size = {plan.mbs} x {accumulation} x world size {world} (DeepSpeed's count: "
             + ("the pipeline topology's data-parallel size)" if plan.pp > 1 else
                f"every rank{f', so the {plan.tp} AutoTP ranks of a replica each count' if plan.tp > 1 else ''}; the "
                f"plan's global batch is {training.global_batch_size} sequences)")]
    if plan.pp > 1:
        notes.append(f"pp={plan.pp}: pipeline stages are set in code: deepspeed.pipe.PipelineModule(layers, "
                     f"num_stages={plan.pp}, partition_method='uniform'"
                     + (f", topology=PipeModelDataParallelTopology(num_pp={plan.pp}, num_mp={plan.tp}, "
                        f"num_dp={estimate.dp})" if plan.tp > 1 else "") + ")")
    if estimate.model.is_moe:
        notes += deepspeed_moe_notes(estimate)
    if plan.recompute is not Recompute.NONE:
        which = f"the first {plan.recompute_layers} layers of each stage" if plan.recompute_layers else "every layer"
        notes.append(f"recompute=full: wrap {which} in deepspeed.checkpointing.checkpoint (model code)")
    if training.precision is Precision.FP8:
        notes.append("fp8: DeepSpeed's config has no fp8 switch; use Transformer Engine layers in the model")
        notes += fp8_weight_copies_note(estimate, "Transformer Engine keeps only when called with "
                                                  "is_first_microbatch, as Megatron-Core calls it")
    config: dict[str, object] = {
        "train_batch_size": plan.mbs * accumulation * world,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": plan.zero},
        "bf16": {"enabled": True},
        # the gradient reduce's dtype as priced: DeepSpeed's default with bf16 is bf16 (engine.py
        # communication_data_type), Megatron's fp32 (TrainingSpec.grad_reduce_in_fp32)
        "communication_data_type": "fp32" if training.grad_reduce_in_fp32 else "bf16",
    }
    if plan.tp > 1 and plan.pp == 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    text = json.dumps(config, indent=2) + "\n"
    return LaunchConfig(framework="deepspeed", text=text, unexpressed=tuple(notes), sources=SOURCES,
                        target=TARGET_VERSIONS["deepspeed"])


def deepspeed_moe_notes(estimate: Estimate) -> list[str]:
    """How to build the MoE layer the estimate priced (deepspeed/moe/layer.py MoE: capacity_factor=1.0 and
    drop_tokens=True by default). DeepSpeed dispatches dense [experts, capacity, hidden] tensors
    (moe/sharded_moe.py: the gate's combine/dispatch masks of E×C slots), so every expert runs its whole capacity:
    with a cap, cf× the balanced load, which the estimate priced only where its imbalance reaches the cap; dropless
    (drop_tokens=False) the capacity is the busiest expert's count, the load the estimate priced."""
    plan, moe, capacity = estimate.plan, estimate.model.moe, estimate.training.moe_capacity_factor
    assert moe is not None
    routing = "drop_tokens=False" if capacity is None else f"capacity_factor={capacity!r}"
    notes = [f"ep={plan.ep}: experts are set in model code: deepspeed.moe.layer.MoE(..., "
             f"num_experts={moe.num_experts}, ep_size={plan.ep}, k={moe.top_k}, {routing})"]
    if capacity is not None and estimate.training.moe_imbalance_factor < capacity:
        notes.append(f"capacity_factor {capacity!r}: DeepSpeed pads every expert to its capacity (dense "
                     f"expert×capacity dispatch), a load of {capacity:g}× the balanced one; the estimate priced "
                     f"{min(estimate.training.moe_imbalance_factor, capacity):g}× (estimate again with "
                     f"--moe-imbalance-factor {max(1.0, capacity):g} for it)")
    return notes
