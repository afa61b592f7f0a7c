"""What reducing the gradients in bf16 (`--grad-reduce-in-bf16`, TrainingSpec.grad_reduce_in_fp32 off) changes on a
few layouts, and on the front: step time, the data-parallel and optimizer terms, gradient memory and the peak.

    python benchmarks/grad_reduce_dtype.py

Layouts on H100 (64 GPUs, seq 4096, global batch 256, no overlap switches, so the data-parallel reduce is exposed as
Megatron-LM runs it by default): Llama 3.1 8B with tp 1 and the distributed optimizer (data parallel 64 across 8
nodes), Llama 3.1 70B with tp 8, pp 2, and Mixtral 8x7B with ep 8. Then the fastest point of each front and the
front's smallest peak. Model figures, not measurements: what costmodels prices (steptime.dp_comm_s,
steptime.optimizer_s with BF16_GRAD_COPY_BYTES_PER_PARAM, memory.gradients_bytes). Ends with one
`grad-reduce-dtype:` line.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autopar.models import load_model  # noqa: E402
from autopar.search.solve import solve  # noqa: E402
from costmodels.hardware import load_profile  # noqa: E402
from costmodels.plan import Plan  # noqa: E402
from costmodels.scoring import estimate  # noqa: E402
from costmodels.specs import ClusterSpec, TrainingSpec  # noqa: E402

GIB = 2**30
CASES = (("llama-3.1-8b", Plan(tp=1, mbs=1, zero=1, recompute="selective")),
         ("llama-3.1-70b", Plan(tp=8, pp=2, sp=True, mbs=1, zero=1, recompute="full")),
         ("mixtral-8x7b", Plan(tp=1, ep=8, etp=1, mbs=1, zero=1, recompute="full")))
FP32 = TrainingSpec(seq_len=4096, global_batch_size=256)
BF16 = dataclasses.replace(FP32, grad_reduce_in_fp32=False)
GRADIENT_TERMS = ("gradients", "embedding_gradients", "expert_gradients", "zero_gradient_buckets")


def main() -> None:
    cluster = ClusterSpec(profile=load_profile("h100-80gb"), num_gpus=64)
    print(f"{'model':14s} {'plan':26s} {'grads':5s} {'step s':>8s} {'dp_comm s':>10s} {'optimizer s':>12s} "
          f"{'gradients GiB':>14s} {'peak GiB':>9s}")
    speedups = []
    for name, plan in CASES:
        model = load_model(name)
        steps = {}
        for label, training in (("fp32", FP32), ("bf16", BF16)):
            result = estimate(model, cluster, training, plan)
            worst = result.stages[result.worst_stage].terms_bytes
            gradients = sum(worst.get(term, 0.0) for term in GRADIENT_TERMS)
            steps[label] = result.step_time_s
            print(f"{name:14s} {plan.short():26s} {label:5s} {result.step_time_s:8.3f} "
                  f"{result.time_terms_s['dp_comm']:10.3f} {result.time_terms_s['optimizer']:12.4f} "
                  f"{gradients / GIB:14.2f} {result.peak_memory_bytes / GIB:9.2f}")
        speedups.append(f"{name}={steps['fp32'] / steps['bf16']:.3f}x")
    print()
    print(f"{'model':14s} {'grads':5s} {'fastest plan':30s} {'step s':>8s} {'smallest peak GiB':>18s} {'points':>6s}")
    fronts = []
    for name, _ in CASES:
        model = load_model(name)
        best = {}
        for label, training in (("fp32", FP32), ("bf16", BF16)):
            points = solve(model, cluster, training).points
            best[label] = points[0].step_time_s
            print(f"{name:14s} {label:5s} {points[0].plan.short():30s} {points[0].step_time_s:8.3f} "
                  f"{min(p.peak_memory_bytes for p in points) / GIB:18.2f} {len(points):6d}")
        fronts.append(f"{name}={best['fp32'] / best['bf16']:.3f}x")
    print(f"grad-reduce-dtype: layout_speedup {' '.join(speedups)} front_speedup {' '.join(fronts)}")


if __name__ == "__main__":
    main()
