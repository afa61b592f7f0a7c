"""One entry point over the whole cost model: memory (worst pipeline stage) and step time for many plans at once.

`evaluate` is what the oracle, the CP-SAT table builder and `estimate` all call; it only combines the term functions
of `costmodels.memory` and `costmodels.steptime`, and adds the throughput figures derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels import memory, steptime
from costmodels.plan import Plan, PlanArrays, as_plan_arrays, data_parallel_size, num_microbatches
from costmodels.specs import ClusterSpec, ModelSpec, TrainingSpec


@dataclass(frozen=True)
class Evaluation:
    """Cost-model output for `len(plans)` plans; every array has one entry per plan."""

    plans: PlanArrays
    dp: np.ndarray
    num_microbatches: np.ndarray
    memory_terms_bytes: dict[str, np.ndarray]
    """Named memory terms on each plan's worst stage; they sum to peak_memory_bytes."""
    peak_memory_bytes: np.ndarray
    worst_stage: np.ndarray
    time_terms_s: dict[str, np.ndarray]
    """Named step-time terms; they sum to step_time_s."""
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    model_tflops_per_gpu: np.ndarray
    """Model FLOPs (no recompute) per step / step time / GPUs, in TFLOP/s."""
    hardware_tflops_per_gpu: np.ndarray
    """FLOPs actually executed (recompute counted) per step / step time / GPUs, in TFLOP/s."""
    mfu: np.ndarray
    """Model FLOPs utilisation: model FLOP/s per GPU over the GPU's dense peak for the precision."""

    def __len__(self) -> int:
        return len(self.plans)


def evaluate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
             plans: "Plan | PlanArrays | list[Plan]") -> Evaluation:
    plans = as_plan_arrays(plans)
    peak_bytes, worst_stage, memory_terms = memory.peak_memory(model, cluster, training, plans)
    time_terms = steptime.step_time_terms_s(model, cluster, training, plans)
    step_time_s = sum(time_terms.values())
    return Evaluation(
        plans=plans,
        dp=data_parallel_size(plans, cluster.num_gpus),
        num_microbatches=num_microbatches(plans, cluster.num_gpus, training.global_batch_size),
        memory_terms_bytes=memory_terms,
        peak_memory_bytes=peak_bytes,
        worst_stage=worst_stage,
        time_terms_s=time_terms,
        step_time_s=step_time_s,
        **throughput(model, cluster, training, plans, step_time_s),
    )


def throughput(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
               step_time_s: np.ndarray) -> dict[str, np.ndarray]:
    """tokens_per_s, model_tflops_per_gpu, hardware_tflops_per_gpu and mfu of plans taking `step_time_s`."""
    model_flops = steptime.model_flops_per_step(model, training)
    hardware_flops = steptime.hardware_flops_per_step(model, training, plans)
    peak_flops = cluster.profile.peak_flops_per_s[training.precision.value]
    model_flops_per_gpu_s = model_flops / step_time_s / cluster.num_gpus
    return {"tokens_per_s": training.tokens_per_step / step_time_s,
            "model_tflops_per_gpu": model_flops_per_gpu_s / 1e12,
            "hardware_tflops_per_gpu": hardware_flops / step_time_s / cluster.num_gpus / 1e12,
            "mfu": model_flops_per_gpu_s / peak_flops}
