"""What each FP8 recipe costs on one layout: step time, its fp8 parts (casts, all-gathers, amax all-reduces), the
activation memory of a stage and Transformer Engine's fp8 copies of the weights, against bf16.

    python benchmarks/fp8_recipes.py

Llama 3.1 70B on 64 GPUs (tp 8 with SP, full recompute, distributed optimizer, seq 8192, global batch 64) on H100
and B200; mxfp8 runs on Blackwell only. Ends with one `fp8-recipes:` line per GPU. Model figures, not measurements:
what costmodels prices each recipe at (costmodels.compute.fp8_cast_bytes_per_element, steptime.tp_block_s,
memory.saved_linear_input_bytes, memory.fp8_weight_copies_bytes).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autopar.models import load_model  # noqa: E402
from costmodels import memory  # noqa: E402
from costmodels.hardware import load_profile  # noqa: E402
from costmodels.plan import Plan, PlanArrays  # noqa: E402
from costmodels.scoring import estimate  # noqa: E402
from costmodels.specs import ClusterSpec, TrainingSpec  # noqa: E402

MODEL = "llama-3.1-70b"
PLAN = Plan(tp=8, sp=True, mbs=1, recompute="full", zero=1)
NO_RECOMPUTE = Plan(tp=8, sp=True, mbs=1, zero=1)
GPUS = {"h100-80gb": ("delayed", "tensorwise", "blockwise"), "b200-180gb": ("delayed", "tensorwise", "blockwise",
                                                                           "mxfp8")}


def main() -> None:
    model = load_model(MODEL)
    print(f"{MODEL} on 64 GPUs, {PLAN.short()}, seq 8192, global batch 64; activations: {NO_RECOMPUTE.short()}, "
          "first stage, one micro-batch in flight")
    print(f"{'gpu':12s} {'precision':18s} {'step s':>8s} {'compute s':>10s} {'tp_comm s':>10s} "
          f"{'activations GiB':>16s} {'fp8 weights GiB':>16s} {'step/bf16':>9s}")
    for gpu, recipes in GPUS.items():
        cluster = ClusterSpec(profile=load_profile(gpu), num_gpus=64)
        rows = [("bf16", TrainingSpec(seq_len=8192, global_batch_size=64))]
        rows += [(f"fp8 {recipe}", TrainingSpec(seq_len=8192, global_batch_size=64, precision="fp8",
                                                fp8_recipe=recipe)) for recipe in recipes]
        results = {}
        for label, training in rows:
            result = estimate(model, cluster, training, PLAN)
            terms = memory.memory_terms_bytes(model, cluster, training, PlanArrays.from_plans([NO_RECOMPUTE]), 0,
                                              only=("layer_activations", "fp8_weight_copies"))
            activations = float(terms["layer_activations"][0])
            weight_copies = float(terms.get("fp8_weight_copies", [0.0])[0])
            results[label] = (result.step_time_s, activations)
            step_vs = result.step_time_s / results["bf16"][0]
            print(f"{gpu:12s} {label:18s} {result.step_time_s:8.3f} {result.time_terms_s['compute']:10.3f} "
                  f"{result.time_terms_s['tp_comm']:10.3f} {activations / 2**30:16.2f} {weight_copies / 2**30:16.2f} "
                  f"{step_vs:7.2f}x")
        bf16_step, bf16_act = results["bf16"]
        parts = " ".join(f"{label.split()[1]}={bf16_step / step:.2f}x/{1 - act / bf16_act:.1%}"
                         for label, (step, act) in results.items() if label != "bf16")
        print(f"fp8-recipes: {gpu} speedup/activation_saving {parts}")


if __name__ == "__main__":
    main()
