"""What an MoE layer spends besides dense GEMMs: grouped expert GEMMs, token permutation, the router's elementwise work.

Each function is one cost term; `costmodels.compute` calls them for the routed experts of an MoE layer.

Grouped expert GEMM (`grouped_gemm_time_s`), for TrainingSpec.expert_gemm = grouped: one kernel runs the local
experts' fc1 / fc2 (torchtitan's torch._grouped_mm, a CUTLASS grouped GEMM; DeepGEMM; Megatron-Core's legacy
GroupedMLP → the cutlass `grouped_gemm` package): G experts, each an m×k·k×n GEMM with m = the tokens routed to it.
(Megatron-Core's default path, TEGroupedMLP → Transformer Engine `GroupedLinear`, is a cuBLAS GEMM per expert over
TE's compute streams, `nvte_multi_stream_cublas_gemm`: expert_gemm = cublas, the dense curve per expert, priced in
costmodels.compute.) At small m every expert's weight matrix
is streamed from HBM for few FLOPs, so the kernel is bound by operand traffic, not by the tensor cores. Priced as a
roofline written as a sum of times, with the bytes itemised per group (DeepGEMM's own accounting,
`tests/test_core.py`: inputs m·k + k·n, output m·n):

    t = flops / (peak × peak_fraction) + G·(m·k + k·n + m·n)·element_bytes / (HBM bandwidth × grouped_hbm_efficiency)

Fitted (`grouped_peak_fraction`, `grouped_hbm_efficiency` in the profile's `compute.gemm_efficiency`) to DeepGEMM's
grouped contiguous and masked FP8 tables (shared/reference/microbench/gemm_fp8_deepgemm_h800.csv; H800 has the
H100 SXM tensor rate and HBM3): per-expert m from 256 to 8192. Carried to bf16 as follows: the memory-bound part
scales with the bytes (2-byte operands and output, at the same fraction of HBM bandwidth), the compute-bound part
with the bf16 curve's own measured limit (`peak_fraction`, cuBLAS / MAMF). The ratio of the two parts is then the
same in both precisions (twice the rate on half the bytes), so fp8 measurements say how far a bf16 grouped GEMM of
the same shape falls below its compute limit. Where bf16 grouped GEMMs themselves were measured, their compute
limit is fitted too (`grouped_bf16_peak_fraction`): on B200, torch._grouped_mm in bf16 runs at about 0.38 of the bf16
peak at thousands of rows per group (pytorch/ao's autograd-function benchmark,
benchmarks/microbench/grouped_mm_bf16_b200_torchao.csv), where cuBLAS reaches 0.80 on a dense GEMM. The dense curve
(`compute.gemm_efficiency`) stays what it was for every other GEMM; a profile without the two keys prices experts
with it, as before.

Weight-gradient accumulation (`grouped_wgrad_accumulation_bytes`): with Megatron's gradient-accumulation fusion
(default on), each expert's weight-gradient GEMM reads and writes its fp32 `main_grad`, 4 + 4 bytes per weight
element, where the sum above counted a 2-byte output: 6 more bytes per weight element per microbatch in the backward
of the grouped kernel. A cuBLAS GEMM per expert (TE `GroupedLinear(fuse_wgrad_accumulation=True)`, cuBLAS beta = 1)
is priced on the dense curve like every dense Linear, whose wgrad GEMM accumulates the same way
(costmodels.compute.moe_backward_extra_s).

Token permutation (`token_permutation_bytes`): Megatron-Core's alltoall dispatcher (`moe/token_dispatcher.py`
MoEAlltoAllTokenDispatcher, `moe/moe_utils.py` permute / unpermute / sort_chunks_by_idxs) copies each token top_k
times into expert order before the dispatch (`permute`: index_select, read + write of every copy), sums the copies
back after the combine (`unpermute`: a scatter-add that reads every copy and reads and writes its token's row, three
passes; megatron-core 0.19 calls it without probabilities, which the experts' activation applies,
`weighted_bias_swiglu_impl`), and, with several local experts behind an EP > 1 all-to-all, regroups the received tokens
by local expert after the dispatch and back before the combine (`sort_chunks_by_idxs`, read + write each way).
The backward runs the transposed copies (a gather's gradient is a scatter of the same bytes), once. Under DeepEP
(the flex dispatcher) DeepEP takes the tokens unpermuted, so only the received copies are permuted and unpermuted,
with no chunk sort (`token_permutation_bytes` of the received copies alone).

torchtitan's token movement (`torchtitan_token_movement_bytes`) is its own code's, not Megatron-Core's (torchtitan
models/moe/moe.py MoE.forward, models/moe/utils.py _permute / _unpermute, distributed/expert_parallel.py, as of
2026-01): the routed input gathered in expert order (`x[token_indices // top_k]`), with the weights applied first
where the model says so (score_before_experts: an fp32 round trip, eager even under torch.compile), the received
copies copied once more with a padding row (`torch.vstack`) and gathered into padded expert groups (`_permute`),
scattered back after the experts (`_unpermute`), scattered again into top_k slots per token (`torch.zeros`, index
assignment), and, without score_before_experts, upcast to fp32 (`.float()`) for the weighted sum `torch.bmm`
(written in fp32 and cast back per token). Its DeepEP path (distributed/deepep/deepep.py) receives a token once per
rank, gathers the copies per local expert (`index_select`), multiplies the weights in bf16, and sums the copies back
per received token (`scatter_add_` into zeros) before DeepEP's combine.

Router elementwise work (`router_bytes`): the h×E gating GEMM is a GEMM (compute.moe_mlp_gemms); after it the
fp32 logits (Megatron-Core `moe/router.py`, `moe_router_dtype` fp32) go through softmax (read + write), top-k (read),
and the load-balancing loss (`moe_utils.switch_load_balancing_loss_func`: a second softmax, read + write, and a
sum, read): 6 passes over T×E fp32 values.
"""

from __future__ import annotations

import numpy as np

from costmodels.hardware import HardwareProfile
from costmodels.specs import Precision

GROUPED_PARAMETERS = ("grouped_peak_fraction", "grouped_hbm_efficiency")
"""The profile keys of the grouped-GEMM roofline (in `compute.gemm_efficiency`)."""
GROUPED_BF16_PEAK_FRACTION = "grouped_bf16_peak_fraction"
"""Optional key: the compute-bound fraction of the bf16 peak, where bf16 grouped GEMMs were measured (module
docstring); without it a bf16 grouped GEMM takes the dense curve's `peak_fraction`."""

ELEMENT_BYTES = {Precision.BF16.value: 2.0, Precision.FP8.value: 1.0}
"""Operand bytes per element of a GEMM of that precision."""
OUTPUT_BYTES = 2.0
"""GEMM outputs are bf16 in both precisions (Transformer Engine FP8 GEMMs write bf16; DeepGEMM likewise)."""
WGRAD_ACCUMULATION_EXTRA_BYTES = 6.0
"""fp32 main_grad read (4) + write (4) in place of a bf16 output (2), per weight element."""
ACTIVATION_BYTES = 2.0
"""bf16 hidden states."""
ROUTER_PASSES = 6.0
"""softmax read + write, top-k read, aux-loss softmax read + write, its sum read (module docstring)."""
ROUTER_LOGIT_BYTES = 4.0
"""fp32 router logits."""


def has_grouped_curve(profile: HardwareProfile, precision: str = Precision.BF16.value) -> bool:
    """Whether the profile prices `precision` grouped GEMMs with the roofline (bf16 needs the HBM fraction only, fp8
    also its compute fraction); otherwise experts take the dense curve."""
    needed = GROUPED_PARAMETERS if precision == Precision.FP8.value else ("grouped_hbm_efficiency",)
    return all(name in profile.gemm_efficiency for name in needed)


def grouped_compute_fraction(profile: HardwareProfile, precision: str) -> float:
    """Fraction of the `precision` peak a grouped GEMM reaches when compute-bound: the fitted fp8 value, and for bf16
    the fitted bf16 value where bf16 grouped GEMMs were measured, else the bf16 curve's measured limit (module
    docstring)."""
    params = profile.gemm_efficiency
    if precision == Precision.FP8.value:
        return float(params["grouped_peak_fraction"])
    return float(params.get(GROUPED_BF16_PEAK_FRACTION, params["peak_fraction"]))


def grouped_gemm_bytes(flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                       precision: str) -> np.ndarray:
    """HBM bytes of a grouped GEMM: per group m·k + k·n operand and m·n output elements; groups = flops / 2mnk."""
    m, n, k = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k))
    groups = np.asarray(flops, dtype=float) / (2.0 * m * n * k)
    return groups * ((m * k + k * n) * ELEMENT_BYTES[precision] + m * n * OUTPUT_BYTES)


def grouped_gemm_time_s(profile: HardwareProfile, flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                        precision: str, clock_fraction: float = 1.0) -> np.ndarray:
    """Seconds of a grouped GEMM of `flops` in total over groups of shape (m, n, k): compute at the grouped compute
    fraction of the peak (× `clock_fraction`, the sustained clock of a training step; 1 as the microbenchmarks
    measured it) plus the itemised bytes at `grouped_hbm_efficiency` × HBM bandwidth."""
    compute_s = np.asarray(flops, dtype=float) / (profile.peak_flops_per_s[precision] * clock_fraction
                                                  * grouped_compute_fraction(profile, precision))
    memory_s = grouped_gemm_bytes(flops, m, n, k, precision) / grouped_hbm_bytes_per_s(profile)
    return compute_s + memory_s


def grouped_hbm_bytes_per_s(profile: HardwareProfile) -> float:
    return profile.hbm_bandwidth_bytes_per_s * float(profile.gemm_efficiency["grouped_hbm_efficiency"])


def grouped_wgrad_accumulation_bytes(flops: np.ndarray, m: np.ndarray, n: np.ndarray,
                                     k: np.ndarray) -> np.ndarray:
    """Extra backward bytes of accumulating a grouped GEMM's weight gradient into fp32 main_grad: 6 per weight."""
    m, n, k = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k))
    groups = np.asarray(flops, dtype=float) / (2.0 * m * n * k)
    return groups * k * n * WGRAD_ACCUMULATION_EXTRA_BYTES


def token_permutation_bytes(sent_copies: np.ndarray, received_copies: np.ndarray, hidden_size: int,
                            sorts_local_chunks: np.ndarray) -> np.ndarray:
    """Forward HBM bytes of the dispatcher's copies on one GPU: permute (read + write) and unpermute (scatter-add: read
    the copy, read and write its token's row) of the `sent_copies` = tokens × top_k rows it sends, and, where
    `sorts_local_chunks` (several local experts), sort_chunks_by_idxs after the dispatch and before the
    combine (read + write each) of the `received_copies` rows it holds; h bf16 values per row."""
    row_bytes = hidden_size * ACTIVATION_BYTES
    sent = (2.0 + 3.0) * sent_copies * row_bytes
    regrouped = np.where(sorts_local_chunks, 2.0 * 2.0 * received_copies * row_bytes, 0.0)
    return sent + regrouped


BF16_COPY_PASS_BYTES = 4.0
"""One pass over bf16 rows that reads and writes them (a gather, an index assignment, a bf16 multiply): 2 + 2 bytes
per element."""
TORCHTITAN_WEIGHTING_BYTES = 20.0
"""score_before_experts: `.to(float32)` (read 2, write 4), the multiply (read 4, write 4), `.to(x.dtype)` (read 4,
write 2). MoE.forward runs eager even under torch.compile: torchtitan's apply_compile compiles a MoE block's router,
reorderer, shared experts and expert GEMM function apart, not the module's own forward (models/llama4/infra/
parallelize.py, shared by qwen3 and deepseek_v3)."""
TORCHTITAN_FP32_COMBINE_BYTES = 10.0
"""Per copy element of the weighted sum: `.float()` (read 2, write 4) and `torch.bmm` reading the fp32 copy (4)."""
TORCHTITAN_FP32_TOKEN_BYTES = 10.0
"""Per token element of the weighted sum: bmm's fp32 output (4), read (4) and written back in bf16 (2)."""
SCATTER_ADD_BYTES = 6.0
"""`scatter_add_` per source element: read the source (2), read and write the destination (2 + 2)."""


def torchtitan_token_movement_bytes(sent_copies: np.ndarray, router_tokens: np.ndarray, received_copies: np.ndarray,
                                    received_tokens: np.ndarray, hidden_size: int, top_k: int, *,
                                    weights_first: bool, deepep: bool) -> np.ndarray:
    """Forward HBM bytes of torchtitan's copies of the routed tokens on one GPU (module docstring): `sent_copies` the
    rows it gathers in expert order and sends (its share of the router's tokens x top_k), `router_tokens` the
    tokens its router scored (every token of the micro-batch under TP: MoE.forward's unsort buffer and weighted sum
    cover them all), `received_copies` the rows its experts take, `received_tokens` the distinct tokens DeepEP
    delivers; `weights_first` the model's score_before_experts (MoESpec.router.probs_on_input); h bf16 values a
    row."""
    row = float(hidden_size)
    if deepep:
        return row * ((BF16_COPY_PASS_BYTES + BF16_COPY_PASS_BYTES + SCATTER_ADD_BYTES) * received_copies
                      + ACTIVATION_BYTES * received_tokens)
    router_copies = router_tokens * top_k
    weighting = TORCHTITAN_WEIGHTING_BYTES if weights_first else 0.0
    combine = ACTIVATION_BYTES * (router_copies + router_tokens) if weights_first \
        else TORCHTITAN_FP32_COMBINE_BYTES * router_copies + TORCHTITAN_FP32_TOKEN_BYTES * router_tokens
    unsort = ACTIVATION_BYTES * router_copies + BF16_COPY_PASS_BYTES * sent_copies   # zeros, index assignment
    padded_groups = 3.0 * BF16_COPY_PASS_BYTES * received_copies                     # vstack, gather, scatter back
    return row * ((BF16_COPY_PASS_BYTES + weighting) * sent_copies + padded_groups + unsort + combine)


def router_bytes(tokens: np.ndarray, num_experts: int) -> np.ndarray:
    """Forward HBM bytes of the router's softmax, top-k and load-balancing loss over T×E fp32 logits."""
    return ROUTER_PASSES * ROUTER_LOGIT_BYTES * np.asarray(tokens, dtype=float) * num_experts
