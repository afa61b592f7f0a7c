"""torchtitan job config (`[parallelism]`, `[training]`, `[activation_checkpoint]` TOML) for one plan.

Key names from pytorch/torchtitan torchtitan/config/job_config.py: `Parallelism` (data_parallel_replicate_degree,
data_parallel_shard_degree, fsdp_reshard_after_forward, tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_split_points, pipeline_parallel_schedule, pipeline_parallel_microbatch_size,
context_parallel_degree, expert_parallel_degree, expert_tensor_parallel_degree), `Training` (local_batch_size,
global_batch_size, seq_len, mixed_precision_param), `ActivationCheckpoint` (mode, selective_ac_option).

torchtitan shards data parallelism with FSDP2, so `zero` maps onto its two DP axes: zero 0 = plain replication
(DDP: replicate = dp, shard = 1); zero 3 = FSDP (shard = dp); zero 1 and 2 keep parameters gathered between forward
and backward (`fsdp_reshard_after_forward = "never"`, the ZeRO-2 behaviour of FSDP). Its tensor parallelism always
shards the sequence in norms and dropout (Megatron's SP).
"""

from __future__ import annotations

from autopar.export.common import LaunchConfig, chunk_layers_in_model_order, one_line, plan_caption
from costmodels.scoring import Estimate
from costmodels.plan import Recompute
from costmodels.specs import Precision

SOURCES = ("pytorch/torchtitan torchtitan/config/job_config.py",)


def _split_points(num_layers: int, estimate: Estimate) -> list[str]:
    """'layers.N' at the first decoder layer of every (virtual) stage after the first, in model order."""
    points, start = [], 0
    for count in chunk_layers_in_model_order(num_layers, estimate.plan)[:-1]:
        start += count
        points.append(f"layers.{start}")
    return points


def launch_config(estimate: Estimate) -> LaunchConfig:
    plan, training, model = estimate.plan, estimate.training, estimate.model
    dp = estimate.dp
    notes = []
    if plan.tp > 1 and not plan.sp:
        notes.append("sp=false: torchtitan's tensor parallelism always shards the sequence (SP on)")
    if plan.zero == 1:
        notes.append("zero=1: torchtitan has no optimizer-only sharding; FSDP with parameters kept gathered "
                     "after forward (ZeRO-2 behaviour) is the closest")
    if plan.recompute is Recompute.FULL and plan.recompute_layers:
        notes.append(f"recompute_layers={plan.recompute_layers}: torchtitan's full AC recomputes every layer "
                     "(selective_ac_option='N' checkpoints every N-th layer instead)")
    if plan.recompute is Recompute.SELECTIVE:
        notes.append("selective recompute: torchtitan's op-level selective AC (selective_ac_option='op') is the "
                     "closest to Megatron's attention-core recompute, not the same set of ops")
    if model.is_moe and plan.etp not in (1, plan.tp):
        notes.append(f"etp={plan.etp}: torchtitan supports expert TP equal to tp or 1 only")
    if plan.ep > 1 and plan.zero == 0:
        notes.append("ep > 1 with zero=0: torchtitan takes expert-parallel ranks from the FSDP "
                     "(data_parallel_shard_degree x context_parallel_degree) dimension")
    if training.precision is Precision.FP8:
        notes.append("fp8: enable with model.converters = [\"float8\"] and a [float8] recipe (torchao)")
    sharded = plan.zero >= 1
    parallelism = [f"data_parallel_replicate_degree = {1 if sharded else dp}",
                   f"data_parallel_shard_degree = {dp if sharded else 1}"]
    if plan.zero in (1, 2):
        parallelism.append('fsdp_reshard_after_forward = "never"')
    parallelism += [f"tensor_parallel_degree = {plan.tp}", f"context_parallel_degree = {plan.cp}",
                    f"pipeline_parallel_degree = {plan.pp}"]
    if plan.pp > 1:
        points = ", ".join(f'"{p}"' for p in _split_points(model.num_layers, estimate))
        parallelism += [f'pipeline_parallel_schedule = "{"Interleaved1F1B" if plan.vpp > 1 else "1F1B"}"',
                        f"pipeline_parallel_split_points = [{points}]",
                        f"pipeline_parallel_microbatch_size = {plan.mbs}"]
    if model.is_moe:
        parallelism += [f"expert_parallel_degree = {plan.ep}", f"expert_tensor_parallel_degree = {plan.etp}"]
    # With PP the whole per-rank batch is one schedule of microbatches; without it torchtitan accumulates
    # gradients global_batch_size / (local_batch_size * dp) times.
    local_batch = training.global_batch_size // dp if plan.pp > 1 and dp else plan.mbs
    training_lines = [f"local_batch_size = {local_batch}", f"global_batch_size = {training.global_batch_size}",
                      f"seq_len = {training.seq_len}", 'mixed_precision_param = "bfloat16"']
    mode = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[plan.recompute]
    checkpoint_lines = [f'mode = "{mode}"']
    if plan.recompute is Recompute.SELECTIVE:
        checkpoint_lines.append('selective_ac_option = "op"')
    header = [f"# torchtitan: {plan_caption(estimate)}", f"# key names: {SOURCES[0]}",
              f"# model: {one_line(model.name)} (set [model] name/flavor to the matching torchtitan model)"]
    header += [f"# not expressible: {note}" for note in notes]
    text = "\n".join(header + ["", "[parallelism]"] + parallelism + ["", "[training]"] + training_lines
                     + ["", "[activation_checkpoint]"] + checkpoint_lines) + "\n"
    return LaunchConfig(framework="torchtitan", text=text, unexpressed=tuple(notes), sources=SOURCES)
