"""Fixed per-kernel cost: the host-side launch floor of a layer, and FP8's cast traffic.

A GPU runs a layer's kernels back to back only as fast as the host launches them. Eager PyTorch (Megatron-Core,
torchtitan and llm-foundry all launch from Python) spends a roughly constant host time per operator on dispatch and
`cudaLaunchKernel`; when a layer's kernels are shorter than that, the layer takes kernels × launch time, not its
GPU time (small hidden sizes, small micro-batches, high TP). Launches are asynchronous, so the two do not add up:
a layer's forward takes max(GPU time, launch floor).

KERNEL_LAUNCH_S is fitted from shared/reference/microbench/launch_overhead_small_gemm_dgxc_sample.csv (NVIDIA
dgxc-benchmarking `microbenchmarks/cpu_overhead`: back-to-back torch.matmul on tiny matrices, no sync in the loop, so
wall time / op is the per-op host dispatch + launch throughput): the median of its eight sizes, 12.96 µs
(`fit_kernel_launch_s`, checked against the file by tests/test_overheads.py). The GPU of that sample is not stated;
host dispatch cost depends on the CPU and PyTorch build, not on the GPU, so one value serves every profile.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

KERNEL_LAUNCH_S = 12.96e-6
"""Host dispatch + launch per eager PyTorch operator (median of the dgxc cpu_overhead sample; see module docstring)."""

LAUNCH_SOURCE = "launch_overhead_small_gemm_dgxc_sample.csv"

DENSE_LAYER_FORWARD_KERNELS = 12
"""Kernels in one Megatron-Core transformer layer's forward with Transformer Engine (transformer_layer.py,
attention.py, mlp.py): input layernorm, fused QKV GEMM, RoPE on q and k (2), fused attention, output-projection GEMM,
bias-dropout-add, pre-MLP layernorm, FC1 GEMM, activation (bias-GELU / SwiGLU fusion), FC2 GEMM, bias-dropout-add.
TP/SP collectives run on their own stream and are priced as communication. The backward launches about twice as
many (two GEMMs per forward GEMM, a backward kernel per elementwise op): stage_compute_s scales by
BACKWARD_TO_FORWARD as for the GPU time."""

MOE_LAYER_EXTRA_FORWARD_KERNELS = 8
"""A MoE layer's MLP beyond the dense one (Megatron-Core moe/router.py, token_dispatcher.py, experts.py with
TEGroupedMLP): router GEMM, softmax/top-k, aux-loss, permute, all-to-all bookkeeping (2), unpermute, one more
grouped GEMM launch; the all-to-alls themselves are communication."""


def layer_launch_floor_s(moe_layer: bool) -> float:
    """Least time one layer's forward can take: its kernel launches."""
    kernels = DENSE_LAYER_FORWARD_KERNELS + (MOE_LAYER_EXTRA_FORWARD_KERNELS if moe_layer else 0)
    return kernels * KERNEL_LAUNCH_S


def fit_kernel_launch_s(microbench_dir: Path) -> float:
    """Median per-op time (s) of the launch-overhead sample: the value KERNEL_LAUNCH_S holds."""
    with open(microbench_dir / LAUNCH_SOURCE, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    return statistics.median(float(r["avg_time_per_op_us"]) for r in rows) * 1e-6
