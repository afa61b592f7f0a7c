"""What fp8 parameters (--fp8-param-gather, TrainingSpec.fp8_param_gather) change: the weights a stage holds, its peak,
the data-parallel parameter all-gather and the step, per GPU and recipe, against bf16 weights beside Transformer
Engine's fp8 copies.

    python benchmarks/fp8_params.py

Two cases:
- Llama 3.1 70B on 64 GPUs at tp 8 with SP, full recompute, the distributed optimizer, seq 8192, global batch 64
  (benchmarks/fp8_recipes.py's layout), on H100 and B200, every recipe each runs.
- The layout of Megatron-Bridge's performance recipe llama3_70b_pretrain_64gpu_gb200_fp8mx_config
  (src/megatron/bridge/perf_recipes/llama/gb200/llama3.py: tp 2, pp 4, vpp 5, SP, micro-batch 1, global batch 256,
  seq 8192; the MXFP8 preset, which sets fp8_param_gather; bf16 gradients, perf_recipes/_common.py; TP comm overlap;
  the distributed optimizer with both overlaps, recipes/common.py): its configuration only, no published result.

Model figures, not measurements: what costmodels prices (memory.layer_weight_bytes_per_param,
TrainingSpec.param_gather_bytes_by_zero, steptime.dp_traffic_s). Ends with one `fp8-params:` line per case.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autopar.models import load_model  # noqa: E402
from costmodels import steptime  # noqa: E402
from costmodels.hardware import load_profile  # noqa: E402
from costmodels.plan import Plan, PlanArrays  # noqa: E402
from costmodels.scoring import Estimate, estimate  # noqa: E402
from costmodels.specs import ClusterSpec, TrainingSpec  # noqa: E402

GIB = 2**30
MODEL = "llama-3.1-70b"
TP8 = Plan(tp=8, sp=True, mbs=1, recompute="full", zero=1)
RECIPES = {"h100-80gb": ("delayed", "tensorwise", "blockwise"),
           "b200-180gb": ("delayed", "tensorwise", "blockwise", "mxfp8")}
BRIDGE_PLAN = Plan(tp=2, pp=4, vpp=5, sp=True, mbs=1, zero=1)
BRIDGE_TRAINING = TrainingSpec(seq_len=8192, global_batch_size=256, precision="fp8", fp8_recipe="mxfp8",
                               grad_reduce_in_fp32=False, tp_comm_overlap=True, overlap_grad_reduce=True,
                               overlap_param_gather=True)


def weight_gib(result: Estimate) -> float:
    """The tightest stage's decoder-layer weights and Transformer Engine's fp8 copies of them, GiB."""
    terms = result.stages[result.worst_stage].terms_bytes
    return sum(terms.get(name, 0.0) for name in ("weights", "expert_weights", "fp8_weight_copies")) / GIB


def gather_s(result: Estimate) -> float:
    """The worst stage's data-parallel parameter all-gather per step, whole (before any overlap), seconds."""
    training, plans = result.training, PlanArrays.from_plans([result.plan])
    stage = np.full(1, result.worst_stage)
    _, gathered, _, _ = steptime.dp_traffic_s(result.model, result.cluster, plans, stage,
                                              training.overlap_grad_reduce, training.gradient_bytes_per_param,
                                              training.param_gather_bytes_by_zero)
    return float(gathered[0])


def row(label: str, off: Estimate, on: Estimate) -> str:
    return (f"{label:30s} {weight_gib(off):9.2f} {weight_gib(on):9.2f} {off.peak_memory_bytes / GIB:9.2f} "
            f"{on.peak_memory_bytes / GIB:9.2f} {gather_s(off):9.3f} {gather_s(on):9.3f} {off.step_time_s:8.3f} "
            f"{on.step_time_s:8.3f}")


def main() -> None:
    model = load_model(MODEL)
    header = (f"{'case':30s} {'weights':>9s} {'fp8 par':>9s} {'peak':>9s} {'fp8 par':>9s} {'gather s':>9s} "
              f"{'fp8 par':>9s} {'step s':>8s} {'fp8 par':>8s}")
    print(f"{MODEL} on 64 GPUs, {TP8.short()}, seq 8192, global batch 64: bf16 weights + TE's fp8 copies against "
          "fp8 parameters (GiB of the tightest stage; the DP parameter all-gather per step, before overlap)")
    print(header)
    for gpu, recipes in RECIPES.items():
        cluster = ClusterSpec(profile=load_profile(gpu), num_gpus=64)
        savings = []
        for recipe in recipes:
            off_training = TrainingSpec(seq_len=8192, global_batch_size=64, precision="fp8", fp8_recipe=recipe)
            off = estimate(model, cluster, off_training, TP8)
            on = estimate(model, cluster, dataclasses.replace(off_training, fp8_param_gather=True), TP8)
            print(row(f"{gpu} {recipe}", off, on))
            savings.append(f"{recipe}={(off.peak_memory_bytes - on.peak_memory_bytes) / GIB:.2f}GiB/"
                           f"{gather_s(on) / gather_s(off):.2f}x")
        print(f"fp8-params: {gpu} tp8 peak_saving/gather_ratio {' '.join(savings)}")

    cluster = ClusterSpec(profile=load_profile("gb200-186gb"), num_gpus=64)
    off = estimate(model, cluster, BRIDGE_TRAINING, BRIDGE_PLAN)
    on = estimate(model, cluster, dataclasses.replace(BRIDGE_TRAINING, fp8_param_gather=True), BRIDGE_PLAN)
    print()
    print(f"Megatron-Bridge llama3_70b_pretrain_64gpu_gb200_fp8mx_config's layout: {BRIDGE_PLAN.short()}, seq 8192, "
          f"global batch 256, MXFP8, bf16 gradients, TP comm and DP overlaps; limit "
          f"{cluster.memory_limit_bytes / GIB:.1f} GiB")
    print(header)
    print(row("gb200 mxfp8 (the recipe's)", off, on))
    print(f"fp8-params: gb200 bridge-recipe peak {off.peak_memory_bytes / GIB:.2f}->"
          f"{on.peak_memory_bytes / GIB:.2f}GiB fits {off.fits}->{on.fits} step {off.step_time_s:.3f}->{on.step_time_s:.3f}s")


if __name__ == "__main__":
    main()
