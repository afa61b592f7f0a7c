"""Compute: FLOPs of every GEMM a plan runs, the GEMM efficiency its shapes get, and the resulting seconds.

Everything here is per GPU and per microbatch on one pipeline stage, vectorised over `PlanArrays`.

FLOP counting (forward pass, one sequence of s tokens; backward = 2 × forward, the dgrad and wgrad GEMMs):
- every linear layer of shape (in, out) costs 2·s·in·out (Narayanan et al., arXiv 2104.04473, appendix
  "FLOP calculations"); Megatron-LM `megatron/training/training.py::num_floating_point_operations` counts the same.
- attention scores Q·Kᵀ and scores·V: 2·s²·a·d_qk + 2·s²·a·d_v non-causal; with the causal mask only half the
  matrix is computed ("Only half of the attention matrix is non-zero", num_floating_point_operations), so
  s²·a·(d_qk + d_v) per sequence per layer forward, i.e. 6·s·q per token per layer over fwd+bwd for MHA/GQA.
- MoE: each token runs top_k routed experts plus the shared experts; the router is an h×E GEMM
  (Megatron-Core `moe/router.py`; num_floating_point_operations counts top_k and the shared expert width).
- MTP (DeepSeek-V3, arXiv 2412.19437 §2.2): per module an eh_proj 2h→h GEMM, one decoder layer and the shared
  output head again.
- recompute (Korthikanti et al., arXiv 2205.05198 §4): selective re-runs the attention core forward; full re-runs
  the whole layer forward (Megatron block method: `recompute_layers` layers of each virtual chunk).

GEMM efficiency (the fraction of the dense peak a GEMM of shape m×k·k×n reaches), documented curve:

    efficiency(m, n, k) = peak_fraction / (1 + smooth_max((half_saturation_dim / 3) · (1/m + 1/n + 1/k),
                                                      peak_fraction · peak · kernel_floor / (concurrent · 2mnk)))

It is the roofline of one GEMM written as a sum of times: 2mnk FLOPs at peak_fraction × peak, plus what the kernel
spends beyond them, the larger of two readings of it (smoothly: OVERHEAD_NORM). `half_saturation_dim` prices the
operand traffic 2(mk + kn + mn) bytes at HBM speed, whose ratio to the FLOPs is (1/m + 1/n + 1/k), with tile
quantisation and the main loop's prologue and epilogue: a square GEMM of side `half_saturation_dim` runs at half of
`peak_fraction`. `kernel_floor_us` is the least a GEMM kernel spends beyond its work (its start on the SMs, a first
wave that does not fill them, the last wave's drain), once per kernel: GEMMs run as one batched kernel (the unfused
attention core over every head) or on parallel streams (Transformer Engine's per-expert GEMMs, TE_COMPUTE_STREAMS)
share it (Gemm.concurrent). The roll-off is fitted to the GEMMs of 50 µs of math and more; below that the floor is
the larger and most of a GEMM's time: the cuBLAS sweeps time each call between CUDA events after a 256 MB flush that
keeps the GPU busy while the host enqueues it (kernel times, not launches; the host's launch is costmodels.host's),
and measure a 1024³ GEMM at 121 TFLOP/s on H100, 12% of the peak, where the roll-off alone gives 44%. The floor is
fitted to the sweeps' GEMMs under 5 µs of math with the rest of the curve held (benchmarks/fit_microbench.py). The
curve is symmetric in (m, n, k), so the forward GEMM and its two backward GEMMs (same three dimensions, permuted) get
the same efficiency. fp8 GEMMs use `fp8_peak_fraction` of the fp8 peak and, where the profile has it, their own
`fp8_half_saturation_dim` (fp8 runs at twice the bf16 rate on operands of half the bytes, so its roofline knee sits
at another side; fitted from DeepGEMM's FP8 shapes), and the same kernel floor (profiles without fp8 refuse it); the
attention core (softmax, scores, values) always runs in bf16 (Transformer Engine keeps fused
attention in bf16). Unfused, it uses the GEMM curve with its (s/cp) × (s/cp) × head_dim shape; a fused kernel
(TrainingSpec.attention_kernel: FlashAttention-2, FlashAttention-3 or cuDNN) has its own measured curve per pass
(attention_efficiency), the backward's 2.5× FLOPs priced at the backward's own rate.

Routed experts (`Gemm.grouped`, flops / 2mnk GEMMs of one expert's shape) run the way TrainingSpec.expert_gemm says:
a cuBLAS GEMM per expert (Megatron-Core with Transformer Engine, whose grouped GEMM is a multi-stream loop of cuBLAS
calls), each on the dense curve at its own shape, or one grouped kernel (torchtitan's torch._grouped_mm), priced
with the grouped-GEMM roofline of `costmodels.moe_kernels` (fitted to DeepGEMM's grouped tables) where the profile
has it; either way with the dispatcher's permutation and router passes and the experts' activation function at HBM
bandwidth, each on its own bytes (kernels itemised, not the fitted elementwise factor below). The grouped kernel
adds its fp32 weight-gradient accumulation to the roofline's bytes; a cuBLAS GEMM per expert accumulates into
main_grad exactly as every dense Linear does (Megatron's gradient-accumulation fusion, cuBLAS beta = 1), and is
priced like them on the dense curve.

Memory-bound work (layernorm, bias, GELU/SwiGLU, dropout, residual adds, softmax when not fused) is priced as HBM
traffic: `traffic_per_activation_byte` (profile section `elementwise:`) × the activation bytes Korthikanti et al.
itemise per layer / HBM bandwidth (see `elementwise_bytes_per_layer`). A layer's forward time is the sum of its GEMM
times and this traffic time; the backward is 2 × the forward. The factor was fitted on dense layers; the kernels
an MoE layer adds (permutation, router passes, the routed experts' activation) are itemised and priced at their own
bytes instead (`moe_dispatch_bytes`, `routed_expert_activation_bytes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from costmodels import engines, moe_kernels
from costmodels.comm import expected_destinations
from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile
from costmodels.params import padded_vocab_size
from costmodels.plan import PlanArrays, Recompute, RecomputeModule, layers_on_stage, recomputes_module
from costmodels.specs import (CrossEntropyKernel, Engine, ExpertGemm, Fp8Recipe, LaunchPath, MlpKind, ModelSpec,
                              MoEDispatcher, Precision, TrainingSpec, fp8_copy_bytes_per_element)

BACKWARD_TO_FORWARD = 2.0
"""Backward runs two GEMMs (data gradient and weight gradient) per forward GEMM (arXiv 2104.04473, appendix)."""
FLASH_CORE_BACKWARD_TO_FORWARD = 2.5
"""A fused (flash) attention backward recomputes the scores S = QKᵀ from Q and K (it never stored them) and then
runs dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q: five matmuls against the forward's two, 2.5× the forward FLOPs
(Dao, FlashAttention-2, arXiv 2307.08691 §3.1 and Algorithm 2). The unfused path stores P and runs four (2×)."""


def attention_core_backward_to_forward(training: TrainingSpec) -> float:
    return FLASH_CORE_BACKWARD_TO_FORWARD if training.flash_attention else BACKWARD_TO_FORWARD


# ---- GEMM efficiency -----------------------------------------------------------------------------------------

def gemm_efficiency(profile: HardwareProfile, m: "np.ndarray | float", n: "np.ndarray | float",
                    k: "np.ndarray | float", precision: str = "bf16",
                    concurrent: "np.ndarray | float" = 1.0) -> np.ndarray:
    """Fraction of the dense peak (of `precision`) reached by an m×k·k×n GEMM, `concurrent` of them sharing one
    kernel floor (Gemm.concurrent); curve in the module docstring."""
    params = profile.gemm_efficiency
    half_saturation_dim = params["half_saturation_dim"]
    if precision == Precision.FP8.value:
        if not profile.supports("fp8") or "fp8_peak_fraction" not in params:
            raise InputError("precision", f"{profile.name} has no fp8 GEMM rate in its profile; use bf16")
        peak_fraction = params["fp8_peak_fraction"]
        half_saturation_dim = params.get("fp8_half_saturation_dim", half_saturation_dim)
    else:
        peak_fraction = params["peak_fraction"]
    m, n, k = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k))
    floor = peak_fraction * profile.peak_flops_per_s[precision] * kernel_floor_s(profile) / (
        np.asarray(concurrent, dtype=float) * 2.0 * m * n * k)
    roll_off = half_saturation_dim / 3.0 * (1.0 / m + 1.0 / n + 1.0 / k)
    return peak_fraction / (1.0 + (roll_off ** OVERHEAD_NORM + floor ** OVERHEAD_NORM) ** (1.0 / OVERHEAD_NORM))


KERNEL_FLOOR_US = "kernel_floor_us"
"""Profile key (compute.gemm_efficiency): the GPU time a GEMM kernel takes beyond its work, µs (module docstring).
Absent: none."""

TE_COMPUTE_STREAMS = 4
"""Streams Transformer Engine spreads a GroupedLinear's per-expert cuBLAS GEMMs over (nvte_multi_stream_cublas_gemm;
transformer_engine/common/util/multi_stream.h, num_compute_streams = 4): up to four experts' kernels at once."""


OVERHEAD_NORM = 4.0
"""The larger of the roll-off and the floor, taken smoothly: (a⁴ + b⁴)^¼ is the larger within 19% where they are
equal and within 1% once one is twice the other, and a least-squares fit has a slope on both (a plain max has none
on the smaller, and a fit of the curve stalls where the floor binds)."""


def kernel_floor_s(profile: HardwareProfile) -> float:
    """A GEMM kernel's fixed time on the GPU (profile `kernel_floor_us`; 0 where absent)."""
    return float(profile.gemm_efficiency.get(KERNEL_FLOOR_US, 0.0)) * 1e-6


ATTENTION_PARAMETERS = ("attention_peak_fraction", "attention_half_saturation_seq")
"""A fused attention curve over forward + backward with no kernel named (profiles calibrated before the kernels were
told apart, a user's `autopar calibrate` rows without a kernel); the bundled profiles have one curve per kernel and
pass instead (attention_curve_parameters). A profile with neither prices the core with the GEMM curve."""

ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "fa1", "fa_triton")
"""Fused attention kernels with their own measured curves: FlashAttention-2 (Dao, arXiv 2307.08691; the flash_attn
package and PyTorch SDPA's flash backend), FlashAttention-3 (Shah et al., arXiv 2407.08608; Hopper only) and cuDNN
fused attention (Transformer Engine's FusedAttention, PyTorch SDPA's cuDNN backend); and the two kernels
FlashAttention-2 replaced, FlashAttention (v1) and FlashAttention in Triton, whose A100 curves are FlashAttention-2's
at the rate ratios its paper measured (benchmarks/microbench_tables.py FA2_SPEEDUP)."""
ATTENTION_PASSES = ("fwd", "bwd")


def attention_curve_parameters(kernel: str, attention_pass: str) -> tuple[str, str]:
    """Profile keys (compute.gemm_efficiency) of one kernel's curve in one pass."""
    return (f"attention_{kernel}_{attention_pass}_peak_fraction",
            f"attention_{kernel}_{attention_pass}_half_saturation_seq")


def attention_dispatch_parameter(kernel: str, attention_pass: str) -> str:
    """Profile key (compute.gemm_efficiency, microseconds) of the host dispatch that the benchmark a curve was fitted
    to timed with each call of `kernel` in `attention_pass` (benchmarks/microbench_tables.py SDPA_HARNESS_DISPATCH).
    A record of the fit, not a cost: a training step queues every kernel behind the previous ones, so the GPU never
    waits for one call's dispatch (where the host does set the pace, costmodels.host_timeline prices it)."""
    return f"attention_{kernel}_{attention_pass}_harness_dispatch_us"


def attention_kernels_of(profile: HardwareProfile) -> tuple[str, ...]:
    """The kernels whose forward and backward curves the profile holds."""
    return tuple(kernel for kernel in ATTENTION_KERNELS
                 if all(name in profile.gemm_efficiency for attention_pass in ATTENTION_PASSES
                        for name in attention_curve_parameters(kernel, attention_pass)))


def resolve_attention_kernel(profile: HardwareProfile, training: TrainingSpec) -> str:
    """The kernel the core runs on this GPU: the one named, or for `auto` the one Transformer Engine picks
    (Megatron-Core's default --attention-backend auto lets TE choose): FusedAttention (cuDNN) on Hopper and later
    ("Disabling FlashAttention to give FusedAttention preference on Hopper+ for performance reasons",
    TE `pytorch/attention/dot_product_attention/utils.py::get_attention_backend`), FlashAttention-2 on Ampere, where
    that preference does not apply. A profile says which it is by the curves it has: cuDNN where measured or
    extrapolated (H100, H200, B200), FlashAttention-2 only on A100. '' = the profile has no per-kernel curves
    (the kernel-less curve or the GEMM curve prices the core). InputError for a kernel the profile has no curve for
    (FlashAttention-3 runs on sm90 only: TE "Disabling FlashAttention 3 for compute capability != sm90")."""
    available = attention_kernels_of(profile)
    kernel = training.attention_kernel.value
    if not available:
        return ""
    if kernel == "auto":
        return next(k for k in ("cudnn", "fa2", *available) if k in available)
    if kernel not in available:
        raise InputError("attention_kernel", f"{profile.display_name} has no {kernel} attention curve (measured or "
                                             f"extrapolated); use one of {', '.join(('auto', *available))}")
    return kernel


def attention_kernel_runs(profile: HardwareProfile, training: TrainingSpec) -> str:
    """What the cost model prices the attention core as, for headers and documents: the resolved kernel, 'unfused'
    without flash attention, 'fused' for a profile without per-kernel curves."""
    if not training.flash_attention:
        return "unfused"
    return resolve_attention_kernel(profile, training) or "fused"


MMA_SYNC_KERNELS = ("fa1", "fa2", "fa_triton")
"""Kernels that issue Ampere's synchronous mma.sync on every GPU (FlashAttention-3 paper, arXiv 2407.08608:
FlashAttention-2 does not use Hopper's wgmma, 'achieving only 35% utilization on the H100'; the Triton kernel and
FlashAttention v1 predate it too): their matmuls run at Ampere's rate per SM per clock whatever the GPU."""
MMA_SYNC_BF16_FLOPS_PER_CLOCK_PER_SM = 2048.0
"""mma.sync's dense bf16 rate: 1024 FMA per SM per clock (NVIDIA A100 Tensor Core GPU Architecture whitepaper)."""
MEASURED_HEAD_DIM = 128.0
"""Head dimension of every attention benchmark the bundled curves are fitted to (microbench README; the cuDNN
frontend's dsv3 rows have 192/128, above it)."""


def attention_head_dim_factor(profile: HardwareProfile, kernel: str, attention_pass: str,
                              head_dim: "np.ndarray | float") -> np.ndarray:
    """A fused attention kernel's rate at head dimension d over its rate at MEASURED_HEAD_DIM, where d is smaller.

    Per score element a pass runs F·d matmul FLOPs (forward QKᵀ and PV: 4d; backward 2.5× that,
    FLASH_CORE_BACKWARD_TO_FORWARD) and one exponential on the special-function units (the forward's softmax; the
    backward recomputes P = exp(S - L) once), whose rate does not grow with the tensor cores: 16 per SM per clock
    against 2048 (A100), 4096 (H100) or 8192 (B200) bf16 FLOPs ('H100 SXM5 has 989 TFLOPS of FP16 matmul but only
    3.9 TFLOPS of special functions ... for head dimension 128, there are 512x more matmul FLOPS than exponential,
    which means that exponential can take 50% of the cycle time compared to matmul', FlashAttention-3 paper,
    arXiv 2407.08608 §3.1; on B200 the exponential unit 'remained at 16 ops/clock/SM' against 8192 MMA,
    FlashAttention-4, arXiv 2603.05451). With c = the kernel's matmul FLOPs per SM per clock / exponentials per SM
    per clock (mma.sync kernels at Ampere's rate, MMA_SYNC_KERNELS; the others at the GPU's native rate), a score
    element costs F·d/mma + 1/exp = (F·d/mma)·(1 + c/(F·d)): the matmul share of the time, and so the kernel's
    FLOP rate, falls as d shrinks:

        factor = (1 + c / (F·128)) / (1 + c / (F·d)),  at most 1

    (A100 FlashAttention-2, d = 64: 0.83 forward, 0.92 backward; B200 cuDNN: 0.67 forward). The measured curves
    carry the d = 128 share already; above 128 (MLA's 192) other limits (registers, tile shapes) set in that no
    benchmark here measures, so the curve stands. 1 for a profile that does not state both rates."""
    if not profile.bf16_flops_per_clock_per_sm or not profile.exp2_per_clock_per_sm:
        return np.ones(np.shape(head_dim))
    mma = MMA_SYNC_BF16_FLOPS_PER_CLOCK_PER_SM if kernel in MMA_SYNC_KERNELS else profile.bf16_flops_per_clock_per_sm
    c = mma / profile.exp2_per_clock_per_sm
    flops_per_dim = 4.0 * (FLASH_CORE_BACKWARD_TO_FORWARD if attention_pass == "bwd" else 1.0)
    d = np.maximum(np.asarray(head_dim, dtype=float), 1.0)
    factor = (1.0 + c / (flops_per_dim * MEASURED_HEAD_DIM)) / (1.0 + c / (flops_per_dim * d))
    return np.minimum(factor, 1.0)


KERNEL_HEAD_DIMS = {
    "fa1": (32.0, 64.0, 128.0),
    "fa2": (32.0, 64.0, 96.0, 128.0, 160.0, 192.0, 224.0, 256.0),
    "fa3": (64.0, 96.0, 128.0, 192.0, 256.0),
}
"""The head dimensions each FlashAttention kernel is compiled for; a head runs on the smallest one that holds it, its
matmuls over the padded width (flash-attn v1.0.9 csrc/flash_attn/fmha_api.cpp: d <= 32 / 64 / 128; v2
csrc/flash_attn/src/static_switch.h HEADDIM_SWITCH, with 160 and 224 through v2.7 and in PyTorch's vendored copy that
SDPA's flash backend runs; FlashAttention-3 hopper/flash_api.cpp round_up_headdim).
FlashAttention in Triton pads to the next power of two (flash_attn_triton.py `BLOCK_HEADDIM =
max(triton.next_power_of_2(d), 16)`); cuDNN's fused attention takes any multiple of 8 and is priced unpadded."""


def kernel_head_dim(kernel: str, head_dim: "np.ndarray | float") -> np.ndarray:
    """The head dimension `kernel` computes on for heads of `head_dim` (KERNEL_HEAD_DIMS); the head's own where the
    kernel pads nothing or the head is wider than every instantiation."""
    d = np.maximum(np.asarray(head_dim, dtype=float), 1.0)
    if kernel == "fa_triton":
        return np.maximum(2.0 ** np.ceil(np.log2(d)), 16.0)
    padded = d
    for width in reversed(KERNEL_HEAD_DIMS.get(kernel, ())):
        padded = np.where(d <= width, width, padded)
    return padded


def attention_efficiency(profile: HardwareProfile, m: "np.ndarray | float", n: "np.ndarray | float",
                         k: "np.ndarray | float", kernel: str = "", attention_pass: str = "fwd") -> np.ndarray:
    """Fraction of the bf16 peak a fused attention kernel reaches in one pass (`attention_pass` fwd or bwd), for
    m queries × n keys × head dim k, FLOPs counted as the kernels' benchmarks count them (causal: the unmasked half;
    backward 2.5× the forward, see FLASH_CORE_BACKWARD_TO_FORWARD):

        attention_efficiency = peak_fraction / (1 + half_saturation_seq / n)

    with the kernel's own pair for that pass (attention_curve_parameters). The kernel streams key/value blocks
    through on-chip memory (softmax on the special-function units, online rescaling, the causal diagonal's partly
    masked blocks), so its rate rolls off with the keys each query block sees far more steeply than a GEMM of the
    same shape: the cuDNN graph on B200 runs at 24% of peak at 512 tokens and 66% at 64K once the benchmark's host
    dispatch is taken out (shared/reference/microbench/attention_*.csv; a batch-1 benchmark's forward also times
    the call's dispatch, which the fit separates and no step prices: attention_dispatch_parameter); the backward
    (five matmuls, dS and the atomics of dQ) runs well below the forward (FA3 on H100:
    ~540 against ~630 TFLOPS non-causal at 8K). Every measured kernel has head dim 128; a smaller head dim k runs
    at `attention_head_dim_factor` of the curve (the softmax's exponentials weigh more against fewer matmul FLOPs),
    a larger one (MLA's 192) at the curve; a head the kernel pads (`kernel_head_dim`: 112 runs as 128 in
    FlashAttention-2, 80 as 128 in Triton) runs the padded width's matmuls, k / padded of its FLOPs useful.
    `kernel` '' or a profile without that kernel's curve: the kernel-less curve (ATTENTION_PARAMETERS, both passes)
    where the profile has it, else the GEMM curve."""
    params = profile.gemm_efficiency
    names = attention_curve_parameters(kernel, attention_pass) if kernel else ATTENTION_PARAMETERS
    if not all(name in params for name in names):
        names = ATTENTION_PARAMETERS
    if not all(name in params for name in names):
        return gemm_efficiency(profile, m, n, k, "bf16", concurrent=np.inf)   # one kernel's grid over every head
    keys = np.maximum(np.asarray(n, dtype=float), 1.0)
    padded = kernel_head_dim(kernel, k)
    curve = params[names[0]] / (1.0 + params[names[1]] / keys) \
        * attention_head_dim_factor(profile, kernel, attention_pass, padded) * np.asarray(k, dtype=float) / padded
    return np.broadcast_to(curve, np.broadcast_shapes(np.shape(m), np.shape(n), np.shape(k))).astype(float)


def gemm_time_s(profile: HardwareProfile, flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                precision: str, concurrent: "np.ndarray | float" = 1.0) -> np.ndarray:
    """Seconds for `flops` of GEMMs of shape (m, n, k) at the achieved rate peak × efficiency."""
    peak = profile.peak_flops_per_s[precision]
    return flops / (peak * gemm_efficiency(profile, m, n, k, precision, concurrent))


# ---- the GEMMs of one layer ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gemm:
    """One GEMM family: forward FLOPs per GPU per microbatch and its shape (m tokens, n out, k in)."""

    flops: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    attention_core: bool = False
    """Attention scores/values: bf16 always, recomputed by selective recompute."""
    grouped: bool = False
    """Routed experts: flops / 2mnk GEMMs of one expert's shape, a cuBLAS call each or one grouped kernel
    (TrainingSpec.expert_gemm; costmodels.moe_kernels.grouped_gemm_time_s)."""
    sp_gathered_input: bool = False
    """A column-parallel linear layer whose input sequence parallelism all-gathers over the tp group (fused QKV, an
    MLP's first GEMM): in FP8 its cast runs on the local shard before the gather (`fp8_cast_bytes`)."""
    bf16_only: bool = False
    """Not a Transformer Engine layer: bf16 in either precision, no fp8 cast (a MoE router, moe/router.py
    torch.nn.functional.linear)."""
    norm_fused_input: bool = False
    """Its input comes from a norm fused into the layer, Transformer Engine's LayerNormLinear (Megatron-Core's TE
    spec: the fused QKV without MLA, a dense MLP's fc1): in FP8 the norm kernel casts (`fp8_cast_bytes_per_element`)."""

    def concurrent(self, training: TrainingSpec) -> "np.ndarray | float":
        """GEMMs of this family that share one kernel floor (`gemm_efficiency`): the unfused attention core is one
        batched GEMM over every head and sequence; routed experts in one grouped kernel share one; as cuBLAS GEMMs
        under Transformer Engine they run on its compute streams, TE_COMPUTE_STREAMS at a time; a loop over experts
        and every other GEMM one at a time."""
        count = np.asarray(self.flops, dtype=float) / np.maximum(2.0 * self.m * self.n * self.k, 1.0)
        if self.attention_core:
            return np.maximum(count, 1.0)
        if self.grouped and training.expert_gemm is ExpertGemm.GROUPED:
            return np.maximum(count, 1.0)
        if self.grouped and training.expert_gemm is ExpertGemm.CUBLAS and training.engine is Engine.MEGATRON:
            return np.clip(count, 1.0, TE_COMPUTE_STREAMS)
        return 1.0


def _tokens(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Tokens one GPU's GEMMs see per microbatch: mbs·s/cp (SP gathers the sequence back before each GEMM)."""
    return plans.mbs * training.seq_len / plans.cp.astype(float)


def _linear(tokens: np.ndarray, d_in: "np.ndarray | float", d_out: "np.ndarray | float") -> Gemm:
    d_in = np.broadcast_to(np.asarray(d_in, dtype=float), tokens.shape)
    d_out = np.broadcast_to(np.asarray(d_out, dtype=float), tokens.shape)
    return Gemm(flops=2.0 * tokens * d_in * d_out, m=tokens, n=d_out, k=d_in)


def attention_gemms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> list[Gemm]:
    """Attention projections and core of one layer, per GPU (heads split over tp, sequence over cp)."""
    tokens = _tokens(training, plans)
    h = model.hidden_size
    tp = plans.tp.astype(float)
    a = model.num_attention_heads
    if model.mla is not None:
        mla = model.mla
        # the down projections are plain (duplicated) linears: Megatron-Core runs them on the rank's sequence-parallel
        # shard, s/tp (gpt_layer_specs.py backend.linear(); multi_latent_attention.py _qkv_down_projection:
        # "kv_combined: [s / TP, b, ...]"), the up projections gathering the latents; torchtitan replicates them
        # over TP on every token (deepseek_v3 sharding: wq_a / wkv_a replicated)
        down_tokens = np.where(plans.sp & (training.engine is Engine.MEGATRON), tokens / tp, tokens)
        gemms = [_linear(down_tokens, h, mla.kv_lora_rank + mla.qk_rope_head_dim),         # kv down
                 _linear(tokens, mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim) / tp),
                 _linear(tokens, a * mla.v_head_dim / tp, h)]                              # output projection
        if mla.q_lora_rank:
            gemms += [_linear(down_tokens, h, mla.q_lora_rank),                            # q down
                      _linear(tokens, mla.q_lora_rank, a * mla.qk_head_dim / tp)]
        else:
            gemms.append(_linear(tokens, h, a * mla.qk_head_dim / tp))
        qk_dim, v_dim = mla.qk_head_dim, mla.v_head_dim
    else:
        gemms = [dataclasses.replace(_linear(tokens, h, (model.q_size + 2 * model.kv_size) / tp),
                                     sp_gathered_input=True, norm_fused_input=True),       # fused QKV
                 _linear(tokens, model.q_size / tp, h)]                                    # output projection
        qk_dim = v_dim = model.head_dim
    # attention core: 2·s²·a·(d_qk + d_v) per sequence forward when the full score matrix is computed and masked
    # (unfused attention: baddbmm + masked softmax, Megatron's pre-flash path); fused causal kernels (FlashAttention,
    # TE) skip the masked half: s²·a·(d_qk + d_v). Per GPU: heads / tp, queries / cp (CP load-balances the chunks).
    seq = float(training.seq_len)
    causal_skip = 0.5 if training.flash_attention else 1.0
    core_flops = causal_skip * 2.0 * plans.mbs * seq * seq * a * (qk_dim + v_dim) / (tp * plans.cp) \
        * local_attention_core_fraction(model, training)
    chunk = seq / plans.cp
    gemms.append(Gemm(flops=core_flops, m=chunk, n=chunk, k=np.full(len(plans), float(qk_dim)),
                      attention_core=True))
    return gemms


def mla_up_projections(model: ModelSpec, attention: list[Gemm]) -> list[Gemm]:
    """What module mla_up_proj re-runs of `attention_gemms`' MLA projections: the kv up projection (index 1) and the
    q up projection (index 4 with a q latent), or without one the q projection (index 3), which the checkpointed
    qkv_up_proj_and_rope_apply runs too (multi_latent_attention.py)."""
    assert model.mla is not None
    return [attention[1], attention[4] if model.mla.q_lora_rank else attention[3]]


def local_attention_core_fraction(model: ModelSpec, training: TrainingSpec) -> float:
    """Attention-core work of the average layer relative to full causal attention.

    A sliding-window layer (Beltagy et al., arXiv 2004.05150; GPT-OSS alternates 128-token windows with full layers,
    HF `GptOssConfig.layer_types`) lets query i see min(i + 1, w) keys: s·w - w²/2 pairs instead of s²/2. A chunked
    layer (Llama 4's iRoPE, HF `Llama4TextConfig.attention_chunk_size`: a causal mask inside each chunk of c tokens,
    `layer_types` 'chunked_attention') holds s // c whole chunks of c²/2 pairs and a last one of (s mod c)²/2. A fused
    kernel skips the masked blocks; averaged over the layers (the patterns repeat every 2 or 4 layers; a pipeline
    stage of fewer layers than a period holds another mix, e.g. Llama 4 on pp 16, 3 layers a stage: up to one full
    and two chunked layers, its core ~26% above the average at 128K tokens), and the kernel's rate is read at the
    sequence's length, not the chunk's (chunked layers a few % cheap past one chunk); without flash attention the
    full matrix is computed either way.
    """
    if not training.flash_attention or not (model.sliding_window or model.attention_chunk_size):
        return 1.0
    s = float(training.seq_len)
    w = float(min(model.sliding_window, training.seq_len))
    sliding = (s * w - w * w / 2.0) / (s * s / 2.0)
    c = float(model.attention_chunk_size)
    whole, rest = divmod(s, c) if c else (0.0, s)
    chunked = (whole * c * c + rest * rest) / (s * s)
    full = model.num_layers - model.sliding_window_layers - model.chunked_attention_layers
    return (full + model.sliding_window_layers * sliding + model.chunked_attention_layers * chunked) \
        / model.num_layers


def mlp_gemms(model: ModelSpec, tokens: np.ndarray, width: float, tp: np.ndarray,
              norm_fused: bool = False, split_gate_up: bool = False) -> list[Gemm]:
    """A dense MLP of intermediate size `width`, column- then row-parallel over `tp`; `norm_fused` where the pre-MLP
    norm is fused into its fc1 (a dense layer's MLP; a MoE layer keeps the norm apart for the router). A gated MLP's
    gate and up projections are one GEMM of 2·width columns, or two of `width` each reading the same input where the
    engine keeps them apart (`split_gate_up`, `gate_up_fused`)."""
    gated = model.mlp is MlpKind.GATED
    down = _linear(tokens, width / tp, model.hidden_size)
    if gated and split_gate_up:
        one = _linear(tokens, model.hidden_size, width / tp)
        return [dataclasses.replace(one, sp_gathered_input=True, norm_fused_input=norm_fused), one, down]
    up = 2 * width if gated else width                                                      # gate and up fused
    return [dataclasses.replace(_linear(tokens, model.hidden_size, up / tp), sp_gathered_input=True,
                                norm_fused_input=norm_fused), down]


def gate_up_fused(training: TrainingSpec) -> bool:
    """Whether a gated MLP's gate and up projections run as one GEMM: Megatron-Core's linear_fc1 holds both in one
    weight (mlp.py, gated_linear_unit), and fused SwiGLU kernels pack them (xformers' SwiGLU w12:
    TrainingSpec.fused_kernels); torchtitan's FeedForward (w1, w3 nn.Linear) and GroupedExperts
    (_run_experts_grouped_mm: one torch._grouped_mm for w1, one for w3, models/moe/moe.py at v0.2.2) and Hugging
    Face's gate_proj / up_proj run two, each reading the input, whose two input gradients the backward adds
    (priced for the routed experts, moe_backward_extra_s; a dense or shared MLP's add, a few bytes a token, is
    left in the elementwise traffic)."""
    return training.engine in (Engine.MEGATRON, Engine.NATIVE) or training.fused_kernels


def moe_tokens_per_local_expert(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Average tokens each local expert GEMM sees per microbatch: the EP group's routed tokens over its experts.

    A GPU's attention handles mbs·s/(tp·cp) distinct tokens; each is sent to top_k experts, replicated over the
    etp ranks of an expert; the ep·etp GPUs of an expert group hold E/ep experts each:
    m_e = mbs·s·top_k·etp·ep / (tp·cp·E). Where every TP rank dispatches all of the micro-batch's tokens with
    unsplit experts (torchtitan's DeepEP path under TP, engines.moe_dispatch_replicated with etp 1), each expert
    receives each token once from every TP rank of its EP group: tp times as many copies, computed again.
    """
    assert model.moe is not None
    moe = model.moe
    duplicated = np.where(engines.moe_dispatch_replicated(training, plans) & (plans.etp == 1), plans.tp, 1.0)
    return (plans.mbs * training.seq_len * moe.top_k * plans.etp * plans.ep * duplicated
            / (plans.tp * plans.cp * float(moe.num_experts)))


def moe_load_factor(training: TrainingSpec) -> float:
    """Busiest expert rank over the average: dropless routing lets the imbalance through; a capacity factor caps it
    (tokens beyond capacity are dropped; Fedus et al., Switch Transformer, arXiv 2101.03961 §2.1). Padded to
    capacity (--moe-pad-expert-input-to-capacity), every expert runs exactly its capacity whatever the routing:
    Megatron-Core's drop-and-pad mode makes every expert's column of the routing map its capacity
    (moe_utils.apply_router_token_dropping, final_map = capacity_mask) and the alltoall dispatcher permutes and
    sends capacity x experts rows (token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess, num_out_tokens =
    capacity * num_experts)."""
    if training.moe_capacity_factor is None:
        return training.moe_imbalance_factor
    if training.moe_pad_to_capacity:
        return training.moe_capacity_factor
    return min(training.moe_imbalance_factor, training.moe_capacity_factor)


def moe_kept_token_fraction(training: TrainingSpec) -> float:
    """Share of the routed (token, expert) pairs an expert computes: all of them dropless; under a capacity factor
    c < 1 each expert keeps at most c × its balanced share and drops the rest (Megatron-Core
    moe_utils.topk_softmax_with_capacity: capacity = ceil(tokens·top_k / E × c), the tokens past it masked out of
    the routing map, so they skip the expert and only the residual carries them). Counted under balanced routing,
    the load the estimate assumes (min(1, c)); with an imbalance the share kept is lower still, so this bounds the
    work done from above. Dropped tokens are not FLOPs done: model FLOPs and MFU count only the kept ones."""
    if training.moe_capacity_factor is None:
        return 1.0
    return min(1.0, training.moe_capacity_factor)


def moe_mlp_gemms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> list[Gemm]:
    """Router, routed experts (at the busiest rank's load) and shared experts of one MoE layer, per GPU."""
    assert model.moe is not None
    moe = model.moe
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    router_tokens = tokens if engines.moe_router_replicated(training) else tokens / tp     # SP tokens; torchtitan all
    gemms = [dataclasses.replace(_linear(router_tokens, model.hidden_size, moe.num_experts), bf16_only=True)]
    expert_tokens = moe_tokens_per_local_expert(model, training, plans) * moe_load_factor(training)
    local_experts = moe.num_experts / plans.ep
    split = not gate_up_fused(training)
    for gemm in mlp_gemms(model, expert_tokens, moe.expert_ffn_hidden_size, plans.etp.astype(float),
                          split_gate_up=split):
        gemms.append(Gemm(flops=gemm.flops * local_experts, m=gemm.m, n=gemm.n, k=gemm.k, grouped=True))
    if moe.num_shared_experts:
        gemms += mlp_gemms(model, tokens, moe.shared_expert_ffn_hidden_size, tp, split_gate_up=split)
    return gemms


def logits_gemms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> list[Gemm]:
    """Output layer h × V_padded/tp on the last stage."""
    vocab = padded_vocab_size(model, plans.tp).astype(float)
    return [_linear(_tokens(training, plans), model.hidden_size, vocab / plans.tp)]


# HBM bytes per logit that the softmax cross-entropy moves, (forward, backward), per megatron-core 0.19:
# - unfused (tensor_parallel/cross_entropy.py, VocabParallelCrossEntropy, one kernel per op): forward .float() (read
#   2, write 4), max (read 4), subtract the max in place (read 4, write 4), exp (read 4, write 4), sum (read 4),
#   divide by the sum in place, the softmax kept for backward (read 4, write 4) = 38; backward scales the softmax in
#   place by the loss gradient (read 4, write 4) and autograd casts it back to the bf16 logits (read 4, write 2) = 14.
# - fused (--cross-entropy-loss-fusion; fusions/fused_cross_entropy.py, each step a jit_fuser kernel): the cast and
#   max (read 2, write the fp32 logits 4), subtract + exp + sum (read 4, write 4), divide (read 4, write 4) = 22;
#   backward one kernel, softmax × gradient cast to bf16 (read 4, write 2) = 6.
# - xentropy (apex contrib/csrc/xentropy/xentropy_kernel.cu, as flash-attn's csrc/xentropy builds it for
#   flash_attn.losses.cross_entropy): one block per token row, on the bf16 logits as they are; the forward
#   (cunn_SoftMaxXEntropyForward) reads the row twice, for the max and sum and then for the sum of exponentials
#   (read 2 + 2 = 4), and writes a loss and a log-sum-exp per token; the backward (cunn_SoftMaxXEntropyBackward)
#   reads the row and writes its gradient (read 2, write 2 = 4).
# (PyTorch eager F.cross_entropy under autocast moves about 40 in all: between fused and unfused.)
LOSS_BYTES_PER_LOGIT = {CrossEntropyKernel.UNFUSED: (38.0, 14.0), CrossEntropyKernel.FUSED: (22.0, 6.0),
                        CrossEntropyKernel.XENTROPY: (4.0, 4.0)}


def loss_logits(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Logits one GPU's cross entropy reads per microbatch: its tokens × its V_padded/tp slice of the vocabulary."""
    vocab = padded_vocab_size(model, plans.tp).astype(float)
    return _tokens(training, plans) * vocab / plans.tp


def loss_times_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec,
                 plans: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the softmax cross-entropy on the last stage: memory-bound kernels over the
    logits at HBM bandwidth (LOSS_BYTES_PER_LOGIT of `training.cross_entropy`'s kernels). MTP modules each add
    their own loss over the same logits shape."""
    forward_bytes, backward_bytes = LOSS_BYTES_PER_LOGIT[training.cross_entropy]
    logits = loss_logits(model, training, plans) * (1 + model.num_mtp_layers)
    return (logits * forward_bytes / profile.hbm_bandwidth_bytes_per_s,
            logits * backward_bytes / profile.hbm_bandwidth_bytes_per_s)


def mtp_extra_gemms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> list[Gemm]:
    """Per MTP module, besides its decoder layer: the eh_proj 2h→h and the shared output head again."""
    tokens = _tokens(training, plans)
    return [_linear(tokens, 2 * model.hidden_size, model.hidden_size / plans.tp)] + \
        logits_gemms(model, training, plans)


# ---- memory-bound (elementwise) work ----------------------------------------------------------------------------

def elementwise_traffic_factor(profile: HardwareProfile) -> float:
    """HBM bytes moved per byte of stored activation by the non-GEMM kernels (profile `elementwise:` section)."""
    section = profile.extra.get("elementwise", {}) or {}
    return float(section.get("traffic_per_activation_byte", 0.0))


ELEMENTWISE_REPLICATED_BYTES_PER_HIDDEN = 8.0
"""Per token and hidden unit, outside the TP region: two norm inputs (2 + 2) and the two block inputs (2 + 2)."""
ELEMENTWISE_MASK_BYTES_PER_HIDDEN = 2.0
"""The attention-output and MLP-output dropout masks (1 + 1), written only when the model trains with dropout."""


def elementwise_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plans: PlanArrays,
                                moe_layer: bool) -> tuple[np.ndarray, np.ndarray]:
    """(layer, attention-score) activation bytes one GPU's non-GEMM kernels touch in one layer's forward.

    Korthikanti et al. (arXiv 2205.05198 §4.1) itemise a GPT layer's activations as s·b·h·(34 + 5·a·s/h) bytes:
    layernorms 4, attention 11 (+ 5·a·s/h for the scores, softmax and its dropout), MLP 19. Generalised to the
    real shape: the replicated part (two norm inputs 4, the two block inputs 2 + 2, two dropout masks 1 + 1:
    10·s·b·h; 8·s·b·h for a model trained without dropout, whose bias-dropout-add writes no mask) is split over tp
    only with sequence parallelism (§4.2.2); the TP-split part is Q, K, V and the attention output (2q + 2q + 4kv)/h
    and the MLP interior (2 + 2 bytes per F column, plus 2 for the gate when gated); the scores part 5·a·s²·b/tp
    (softmax output 2, dropout mask 1 and output 2; 2 without dropout) is absent with flash attention (never
    materialised).
    These bytes are written and re-read by the layernorm, GELU/SwiGLU, dropout, bias and softmax kernels.
    """
    h = model.hidden_size
    tokens = plans.mbs * training.seq_len / plans.cp.astype(float)
    tp = plans.tp.astype(float)
    masks = ELEMENTWISE_MASK_BYTES_PER_HIDDEN if model.dropout else 0.0
    replicated = (ELEMENTWISE_REPLICATED_BYTES_PER_HIDDEN + masks) * tokens * h / np.where(plans.sp, tp, 1.0)
    attention_split = tokens * (4.0 * model.q_size + 4.0 * model.kv_size) / tp
    per_column = mlp_interior_bytes_per_column(model)
    if moe_layer and model.moe is not None:
        moe = model.moe
        mlp_split = np.zeros(len(plans))
        if moe.num_shared_experts:
            mlp_split = mlp_split + tokens * per_column * moe.shared_expert_ffn_hidden_size / tp
        # the routed experts' activation, the token permutation around the all-to-all and the router's
        # softmax/top-k are kernels priced on their own bytes (routed_expert_activation_bytes, moe_dispatch_bytes)
    else:
        mlp_split = tokens * per_column * model.ffn_hidden_size / tp
    layer_bytes = replicated + attention_split + mlp_split
    if training.flash_attention:
        score_bytes = np.zeros(len(plans))
    else:
        per_score = 5.0 if model.dropout else 2.0
        score_bytes = per_score * model.num_attention_heads * training.seq_len * tokens / tp
    return layer_bytes, score_bytes


def mlp_interior_bytes_per_column(model: ModelSpec) -> float:
    """Elementwise bytes per token per MLP column in `elementwise_bytes_per_layer`: 2 + 2, plus 2 for the gate."""
    return 6.0 if model.mlp is MlpKind.GATED else 4.0


def routed_expert_activation_bytes(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Forward HBM bytes of the routed experts' activation function on the busiest rank's received copies: one fused
    kernel (Megatron-Core `fusions/fused_bias_swiglu.py`, `weighted_bias_swiglu_impl` when the routing probabilities
    are applied there; `fused_bias_gelu.py` for an ungated MLP) reads the fc1 output (2 + 2 bytes per column gated, 2
    ungated) and writes its output (2): `mlp_interior_bytes_per_column`. Priced at HBM bandwidth like the
    permutation, the same bytes its selective recompute (`moe_act`) re-runs; the backward is 2 × the forward (it
    reads the output gradient and the stored input and writes the input gradient: 10 bytes a gated column). Eager
    PyTorch experts run the activation and the gate multiply as two kernels (`expert_activation_bytes_per_column`)."""
    assert model.moe is not None
    moe = model.moe
    expert_tokens = moe_tokens_per_local_expert(model, training, plans) * moe_load_factor(training) \
        * moe.num_experts / plans.ep
    return expert_tokens * expert_activation_bytes_per_column(model, training) * moe.expert_ffn_hidden_size \
        / plans.etp


EAGER_GATED_ACTIVATION_BYTES = 10.0
"""`F.silu(gate) * up` as two eager kernels, per column: the SiLU reads and writes 2 + 2, the multiply reads both
halves and writes 2 + 2 + 2 (torchtitan models/moe/moe.py _run_experts_grouped_mm; Hugging Face's expert MLPs)."""


def expert_activation_bytes_per_column(model: ModelSpec, training: TrainingSpec) -> float:
    """Bytes per routed copy per expert column of the experts' activation: one fused kernel
    (`mlp_interior_bytes_per_column`: Megatron-Core's, a compiled block's, TrainingSpec.fused_kernels'), or a gated
    MLP's SiLU and multiply as two kernels in an eager PyTorch engine (EAGER_GATED_ACTIVATION_BYTES)."""
    eager = training.engine in (Engine.TORCHTITAN, Engine.PYTORCH, Engine.DEEPSPEED) \
        and training.launch is not LaunchPath.COMPILE and not training.fused_kernels
    if eager and model.mlp is MlpKind.GATED:
        return EAGER_GATED_ACTIVATION_BYTES
    return mlp_interior_bytes_per_column(model)


# ---- FP8 casts ---------------------------------------------------------------------------------------------------

FP8_CAST_READ_BYTES = 2.0
"""A cast reads its bf16 input once (TE `nvte_quantize`, `cast_transpose`, the MXFP8 and block quantize kernels)."""
FP8_AMAX_PASS_BYTES = 2.0
"""Per-tensor current scaling (Fp8Recipe.TENSORWISE) reads the input once more, in a reduction kernel before the cast
that finds the amax the scale comes from (TE csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl:
nvte_compute_amax, then nvte_compute_scale_from_amax, then nvte_quantize)."""


FP8_TRANSPOSE_BYTES = 2.0
"""A transpose of an fp8 tensor reads it (1 byte an element) and writes the transposed copy (1 byte)."""


def fp8_tn_only(profile: HardwareProfile) -> bool:
    """Whether the GPU's FP8 GEMMs take only the TN layout, so the weight-gradient GEMM needs a transposed copy of a
    per-tensor-scaled input (TE common/transformer_engine.cpp nvte_is_non_tn_fp8_gemm_supported: 10.x and 13.0 on
    read either layout; Hopper, Ada and 12.x do not). A profile that states no compute capability counts as
    TN-only."""
    cc = profile.compute_capability
    return not (10.0 <= cc < 12.0 or cc >= 13.0)


def fp8_cast_bytes_per_element(profile: HardwareProfile, recipe: Fp8Recipe, norm_fused: bool = False,
                               gathered: bool = False) -> tuple[float, float]:
    """HBM bytes of one forward FP8 cast of a linear layer's bf16 input: (per element the GPU casts, per element of
    the all-gathered tensor). The cast reads the input (FP8_CAST_READ_BYTES) and writes the GEMM's copy
    (specs.fp8_copy_bytes_per_element), plus a second layout for the weight gradient (TE Linear
    input_quantizer.set_usage(columnwise=backward_needs_input)):
    - block scaling (mxfp8, blockwise) quantizes it anew, both copies in the one kernel, on every GPU;
    - per-tensor scaling on a TN-only GPU (`fp8_tn_only`) writes it as a transpose in the same pass (cast_transpose),
      except for an input sequence parallelism gathers: the shard is cast rowwise only ('All-gather is not supported
      with FP8 column-wise data', TE module/linear.py) and the gathered tensor is transposed after the gather
      (distributed.py _all_gather_fp8: _create_transpose), FP8_TRANSPOSE_BYTES per gathered element.
    A norm fused into the layer (`norm_fused`, TE's LayerNormLinear; csrc/extensions/normalization.cpp) casts in the
    norm kernel: delayed scaling writes fp8 directly (FULLY_FUSED: no cast of its own, a separate transpose where
    one is needed), current scaling takes the amax from the norm (FUSED_NORM_AMAX_FP8, then quantize_with_amax: no
    amax pass); block scaling runs unfused. Current scaling otherwise reads the input once more for its amax
    (FP8_AMAX_PASS_BYTES). Delayed scaling, unfused, no SP: 4 bytes on Hopper, 3 on Blackwell; current scaling 2
    more; block scaling ~4.06. The backward casts the output gradient much the same way, which `BACKWARD_TO_FORWARD`
    applies; weights are cast once per step (TE `is_first_microbatch`) and not counted here."""
    copy = fp8_copy_bytes_per_element(recipe)
    norm_writes_fp8 = norm_fused and recipe is Fp8Recipe.DELAYED
    read = 0.0 if norm_writes_fp8 else FP8_CAST_READ_BYTES
    amax = FP8_AMAX_PASS_BYTES if recipe is Fp8Recipe.TENSORWISE and not norm_fused else 0.0
    first = 0.0 if norm_writes_fp8 else copy
    if recipe.block_scaled:
        return read + amax + first + copy, 0.0
    if not fp8_tn_only(profile):
        return read + amax + first, 0.0
    if gathered:
        return read + amax + first, FP8_TRANSPOSE_BYTES
    return read + amax + first + (FP8_TRANSPOSE_BYTES if norm_writes_fp8 else copy), 0.0


def fp8_cast_bytes(gemms: list[Gemm], profile: HardwareProfile, training: TrainingSpec,
                   plans: PlanArrays) -> np.ndarray:
    """HBM bytes of the FP8 input casts of one layer's forward GEMMs (0 in bf16): m × k elements per GEMM at
    `fp8_cast_bytes_per_element`, a sequence-parallel input (Gemm.sp_gathered_input) cast on the GPU's own 1/tp
    shard before the all-gather (steptime.tp_gather_bytes_per_element). The attention core and the elementwise kernels
    stay bf16 and are priced as such: FP8 speeds up the GEMMs only."""
    recipe = training.fp8_scaling
    if recipe is None:
        return np.zeros(len(plans))
    tp = plans.tp.astype(float)
    total = np.zeros(len(plans))
    for gemm in gemms:
        if gemm.attention_core or gemm.bf16_only:
            continue
        elements = gemm.m * gemm.k * (gemm.flops / (2.0 * gemm.m * gemm.n * gemm.k))
        unsharded, _ = fp8_cast_bytes_per_element(profile, recipe, gemm.norm_fused_input, gathered=False)
        if gemm.sp_gathered_input:
            shard, gathered = fp8_cast_bytes_per_element(profile, recipe, gemm.norm_fused_input, gathered=True)
            total = total + elements * np.where(plans.sp, shard / tp + gathered, unsharded)
        else:
            total = total + elements * unsharded
    return total


# ---- seconds -------------------------------------------------------------------------------------------------

def sustained_compute_s(profile: HardwareProfile, burst_s: "np.ndarray | float") -> "np.ndarray | float":
    """Seconds of a compute-bound kernel inside a training step, from its microbenchmarked (burst) time: the
    microbenchmarks time short bursts at boost clock, while a step keeps the tensor cores busy long enough for
    the board's power limit to pull the SM clock down (profile `sustained_clock_fraction`, with its sources:
    DeepGEMM issue #120, H800 1980 -> 1575 MHz; flashinfer PR #2899, B200 1965 -> ~1580 MHz after ~30 back-to-back
    iterations); tensor throughput is proportional to the SM clock. The whole time of a GEMM on the fitted curve
    scales, the curve's small-shape roll-off too (launch and memory time that does not slow with the clock): a
    slight over-charge for the smallest GEMMs."""
    return burst_s / profile.sustained_clock_fraction


def _gemms_time_s(profile: HardwareProfile, training: TrainingSpec, gemms: list[Gemm],
                  attention_core: "bool | None" = None) -> np.ndarray:
    """Seconds of `gemms` (or only the attention core's / only the others', with `attention_core`) in a training
    step: each on its fitted curve, at the sustained clock (`sustained_compute_s`)."""
    precision = training.precision.value
    total = np.zeros(len(gemms[0].flops)) if gemms else 0.0
    for gemm in gemms:
        if attention_core is not None and gemm.attention_core != attention_core:
            continue
        if gemm.attention_core and training.flash_attention:  # fused kernel: its own measured curve
            total = total + sustained_compute_s(profile, gemm.flops / (
                profile.peak_flops_per_s["bf16"] * attention_efficiency(
                    profile, gemm.m, gemm.n, gemm.k, resolve_attention_kernel(profile, training), "fwd")))
        elif gemm.grouped and training.expert_gemm is ExpertGemm.GROUPED and \
                moe_kernels.has_grouped_curve(profile, precision):   # routed experts in one grouped kernel: roofline
            total = total + moe_kernels.grouped_gemm_time_s(profile, gemm.flops, gemm.m, gemm.n, gemm.k, precision,
                                                            profile.sustained_clock_fraction)
        else:
            bf16 = gemm.attention_core or gemm.bf16_only
            total = total + sustained_compute_s(profile, gemm_time_s(profile, gemm.flops, gemm.m, gemm.n, gemm.k,
                                                                     "bf16" if bf16 else precision,
                                                                     gemm.concurrent(training)))
    return total


def attention_core_backward_s(profile: HardwareProfile, training: TrainingSpec, gemms: list[Gemm]) -> np.ndarray:
    """Seconds of the attention core's backward GEMMs: a fused kernel runs FLASH_CORE_BACKWARD_TO_FORWARD × the
    forward FLOPs at its measured backward rate (its own curve, attention_efficiency(..., 'bwd')); the unfused path
    runs BACKWARD_TO_FORWARD × its forward GEMMs on the GEMM curve."""
    total = np.zeros(len(gemms[0].flops)) if gemms else 0.0
    for gemm in gemms:
        if not gemm.attention_core:
            continue
        if training.flash_attention:
            total = total + FLASH_CORE_BACKWARD_TO_FORWARD * gemm.flops / (
                profile.peak_flops_per_s["bf16"] * attention_efficiency(
                    profile, gemm.m, gemm.n, gemm.k, resolve_attention_kernel(profile, training), "bwd"))
        else:
            total = total + BACKWARD_TO_FORWARD * gemm_time_s(profile, gemm.flops, gemm.m, gemm.n, gemm.k, "bf16",
                                                              gemm.concurrent(training))
    return sustained_compute_s(profile, total)


@dataclass(frozen=True)
class LayerTimes:
    """Forward seconds per microbatch per GPU of the building blocks of a stage."""

    dense_layer_fwd_s: np.ndarray
    moe_layer_fwd_s: np.ndarray
    attention_core_fwd_s: np.ndarray
    logits_fwd_s: np.ndarray
    mtp_fwd_s: np.ndarray
    """All MTP modules together (their decoder layers included), on the last stage."""
    selective_dense_fwd_s: "np.ndarray | None" = None
    """Per dense layer: the forward of the modules selective recompute re-runs (see selective_recompute_s)."""
    selective_moe_fwd_s: "np.ndarray | None" = None
    """Per MoE layer: the same."""
    moe_layer_bwd_extra_s: "np.ndarray | float" = 0.0
    """Per MoE layer: backward seconds beyond BACKWARD_TO_FORWARD × the forward (see moe_backward_extra_s)."""
    loss_fwd_s: "np.ndarray | float" = 0.0
    """The softmax cross-entropy's forward on the last stage (memory-bound; see loss_times_s)."""
    loss_bwd_s: "np.ndarray | float" = 0.0
    """Its backward (not 2× the forward: see LOSS_BYTES_PER_LOGIT)."""
    tp_overlap: "TpOverlapGemms | None" = None
    """The GEMMs the SP collectives are fused with under --tp-comm-overlap (see tp_overlap_gemms_s)."""
    attention_core_bwd_s: "np.ndarray | None" = None
    """The attention core's backward per layer (its own kernel rate; see attention_core_backward_s); None: the
    core's forward × attention_core_backward_to_forward."""
    dense_weight_gemm_fwd_s: "np.ndarray | float" = 0.0
    """Per dense layer: the forward seconds of the GEMMs with weights (projections, MLP; not the attention core).
    Their weight-gradient GEMMs (the zero-bubble schedules' W pass) have the same FLOPs and shapes, transposed."""
    moe_weight_gemm_fwd_s: "np.ndarray | float" = 0.0
    """Per MoE layer: the same (projections, router, routed and shared experts)."""
    moe_pre_dispatch_fwd_s: "np.ndarray | float" = 0.0
    """Per MoE layer: the forward of what comes before the dispatch (attention block, pre-MLP norm, router, shared
    experts; Megatron-Core's `submodule_pre_dispatch_forward`): moe_layer_fwd_s less the routed experts' GEMMs, their
    elementwise work and the token permutation (which also carries the router's softmax/top-k bytes). The windows
    of the EP-overlap schedule (steptime.ep_paired_exposed_s)."""

    def core_backward_s(self, training: TrainingSpec) -> np.ndarray:
        if self.attention_core_bwd_s is not None:
            return self.attention_core_bwd_s
        return attention_core_backward_to_forward(training) * self.attention_core_fwd_s


@dataclass(frozen=True)
class TpOverlapGemms:
    """Forward seconds per microbatch of the GEMMs that Transformer Engine's userbuffers fuse with the sequence-
    parallel collectives of one layer (--tp-comm-overlap). Each TP block all-gathers its input before its input GEMM
    and reduce-scatters its output after its output GEMM; a dgrad GEMM has its forward's FLOPs and shape."""

    attention_in_s: np.ndarray
    """QKV projection (MLA: all the projections before the core, which read the gathered input)."""
    attention_out_s: np.ndarray
    """Output projection."""
    mlp_in_s: np.ndarray
    """Dense MLP up (and gate) projection."""
    mlp_out_s: np.ndarray
    """Dense MLP down projection."""
    shared_in_s: np.ndarray
    """Shared-expert MLP up projection of an MoE layer (zero without shared experts)."""
    shared_out_s: np.ndarray
    """Shared-expert MLP down projection."""


def tp_overlap_gemms_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec,
                       plans: PlanArrays) -> TpOverlapGemms:
    """The GEMM partner of each SP collective (TransformerEngine `module/base.py` initialize_ub: qkv_fprop and
    fc1_fprop all-gather + GEMM by ring exchange, proj_fprop and fc2_fprop GEMM + reduce-scatter pipelined; in the
    backward proj_dgrad / fc2_dgrad all-gather + GEMM, qkv / fc1 dgrad and wgrad bulk-overlapped)."""
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    projections = [g for g in attention_gemms(model, training, plans) if not g.attention_core]
    output = projections[2] if model.mla is not None else projections[-1]   # attention_gemms' order (MLA: kv, output, q)
    inputs = [g for g in projections if g is not output]

    def time(gemms: list[Gemm]) -> np.ndarray:
        return _gemms_time_s(profile, training, gemms)

    up, down = mlp_gemms(model, tokens, model.ffn_hidden_size, tp)
    zero = np.zeros(len(plans))
    shared_in_s = shared_out_s = zero
    if model.moe is not None and model.moe.num_shared_experts:
        shared_up, shared_down = mlp_gemms(model, tokens, model.moe.shared_expert_ffn_hidden_size, tp)
        shared_in_s, shared_out_s = time([shared_up]), time([shared_down])
    return TpOverlapGemms(attention_in_s=time(inputs), attention_out_s=time([output]), mlp_in_s=time([up]),
                          mlp_out_s=time([down]), shared_in_s=shared_in_s, shared_out_s=shared_out_s)


def layer_times_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec,
                  plans: PlanArrays) -> LayerTimes:
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    attention = attention_gemms(model, training, plans)
    seconds_per_byte = elementwise_traffic_factor(profile) / profile.hbm_bandwidth_bytes_per_s
    # the engine's own non-GEMM kernels: more (eager, unfused) or fewer (compiled, hand-fused) bytes than Megatron's
    layer_s_per_byte = seconds_per_byte * engines.elementwise_traffic_scale(model, training)
    cast_s_per_byte = 1.0 / profile.hbm_bandwidth_bytes_per_s
    dense_bytes, score_bytes = elementwise_bytes_per_layer(model, training, plans, moe_layer=False)
    core_s = _gemms_time_s(profile, training, attention, attention_core=True) + score_bytes * seconds_per_byte
    core_bwd_s = attention_core_backward_s(profile, training, attention) \
        + BACKWARD_TO_FORWARD * score_bytes * seconds_per_byte
    projections_s = _gemms_time_s(profile, training, attention, attention_core=False)
    attention_s = projections_s + core_s + fp8_cast_bytes(attention, profile, training, plans) * cast_s_per_byte
    dense_mlp = mlp_gemms(model, tokens, model.ffn_hidden_size, tp, norm_fused=True,
                          split_gate_up=not gate_up_fused(training))
    dense_mlp_s = _gemms_time_s(profile, training, dense_mlp)
    dense_weight_s = projections_s + dense_mlp_s
    dense_s = attention_s + dense_mlp_s + dense_bytes * layer_s_per_byte \
        + fp8_cast_bytes(dense_mlp, profile, training, plans) * cast_s_per_byte
    moe_s = moe_weight_s = np.zeros(len(plans))
    if model.moe is not None:
        moe_bytes, _ = elementwise_bytes_per_layer(model, training, plans, moe_layer=True)
        moe_mlp = moe_mlp_gemms(model, training, plans)
        dispatch_s = moe_dispatch_bytes(model, training, plans) / profile.hbm_bandwidth_bytes_per_s
        activation_s = routed_expert_activation_bytes(model, training, plans) / profile.hbm_bandwidth_bytes_per_s
        moe_mlp_s = _gemms_time_s(profile, training, moe_mlp)
        moe_weight_s = projections_s + moe_mlp_s
        moe_s = attention_s + moe_mlp_s + moe_bytes * layer_s_per_byte \
            + fp8_cast_bytes(moe_mlp, profile, training, plans) * cast_s_per_byte + dispatch_s + activation_s
        moe_bwd_extra = moe_backward_extra_s(profile, training, moe_mlp, dispatch_s)
        routed = [gemm for gemm in moe_mlp if gemm.grouped]
        routed_s = _gemms_time_s(profile, training, routed) \
            + fp8_cast_bytes(routed, profile, training, plans) * cast_s_per_byte + activation_s + dispatch_s
        pre_dispatch_s = np.clip(moe_s - routed_s, 0.0, moe_s)
    else:
        moe_bwd_extra = 0.0
        pre_dispatch_s = np.zeros(len(plans))
    dense_sel, moe_sel = selective_recompute_s(model, profile, training, plans, core_s)
    sac = engines.per_op_sac(training, plans)
    if sac.any():   # torchtitan's per-op SAC re-runs the block but what its policy keeps
        dense_sel = np.where(sac, dense_s - core_s - sac_kept_gemms_s(model, profile, training, plans, False),
                             dense_sel)
        if model.moe is not None:
            moe_sel = np.where(sac, moe_s - core_s - sac_kept_gemms_s(model, profile, training, plans, True),
                               moe_sel)
    logits_s = _gemms_time_s(profile, training, logits_gemms(model, training, plans))
    mtp_s = np.zeros(len(plans))
    if model.num_mtp_layers:
        module_s = (moe_s if model.is_moe else dense_s) + \
            _gemms_time_s(profile, training, mtp_extra_gemms(model, training, plans))
        mtp_s = model.num_mtp_layers * module_s
    tp_overlap = tp_overlap_gemms_s(model, profile, training, plans) if training.tp_comm_overlap else None
    loss_fwd_s, loss_bwd_s = loss_times_s(model, profile, training, plans)
    return LayerTimes(dense_s, moe_s, core_s, logits_s, mtp_s, dense_sel, moe_sel, moe_bwd_extra, loss_fwd_s,
                      loss_bwd_s, tp_overlap, core_bwd_s, dense_weight_s, moe_weight_s, pre_dispatch_s)


def moe_dispatch_bytes(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Forward HBM bytes of one MoE layer's router softmax/top-k/aux loss and token permutation on one GPU
    (costmodels.moe_kernels): the GPU routes its mbs·s/(cp·tp) sequence-parallel tokens (all mbs·s/cp without SP),
    sends top_k copies of each, and holds the busiest rank's received copies (moe_tokens_per_local_expert × local
    experts × load) for its experts. torchtitan routes all mbs·s/cp on every TP rank, and with expert TP (or on its
    DeepEP path) permutes and sends all of them too (engines.moe_router_replicated, moe_dispatch_replicated). Under
    DeepEP Megatron-Core's flex dispatcher hands DeepEP the tokens as they are and permutes and unpermutes only the
    copies a rank receives, with no chunk sort (token_dispatcher.py MoEFlexTokenDispatcher, _DeepepManager
    get_permuted_hidden_states_by_experts / get_restored_hidden_states_by_experts). torchtitan copies them as its own
    code does (moe_kernels.torchtitan_token_movement_bytes; under DeepEP a rank receives each token once, the
    distinct tokens comm.expected_destinations counts over the EP ranks with balanced routing)."""
    assert model.moe is not None
    moe = model.moe
    tokens = _tokens(training, plans)
    local_tokens = tokens / np.where(plans.sp, plans.tp.astype(float), 1.0)
    routed_tokens = np.where(engines.moe_dispatch_replicated(training, plans), tokens, local_tokens)
    router_tokens = tokens if engines.moe_router_replicated(training) else local_tokens
    load = moe_load_factor(training)
    local_experts = moe.num_experts / plans.ep
    received = moe_tokens_per_local_expert(model, training, plans) * load * local_experts
    router = moe_kernels.router_bytes(router_tokens, moe.num_experts)
    if training.engine is Engine.TORCHTITAN:
        deepep = training.moe_dispatcher is MoEDispatcher.DEEPEP
        ranks_reached = expected_destinations(moe.num_experts, moe.top_k, plans.ep, moe.router.num_groups,
                                              moe.router.group_topk, moe.router.group_by_max) if deepep else 0.0
        return moe_kernels.torchtitan_token_movement_bytes(
            routed_tokens * moe.top_k, router_tokens, received, routed_tokens * ranks_reached * load,
            model.hidden_size, moe.top_k, weights_first=moe.router.probs_on_input, deepep=deepep) + router
    if training.moe_dispatcher is MoEDispatcher.DEEPEP:   # the flex dispatcher: DeepEP sends unpermuted tokens
        return moe_kernels.token_permutation_bytes(received, received, model.hidden_size,
                                                   np.zeros(len(plans), dtype=bool)) + router
    # Megatron-Core sorts the chunks whenever a rank holds more than one expert, at any EP size (token_dispatcher.py
    # dispatch_postprocess / combine_preprocess: `if self.num_local_experts > 1`); the eager engines' expert loops
    # priced on this path gather each expert's rows and sort nothing without an all-to-all
    several = np.broadcast_to(local_experts > 1, (len(plans),))
    sorts_local_chunks = several if training.engine is Engine.MEGATRON else several & (plans.ep > 1)
    return moe_kernels.token_permutation_bytes(routed_tokens * moe.top_k * moe_sent_copy_factor(training), received,
                                               model.hidden_size, sorts_local_chunks) + router


def moe_sent_copy_factor(training: TrainingSpec) -> float:
    """Rows a GPU permutes and sends per routed (token, expert) pair: each of its top_k copies once under dropless
    routing (an imbalance loads the receivers, not the sender), the kept ones under a capacity factor below 1, and
    the padded capacity (c per pair) under drop-and-pad (`moe_load_factor`)."""
    if training.moe_pad_to_capacity:
        return moe_load_factor(training)
    return moe_kept_token_fraction(training)


GRADIENT_ADD_BYTES_PER_ELEMENT = 6.0
"""Autograd's sum of two bf16 gradients of one tensor (read 2 + 2, write 2 bytes an element)."""


def moe_backward_extra_s(profile: HardwareProfile, training: TrainingSpec, moe_mlp: list[Gemm],
                         dispatch_s: np.ndarray) -> np.ndarray:
    """MoE-layer backward seconds the uniform 2 × forward rule misses: one forward of the dispatch copies and router
    passes less (their backward is a single transposed copy; moe_kernels module docstring), and, where the routed
    experts run as one grouped kernel on the grouped roofline, its fp32 weight-gradient accumulation
    (moe_kernels.grouped_wgrad_accumulation_bytes: the roofline itemises a kernel's bytes, and accumulating into
    main_grad adds 6 per weight element), and where the gate and up GEMMs are apart (`gate_up_fused`) the sum of
    their input gradients over the received copies. A cuBLAS GEMM per expert (expert_gemm cublas) accumulates the
    way a dense Linear's wgrad GEMM does (Transformer Engine `GroupedLinear` and `Linear` both run cuBLAS with
    beta = 1 into main_grad under --gradient-accumulation-fusion) and is priced like it, on the dense curve, with
    nothing added."""
    extra = -dispatch_s
    if not gate_up_fused(training):      # the two input gradients of the gate and up GEMMs added: read 2 + 2, write 2
        gate = next((gemm for gemm in moe_mlp if gemm.grouped), None)
        if gate is not None:
            rows_by_width = gate.flops / (2.0 * gate.n)                   # received copies x h, over the experts
            extra = extra + GRADIENT_ADD_BYTES_PER_ELEMENT * rows_by_width / profile.hbm_bandwidth_bytes_per_s
    grouped = training.expert_gemm is ExpertGemm.GROUPED
    if grouped and moe_kernels.has_grouped_curve(profile, training.precision.value):
        for gemm in moe_mlp:
            if gemm.grouped:
                extra = extra + moe_kernels.grouped_wgrad_accumulation_bytes(gemm.flops, gemm.m, gemm.n, gemm.k) \
                    / moe_kernels.grouped_hbm_bytes_per_s(profile)
    return extra


def selective_recompute_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec, plans: PlanArrays,
                          core_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dense layer, MoE layer) seconds of re-running the selected --recompute-modules in the backward pass:
    core_attn the attention core; layernorm the norms that are modules of their own (ModelSpec.num_separate_norms; read
    2h, write 2h bytes per token each, HBM-bound);
    mlp a dense MLP's GEMMs and activation; moe_act the experts' activation (routed_expert_activation_bytes: a fused
    kernel reads the gate/up output, 4 bytes, and writes 2 per expert column; eager PyTorch's two kernels 10); moe
    the router, routed-expert GEMMs, permutation and the shared experts (its all-to-alls are re-run too, priced in
    steptime.ep_all_to_all_s); shared_experts the shared MLP's GEMMs; mla_up_proj the MLA up projections.
    Megatron-Core recomputes each from its stored input (CheckpointWithoutOutput)."""
    n = len(plans)
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    per_byte = 1.0 / profile.hbm_bandwidth_bytes_per_s
    outside = tokens / np.where(plans.sp, tp, 1.0)
    norm = 4.0 * model.hidden_size * outside * per_byte            # one norm module: read 2h, write 2h a token
    mla = np.zeros(n)
    if model.mla is not None:
        mla = _gemms_time_s(profile, training, mla_up_projections(model, attention_gemms(model, training, plans)))
    dense_mlp_gemms = mlp_gemms(model, tokens, model.ffn_hidden_size, tp)
    act_bytes = tokens * (6.0 if model.mlp is MlpKind.GATED else 4.0) * model.ffn_hidden_size / tp
    dense_mlp = _gemms_time_s(profile, training, dense_mlp_gemms) + act_bytes * per_byte

    def pick(module: RecomputeModule, seconds) -> np.ndarray:
        return np.where(recomputes_module(plans, module), seconds, 0.0)

    common = pick(RecomputeModule.CORE_ATTN, core_s) + pick(RecomputeModule.MLA_UP_PROJ, mla)
    dense = common + pick(RecomputeModule.LAYERNORM, model.num_separate_norms(moe_layer=False) * norm) \
        + pick(RecomputeModule.MLP, dense_mlp)
    moe = np.zeros(n)
    if model.moe is not None:
        act = routed_expert_activation_bytes(model, training, plans) * per_byte
        moe_gemms = moe_mlp_gemms(model, training, plans)    # the router, the routed experts, the shared ones
        shared_gemms = [g for g in moe_gemms[1:] if not g.grouped]
        routed = _gemms_time_s(profile, training, [g for g in moe_gemms if g.grouped or g is moe_gemms[0]])
        permute = moe_dispatch_bytes(model, training, plans) * per_byte
        shared = _gemms_time_s(profile, training, shared_gemms) if shared_gemms else np.zeros(n)
        # module moe checkpoints MoELayer's custom_forward, which runs shared_experts_compute first (moe_layer.py):
        # its re-run includes the shared experts; with shared_experts also listed, that inner checkpoint re-runs
        # them once more in its own backward (nested), so each listed module re-runs them once
        shared_runs = recomputes_module(plans, RecomputeModule.MOE).astype(float) \
            + recomputes_module(plans, RecomputeModule.SHARED_EXPERTS)
        moe = common + pick(RecomputeModule.LAYERNORM, model.num_separate_norms(moe_layer=True) * norm) \
            + np.where(recomputes_module(plans, RecomputeModule.MOE), routed + permute + act,
                       pick(RecomputeModule.MOE_ACT, act)) + shared_runs * shared
    return dense, moe


def sac_kept_gemms_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec, plans: PlanArrays,
                     moe_layer: bool) -> np.ndarray:
    """Forward seconds of the matmuls whose outputs torchtitan's per-op SAC keeps in one block
    (engines.sac_kept_matmuls), which its recompute skips, as is the attention kernel (its outputs kept too): the
    block's recompute is its forward less these (layer_times_s). Each on its own shape, TP splitting the output of a
    column-parallel and the input of a row-parallel linear."""
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    gemms = [_linear(tokens, m.d_in / (tp if m.split == "row" else 1.0), m.d_out / (tp if m.split == "column"
                                                                                     else 1.0))
             for m in engines.sac_kept_matmuls(model, moe_layer)]
    return _gemms_time_s(profile, training, gemms) if gemms else np.zeros(len(plans))


def recomputed_layer_fraction(plans: PlanArrays, stage_layers: np.ndarray) -> np.ndarray:
    """Fraction of a stage's layers whose forward is re-run by full recompute (Megatron block method:
    `recompute_layers` of each of the vpp chunks; 0 = all of them)."""
    full = plans.recompute == Recompute.FULL
    chunk_layers = np.maximum(stage_layers / plans.vpp, 1e-9)
    partial = np.where(plans.recompute_layers > 0, np.minimum(plans.recompute_layers / chunk_layers, 1.0), 1.0)
    return np.where(full, partial, 0.0)


# ---- FLOP totals for throughput figures ----------------------------------------------------------------------

def _forward_flops_per_sequence(model: ModelSpec, training: TrainingSpec) -> dict[str, float]:
    """Forward FLOPs of one sequence, unsharded and unpadded vocabulary, by part (attention core separate).

    Counted as Megatron counts them (num_floating_point_operations): causal attention at half the score matrix,
    whatever kernel actually runs."""
    plans = PlanArrays.from_columns(mbs=1)                                              # one GPU, one sequence
    training = dataclasses.replace(training, flash_attention=True)
    tokens = _tokens(training, plans)
    attention = attention_gemms(model, training, plans)
    core = sum(g.flops[0] for g in attention if g.attention_core)
    projections = sum(g.flops[0] for g in attention if not g.attention_core)
    dense_mlp = sum(g.flops[0] for g in mlp_gemms(model, tokens, model.ffn_hidden_size, plans.tp.astype(float)))
    moe_mlp = shared_mlp = 0.0
    if model.moe is not None:
        moe = model.moe
        moe_mlp = 2.0 * training.seq_len * model.hidden_size * moe.num_experts + moe.top_k * dense_mlp \
            * moe.expert_ffn_hidden_size / model.ffn_hidden_size * moe_kept_token_fraction(training)
        if moe.num_shared_experts:
            shared_mlp = dense_mlp * moe.shared_expert_ffn_hidden_size / model.ffn_hidden_size
            moe_mlp += shared_mlp
    mla_up = sum(g.flops[0] for g in mla_up_projections(model, attention)) if model.mla is not None else 0.0
    logits = 2.0 * training.seq_len * model.hidden_size * model.vocab_size
    layer_flops = {"dense": projections + core + dense_mlp, "moe": projections + core + moe_mlp}
    mtp = model.num_mtp_layers * (layer_flops["moe" if model.is_moe else "dense"]
                                  + 2.0 * training.seq_len * 2 * model.hidden_size ** 2 + logits)
    return {"layers": model.num_dense_layers * layer_flops["dense"] + model.num_moe_layers * layer_flops["moe"],
            "attention_core": model.num_layers * core, "logits": logits, "mtp": mtp,
            # what each --recompute-modules module re-runs, over the layers that have it
            "dense_mlp": model.num_dense_layers * dense_mlp, "moe_mlp": model.num_moe_layers * moe_mlp,
            "shared_mlp": model.num_moe_layers * shared_mlp, "mla_up": model.num_layers * mla_up}


def attention_core_flops_per_sequence(model: ModelSpec, training: TrainingSpec) -> float:
    """Forward FLOPs of the attention core (scores and values, causal half) of one sequence over all layers."""
    return float(_forward_flops_per_sequence(model, training)["attention_core"])


def model_flops_per_step(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one step without recompute: 3 × forward (≈ 6·N_active·tokens + causal attention)."""
    parts = _forward_flops_per_sequence(model, training)
    forward = parts["layers"] + parts["logits"] + parts["mtp"]
    return float((1.0 + BACKWARD_TO_FORWARD) * forward * training.global_batch_size)


def sac_kept_flops_per_sequence(model: ModelSpec, training: TrainingSpec) -> float:
    """Forward FLOPs of one sequence's matmuls whose outputs torchtitan's per-op SAC keeps (engines.sac_kept_matmuls),
    over the model's dense and MoE layers."""
    def kept(moe_layer: bool) -> float:
        return sum(2.0 * training.seq_len * m.d_in * m.d_out for m in engines.sac_kept_matmuls(model, moe_layer))
    return model.num_dense_layers * kept(False) + (model.num_moe_layers * kept(True) if model.moe else 0.0)


def hardware_flops_per_step(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """FLOPs actually executed per step: model FLOPs plus the recomputed forward passes (full: the recomputed layers;
    selective: the modules it re-runs, `selective_recompute_s`'s: core_attn the attention core, mlp a dense MLP, moe
    the router, the routed experts and the shared ones, shared_experts the shared ones once more, mla_up_proj the
    MLA up projections; torchtitan's per-op SAC: the layers' forward less the attention core and the matmuls whose
    outputs it keeps, engines.sac_kept_matmuls)."""
    parts = _forward_flops_per_sequence(model, training)
    layers = layers_on_stage(model.num_layers, plans, 0)  # block-method fraction; stage-uniform when split evenly
    full_fraction = recomputed_layer_fraction(plans, layers)
    selective = plans.recompute == Recompute.SELECTIVE
    sac = engines.per_op_sac(training, plans)

    def rerun(module: RecomputeModule, flops: float) -> np.ndarray:
        return np.where(recomputes_module(plans, module) & ~sac, flops, 0.0)

    modules = rerun(RecomputeModule.CORE_ATTN, parts["attention_core"]) + rerun(RecomputeModule.MLP,
                                                                               parts["dense_mlp"]) \
        + rerun(RecomputeModule.MOE, parts["moe_mlp"]) + rerun(RecomputeModule.SHARED_EXPERTS, parts["shared_mlp"]) \
        + rerun(RecomputeModule.MLA_UP_PROJ, parts["mla_up"])
    sac_rerun = parts["layers"] - parts["attention_core"] - sac_kept_flops_per_sequence(model, training)
    recomputed = np.where(selective, np.where(sac, sac_rerun, modules), full_fraction * parts["layers"])
    # a fused attention backward recomputes the scores: 2.5x the core's forward, not 2x (FLASH_CORE_BACKWARD_...)
    flash_extra = (attention_core_backward_to_forward(training) - BACKWARD_TO_FORWARD) * parts["attention_core"]
    return model_flops_per_step(model, training) + (recomputed + flash_extra) * training.global_batch_size
