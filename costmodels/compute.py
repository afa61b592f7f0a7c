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

    efficiency(m, n, k) = peak_fraction / (1 + (half_saturation_dim / 3) · (1/m + 1/n + 1/k))

It is the roofline of one GEMM written as a sum of times: 2mnk FLOPs at peak_fraction × peak, plus the operand
traffic 2(mk + kn + mn) bytes at HBM speed, whose ratio to the FLOPs is (1/m + 1/n + 1/k); `half_saturation_dim`
absorbs HBM bandwidth, tile quantisation and kernel launch: a square GEMM of side `half_saturation_dim` runs at half
of `peak_fraction`. It is symmetric in (m, n, k), so the forward GEMM and its two backward GEMMs (same three
dimensions, permuted) get the same efficiency. fp8 GEMMs use `fp8_peak_fraction` of the fp8 peak and, where the
profile has it, their own `fp8_half_saturation_dim` (fp8 runs at twice the bf16 rate on operands of half the bytes,
so its roofline knee sits at another side; fitted from DeepGEMM's FP8 shapes) (profiles without
fp8 refuse it); the attention core (softmax, scores, values) always runs in bf16 (Transformer Engine keeps fused
attention in bf16), and uses the same curve with its (s/cp) × (s/cp) × head_dim shape.

Memory-bound work (layernorm, bias, GELU/SwiGLU, dropout, residual adds, softmax when not fused) is priced as HBM
traffic: `traffic_per_activation_byte` (profile section `elementwise:`) × the activation bytes Korthikanti et al.
itemise per layer / HBM bandwidth (see `elementwise_bytes_per_layer`). A layer's forward time is the sum of its GEMM
times and this traffic time; the backward is 2 × the forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile
from costmodels.params import padded_vocab_size
from costmodels.plan import PlanArrays, Recompute, layers_on_stage
from costmodels.specs import MlpKind, ModelSpec, Precision, TrainingSpec

BACKWARD_TO_FORWARD = 2.0
"""Backward runs two GEMMs (data gradient and weight gradient) per forward GEMM (arXiv 2104.04473, appendix)."""


# ---- GEMM efficiency -----------------------------------------------------------------------------------------

def gemm_efficiency(profile: HardwareProfile, m: "np.ndarray | float", n: "np.ndarray | float",
                    k: "np.ndarray | float", precision: str = "bf16") -> np.ndarray:
    """Fraction of the dense peak (of `precision`) reached by an m×k·k×n GEMM; curve in the module docstring."""
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
    return peak_fraction / (1.0 + half_saturation_dim / 3.0 * (1.0 / m + 1.0 / n + 1.0 / k))


ATTENTION_PARAMETERS = ("attention_peak_fraction", "attention_half_saturation_seq")
"""The fused attention kernel's own curve, fitted to measured FlashAttention / cuDNN SDPA forward + backward rates; a
profile without them prices the core with the GEMM curve."""


def attention_efficiency(profile: HardwareProfile, m: "np.ndarray | float", n: "np.ndarray | float",
                         k: "np.ndarray | float") -> np.ndarray:
    """Fraction of the bf16 peak a fused attention kernel (FlashAttention, cuDNN SDPA) reaches over its forward and
    backward, for m queries × n keys × head dim k:

        attention_efficiency = attention_peak_fraction / (1 + attention_half_saturation_seq / n)

    The kernel streams key/value blocks through on-chip memory (softmax on the special-function units, online
    rescaling, the causal diagonal's partly masked blocks), so its rate rolls off with the keys each query block
    sees far more steeply than a GEMM of the same shape: cuDNN SDPA on B200 runs at 9% of peak at 512 tokens and 58%
    at 64K (shared/reference/microbench/attention_*.csv). Every measured kernel has head dim 128, so the head dim does
    not enter (an MLA head of 192 is priced as 128). Without the profile's attention parameters: the GEMM curve."""
    params = profile.gemm_efficiency
    if not all(name in params for name in ATTENTION_PARAMETERS):
        return gemm_efficiency(profile, m, n, k, "bf16")
    keys = np.maximum(np.asarray(n, dtype=float), 1.0)
    return np.broadcast_to(params["attention_peak_fraction"] / (1.0 + params["attention_half_saturation_seq"] / keys),
                           np.broadcast_shapes(np.shape(m), np.shape(n), np.shape(k))).astype(float)


def gemm_time_s(profile: HardwareProfile, flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                precision: str) -> np.ndarray:
    """Seconds for `flops` of GEMMs of shape (m, n, k) at the achieved rate peak × efficiency."""
    peak = profile.peak_flops_per_s[precision]
    return flops / (peak * gemm_efficiency(profile, m, n, k, precision))


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
        gemms = [_linear(tokens, h, mla.kv_lora_rank + mla.qk_rope_head_dim),              # kv down (replicated)
                 _linear(tokens, mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim) / tp),
                 _linear(tokens, a * mla.v_head_dim / tp, h)]                              # output projection
        if mla.q_lora_rank:
            gemms += [_linear(tokens, h, mla.q_lora_rank),                                 # q down (replicated)
                      _linear(tokens, mla.q_lora_rank, a * mla.qk_head_dim / tp)]
        else:
            gemms.append(_linear(tokens, h, a * mla.qk_head_dim / tp))
        qk_dim, v_dim = mla.qk_head_dim, mla.v_head_dim
    else:
        gemms = [_linear(tokens, h, (model.q_size + 2 * model.kv_size) / tp),              # fused QKV
                 _linear(tokens, model.q_size / tp, h)]                                    # output projection
        qk_dim = v_dim = model.head_dim
    # attention core: 2·s²·a·(d_qk + d_v) per sequence forward when the full score matrix is computed and masked
    # (unfused attention: baddbmm + masked softmax, Megatron's pre-flash path); fused causal kernels (FlashAttention,
    # TE) skip the masked half: s²·a·(d_qk + d_v). Per GPU: heads / tp, queries / cp (CP load-balances the chunks).
    seq = float(training.seq_len)
    causal_skip = 0.5 if training.flash_attention else 1.0
    core_flops = causal_skip * 2.0 * plans.mbs * seq * seq * a * (qk_dim + v_dim) / (tp * plans.cp)
    chunk = seq / plans.cp
    gemms.append(Gemm(flops=core_flops, m=chunk, n=chunk, k=np.full(len(plans), float(qk_dim)),
                      attention_core=True))
    return gemms


def mlp_gemms(model: ModelSpec, tokens: np.ndarray, width: float, tp: np.ndarray) -> list[Gemm]:
    """A dense MLP of intermediate size `width`, column- then row-parallel over `tp`."""
    up = 2 * width if model.mlp is MlpKind.GATED else width                                # gate and up fused
    return [_linear(tokens, model.hidden_size, up / tp), _linear(tokens, width / tp, model.hidden_size)]


def moe_tokens_per_local_expert(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Average tokens each local expert GEMM sees per microbatch: the EP group's routed tokens over its experts.

    A GPU's attention handles mbs·s/(tp·cp) distinct tokens; each is sent to top_k experts, replicated over the
    etp ranks of an expert; the ep·etp GPUs of an expert group hold E/ep experts each:
    m_e = mbs·s·top_k·etp·ep / (tp·cp·E).
    """
    assert model.moe is not None
    moe = model.moe
    return (plans.mbs * training.seq_len * moe.top_k * plans.etp * plans.ep
            / (plans.tp * plans.cp * float(moe.num_experts)))


def moe_load_factor(training: TrainingSpec) -> float:
    """Busiest expert rank over the average: dropless routing lets the imbalance through; a capacity factor caps it
    (tokens beyond capacity are dropped; Fedus et al., Switch Transformer, arXiv 2101.03961 §2.1)."""
    if training.moe_capacity_factor is None:
        return training.moe_imbalance_factor
    return min(training.moe_imbalance_factor, training.moe_capacity_factor)


def moe_mlp_gemms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> list[Gemm]:
    """Router, routed experts (at the busiest rank's load) and shared experts of one MoE layer, per GPU."""
    assert model.moe is not None
    moe = model.moe
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    gemms = [_linear(tokens / tp, model.hidden_size, moe.num_experts)]                    # router (on SP tokens)
    expert_tokens = moe_tokens_per_local_expert(model, training, plans) * moe_load_factor(training)
    local_experts = moe.num_experts / plans.ep
    for gemm in mlp_gemms(model, expert_tokens, moe.expert_ffn_hidden_size, plans.etp.astype(float)):
        gemms.append(Gemm(flops=gemm.flops * local_experts, m=gemm.m, n=gemm.n, k=gemm.k))
    if moe.num_shared_experts:
        gemms += mlp_gemms(model, tokens, moe.shared_expert_ffn_hidden_size, tp)
    return gemms


def logits_gemms(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> list[Gemm]:
    """Output layer h × V_padded/tp on the last stage."""
    vocab = padded_vocab_size(model, plans.tp).astype(float)
    return [_linear(_tokens(training, plans), model.hidden_size, vocab / plans.tp)]


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


def elementwise_bytes_per_layer(model: ModelSpec, training: TrainingSpec, plans: PlanArrays,
                                moe_layer: bool) -> tuple[np.ndarray, np.ndarray]:
    """(layer, attention-score) activation bytes one GPU's non-GEMM kernels touch in one layer's forward.

    Korthikanti et al. (arXiv 2205.05198 §4.1) itemise a GPT layer's activations as s·b·h·(34 + 5·a·s/h) bytes:
    layernorms 4, attention 11 (+ 5·a·s/h for the scores, softmax and its dropout), MLP 19. Generalised to the
    real shape: the replicated part (two norm inputs 4, the two block inputs 2 + 2, two dropout masks 1 + 1:
    10·s·b·h) is split over tp only with sequence parallelism (§4.2.2); the TP-split part is Q, K, V and the
    attention output (2q + 2q + 4kv)/h and the MLP interior (2 + 2 bytes per F column, plus 2 for the gate when
    gated); the scores part 5·a·s²·b/tp is absent with flash attention (never materialised).
    These bytes are written and re-read by the layernorm, GELU/SwiGLU, dropout, bias and softmax kernels.
    """
    h = model.hidden_size
    tokens = plans.mbs * training.seq_len / plans.cp.astype(float)
    tp = plans.tp.astype(float)
    replicated = 10.0 * tokens * h / np.where(plans.sp, tp, 1.0)
    attention_split = tokens * (4.0 * model.q_size + 4.0 * model.kv_size) / tp
    per_column = 6.0 if model.mlp is MlpKind.GATED else 4.0
    if moe_layer and model.moe is not None:
        moe = model.moe
        expert_tokens = moe_tokens_per_local_expert(model, training, plans) * moe_load_factor(training) \
            * moe.num_experts / plans.ep
        mlp_split = expert_tokens * per_column * moe.expert_ffn_hidden_size / plans.etp
        if moe.num_shared_experts:
            mlp_split = mlp_split + tokens * per_column * moe.shared_expert_ffn_hidden_size / tp
        # token permutation around the all-to-all (Megatron-Core moe/moe_utils.py `permute` / `unpermute`): the
        # GPU's tokens are copied top_k times into expert order before dispatch and gathered back after combine,
        # 2 bytes per value each way
        local_tokens = tokens / np.where(plans.sp, tp, 1.0)
        mlp_split = mlp_split + 2.0 * 2.0 * local_tokens * moe.top_k * h * moe_load_factor(training)
    else:
        mlp_split = tokens * per_column * model.ffn_hidden_size / tp
    layer_bytes = replicated + attention_split + mlp_split
    if training.flash_attention:
        score_bytes = np.zeros(len(plans))
    else:
        score_bytes = 5.0 * model.num_attention_heads * training.seq_len * tokens / tp
    return layer_bytes, score_bytes


# ---- seconds -------------------------------------------------------------------------------------------------

def _gemms_time_s(profile: HardwareProfile, training: TrainingSpec, gemms: list[Gemm],
                  attention_core: "bool | None" = None) -> np.ndarray:
    precision = training.precision.value
    total = np.zeros(len(gemms[0].flops)) if gemms else 0.0
    for gemm in gemms:
        if attention_core is not None and gemm.attention_core != attention_core:
            continue
        if gemm.attention_core and training.flash_attention:  # fused kernel: its own measured curve
            total = total + gemm.flops / (profile.peak_flops_per_s["bf16"]
                                          * attention_efficiency(profile, gemm.m, gemm.n, gemm.k))
        else:
            total = total + gemm_time_s(profile, gemm.flops, gemm.m, gemm.n, gemm.k,
                                        "bf16" if gemm.attention_core else precision)
    return total


@dataclass(frozen=True)
class LayerTimes:
    """Forward seconds per microbatch per GPU of the building blocks of a stage."""

    dense_layer_fwd_s: np.ndarray
    moe_layer_fwd_s: np.ndarray
    attention_core_fwd_s: np.ndarray
    logits_fwd_s: np.ndarray
    mtp_fwd_s: np.ndarray
    """All MTP modules together (their decoder layers included), on the last stage."""


def layer_times_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec,
                  plans: PlanArrays) -> LayerTimes:
    tokens = _tokens(training, plans)
    tp = plans.tp.astype(float)
    attention = attention_gemms(model, training, plans)
    seconds_per_byte = elementwise_traffic_factor(profile) / profile.hbm_bandwidth_bytes_per_s
    dense_bytes, score_bytes = elementwise_bytes_per_layer(model, training, plans, moe_layer=False)
    core_s = _gemms_time_s(profile, training, attention, attention_core=True) + score_bytes * seconds_per_byte
    attention_s = _gemms_time_s(profile, training, attention, attention_core=False) + core_s
    dense_s = attention_s + _gemms_time_s(profile, training, mlp_gemms(model, tokens, model.ffn_hidden_size, tp)) \
        + dense_bytes * seconds_per_byte
    moe_s = np.zeros(len(plans))
    if model.moe is not None:
        moe_bytes, _ = elementwise_bytes_per_layer(model, training, plans, moe_layer=True)
        moe_s = attention_s + _gemms_time_s(profile, training, moe_mlp_gemms(model, training, plans)) \
            + moe_bytes * seconds_per_byte
    logits_s = _gemms_time_s(profile, training, logits_gemms(model, training, plans))
    mtp_s = np.zeros(len(plans))
    if model.num_mtp_layers:
        module_s = (moe_s if model.is_moe else dense_s) + \
            _gemms_time_s(profile, training, mtp_extra_gemms(model, training, plans))
        mtp_s = model.num_mtp_layers * module_s
    return LayerTimes(dense_s, moe_s, core_s, logits_s, mtp_s)


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
    moe_mlp = 0.0
    if model.moe is not None:
        moe = model.moe
        moe_mlp = 2.0 * training.seq_len * model.hidden_size * moe.num_experts + moe.top_k * dense_mlp \
            * moe.expert_ffn_hidden_size / model.ffn_hidden_size
        if moe.num_shared_experts:
            moe_mlp += dense_mlp * moe.shared_expert_ffn_hidden_size / model.ffn_hidden_size
    logits = 2.0 * training.seq_len * model.hidden_size * model.vocab_size
    layer_flops = {"dense": projections + core + dense_mlp, "moe": projections + core + moe_mlp}
    mtp = model.num_mtp_layers * (layer_flops["moe" if model.is_moe else "dense"]
                                  + 2.0 * training.seq_len * 2 * model.hidden_size ** 2 + logits)
    return {"layers": model.num_dense_layers * layer_flops["dense"] + model.num_moe_layers * layer_flops["moe"],
            "attention_core": model.num_layers * core, "logits": logits, "mtp": mtp}


def model_flops_per_step(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one step without recompute: 3 × forward (≈ 6·N_active·tokens + causal attention)."""
    parts = _forward_flops_per_sequence(model, training)
    forward = parts["layers"] + parts["logits"] + parts["mtp"]
    return float((1.0 + BACKWARD_TO_FORWARD) * forward * training.global_batch_size)


def hardware_flops_per_step(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """FLOPs actually executed per step: model FLOPs plus the recomputed forward passes."""
    parts = _forward_flops_per_sequence(model, training)
    layers = layers_on_stage(model.num_layers, plans, 0)  # block-method fraction; stage-uniform when split evenly
    full_fraction = recomputed_layer_fraction(plans, layers)
    selective = plans.recompute == Recompute.SELECTIVE
    recomputed = np.where(selective, parts["attention_core"], full_fraction * parts["layers"])
    return model_flops_per_step(model, training) + recomputed * training.global_batch_size
