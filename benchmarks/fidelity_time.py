"""Fidelity of the step-time model against published training runs on A100-80GB (shared/reference/).

- Narayanan et al. 2021 (arXiv 2104.04473) Table 1: achieved TFLOP/s per GPU. The paper counts FLOPs with its eq. 3,
  96·B·s·l·h²·(1 + s/6h + V/16lh) (full recompute, non-causal attention), so the predicted step time is converted to
  TFLOP/s with that same formula before comparing. The table gives neither micro-batch size nor the interleaving;
  both are taken from the paper's own launch script, Megatron-LM `examples/sc21/run_table_1.sh` (MBS and
  --num-layers-per-virtual-pipeline-stage per model size) — run inputs, not fitted values.
- Korthikanti et al. 2022 (arXiv 2205.05198) Table 5: iteration time with full recompute (no SP) and with
  SP + selective recompute, and the MFU of the latter, which the paper computes as
  72·B·s·l·h²·(1 + s/6h + V/12lh) / (time · GPUs · 312 TFLOP/s).

Models are GPT as in both papers: 4h GELU MLP, LayerNorm, linear biases, learned positions (2048), vocab 51200,
tied embeddings; bf16, Megatron of 2021–22 (no distributed optimizer, no flash attention). Only global profile
parameters are used: no per-row or per-model terms.

    python benchmarks/fidelity_time.py [--profile a100-80gb]
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from costmodels.hardware import HardwareProfile, load_profile
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import (ClusterSpec, CrossEntropyKernel, MlpKind, ModelSpec, NormKind, PositionEmbedding,
                              TrainingSpec)
from costmodels.steptime import step_time_s

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable
from benchmarks.reference import reference_dir  # noqa: E402

A100_PEAK_TFLOPS = 312.0
SEQ_LEN = 2048
VOCAB = 51200

# Megatron-LM examples/sc21/run_table_1.sh: (MBS, layers per virtual stage or None) by model size (params_billion)
SC21_TABLE1_LAUNCH = {
    1.7: (16, None), 3.6: (16, None), 7.5: (16, None), 18.4: (8, None), 39.1: (4, None),
    76.1: (2, 5), 145.6: (2, 5), 310.1: (1, 3), 529.6: (1, 1), 1008.0: (1, None),
}
# the same script's --DDP-impl: `torch` (PyTorch DDP, gradient all-reduce overlapped with the backward pass, bucket by
# bucket) for 1.7B-18B, `local` (Megatron's own DDP, all-reduce after the backward) from 39B on
SC21_TABLE1_TORCH_DDP = {1.7, 3.6, 7.5, 18.4}


def _read_csv(name: str) -> list[dict[str, str]]:
    with open(reference_dir() / name, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def gpt_model(name: str, hidden: int, layers: int, heads: int) -> ModelSpec:
    """A Megatron GPT of the papers' shape."""
    return ModelSpec(name=name, hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
                     ffn_hidden_size=4 * hidden, vocab_size=VOCAB, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                     position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=SEQ_LEN,
                     tied_embeddings=True, linear_bias=True)


@dataclass(frozen=True)
class FidelityRow:
    source: str
    label: str
    metric: str
    published: float
    predicted: float
    step_time_s: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.published) / self.published


def _predict_time_s(profile: HardwareProfile, model: ModelSpec, num_gpus: int, gbs: int, plan: Plan,
                    overlap_grad_reduce: bool = False) -> float:
    cluster = ClusterSpec(profile=profile, num_gpus=num_gpus, gpus_per_node=8)
    # the 2021-22 Megatron-LM stack: no flash attention, no fused cross entropy, no P2P overlap (none existed yet;
    # the interleaved schedule waited on every batched isend/irecv), the pipeline's scatter/gather without SP
    training = TrainingSpec(seq_len=SEQ_LEN, global_batch_size=gbs, flash_attention=False,
                            cross_entropy=CrossEntropyKernel.UNFUSED, overlap_grad_reduce=overlap_grad_reduce,
                            overlap_p2p_comm=False, p2p_scatter_gather=True)
    return float(step_time_s(model, cluster, training, PlanArrays.from_plans([plan]))[0])


def megatron_table1_rows(profile: HardwareProfile) -> list[FidelityRow]:
    rows = []
    for r in _read_csv("megatron_2104.04473_table1.csv"):
        size = float(r["params_billion"])
        h, l, a = int(r["hidden_size"]), int(r["num_layers"]), int(r["attention_heads"])
        tp, pp, gpus, gbs = int(r["tp"]), int(r["pp"]), int(r["num_gpus"]), int(r["global_batch_size"])
        mbs, layers_per_chunk = SC21_TABLE1_LAUNCH[size]
        vpp = l // pp // layers_per_chunk if layers_per_chunk else 1
        plan = Plan(tp=tp, pp=pp, vpp=vpp, mbs=mbs, recompute=Recompute.FULL)
        time_s = _predict_time_s(profile, gpt_model(f"gpt-{size}b", h, l, a), gpus, gbs, plan,
                                 overlap_grad_reduce=size in SC21_TABLE1_TORCH_DDP)
        eq3_flops = 96.0 * gbs * SEQ_LEN * l * h * h * (1 + SEQ_LEN / (6 * h) + VOCAB / (16 * l * h))
        rows.append(FidelityRow("megatron-2104.04473", f"{size}B {plan.short()}", "TFLOP/s/GPU",
                                float(r["tflops_per_gpu"]), eq3_flops / time_s / gpus / 1e12, time_s))
    return rows


def korthikanti_rows(profile: HardwareProfile) -> list[FidelityRow]:
    rows = []
    for r in _read_csv("korthikanti_2205.05198.csv"):
        h, l, a = int(r["hidden_size"]), int(r["num_layers"]), int(r["attention_heads"])
        tp, pp, gpus, gbs = int(r["tp"]), int(r["pp"]), int(r["num_gpus"]), int(r["global_batch_size"])
        model = gpt_model(r["model"], h, l, a)
        common = dict(tp=tp, pp=pp, vpp=int(r["interleave"]), mbs=int(r["micro_batch_size"]))
        full = Plan(**common, recompute=Recompute.FULL)
        selective = Plan(**common, sp=True, recompute=Recompute.SELECTIVE)
        full_s = _predict_time_s(profile, model, gpus, gbs, full)
        selective_s = _predict_time_s(profile, model, gpus, gbs, selective)
        model_flops = 72.0 * gbs * SEQ_LEN * l * h * h * (1 + SEQ_LEN / (6 * h) + VOCAB / (12 * l * h))
        label = f"{r['model']} tp{tp} pp{pp}"
        rows.append(FidelityRow("korthikanti-2205.05198", f"{label} full", "iter s",
                                float(r["iter_s_full_recompute"]), full_s, full_s))
        rows.append(FidelityRow("korthikanti-2205.05198", f"{label} sp+sel", "iter s",
                                float(r["iter_s_sp_selective"]), selective_s, selective_s))
        rows.append(FidelityRow("korthikanti-2205.05198", f"{label} sp+sel", "MFU %", float(r["mfu"]),
                                100.0 * model_flops / (selective_s * gpus * A100_PEAK_TFLOPS * 1e12), selective_s))
    return rows


def fidelity_time_rows(profile: "HardwareProfile | str" = "a100-80gb") -> list[FidelityRow]:
    """Predicted vs published for every reference row (the same rows benchmarks/fit_profiles.py fits to)."""
    if isinstance(profile, str):
        profile = load_profile(profile)
    return megatron_table1_rows(profile) + korthikanti_rows(profile)


def summary(rows: list[FidelityRow]) -> tuple[float, float]:
    errors = [abs(r.error_pct) for r in rows]
    return sum(errors) / len(errors), max(errors)


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="a100-80gb", help="bundled profile name or YAML path")
    args = parser.parse_args(argv)
    rows = fidelity_time_rows(args.profile)
    print(f"{'source':<24} {'row':<34} {'metric':<12} {'published':>10} {'predicted':>10} {'err %':>7} "
          f"{'step s':>8}")
    for r in rows:
        print(f"{r.source:<24} {r.label:<34} {r.metric:<12} {r.published:>10.2f} {r.predicted:>10.2f} "
              f"{r.error_pct:>+7.2f} {r.step_time_s:>8.2f}")
    korthikanti = [r for r in rows if r.source.startswith("korthikanti") and r.metric == "iter s"]
    k_mean, k_max = summary(korthikanti)
    print(f"korthikanti iteration times only: mean_err={k_mean:.2f}% max_err={k_max:.2f}% rows={len(korthikanti)}")
    mean, worst = summary(rows)
    print(f"fidelity-time: mean_err={mean:.2f}% max_err={worst:.2f}% rows={len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
