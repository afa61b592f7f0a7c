"""Step time of a training iteration as an explicit sum of named terms, vectorised over plans.

    step = compute + tp_comm + cp_comm + ep_comm + host + pp_bubble + pp_p2p + dp_comm + optimizer

Per-microbatch terms (compute, tp_comm, cp_comm, ep_comm) are each taken on the pipeline stage where that term is
largest (candidates: first, second, second-to-last and last rank) and multiplied by the microbatch count m; taking
each term's own worst stage keeps every term a function of few knobs (see TERM_KNOBS) and is exact when the stages
hold equal layers, conservative (by the logits/embedding imbalance) otherwise. The pipeline bubble is
(p-1)/v of one microbatch's stage time (compute + exposed TP/CP + EP), arXiv 2104.04473 eq. 2, under 1F1B; the
zero-bubble schedules fill part or all of it with weight-gradient passes (pipeline.zero_bubble_s).

`host` is what the host adds to the GPU's work of a micro-batch on its worst stage: kernel launches the GPU waits
for and the queue drained at every device-to-host synchronisation of the engine that runs the step (costmodels.engines
counts them, costmodels.host_timeline turns them into GPU idle time); a micro-batch's pipeline bubble carries it too.

Sources for each term are cited in the function that computes it; the formulas of the pieces live in
costmodels.compute (FLOPs, GEMM efficiency), costmodels.comm (placement, alpha–beta) and costmodels.pipeline.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from costmodels import compute as compute_model
from costmodels import engines, host_timeline, memory
from costmodels.comm import (cp_group, deepep_all_to_all_time_s, dp_cp_group, edp_group, ep_group, etp_group,
                             group_collective_time_s, place_group, stage_group, tp_group)
from costmodels.hardware import OVERLAP_TERMS, HardwareProfile
from costmodels.params import (moe_layers_before, moe_layers_on_stage, padded_vocab_size,
                               stage_embedding_params_per_gpu, stage_params_per_gpu)
from costmodels.pipeline import (ACTIVATION_BYTES, bubble_is_proportional, bubble_microbatch_equivalents,
                                 interleaved_warmup_chunks, p2p_transfer_counts, p2p_transfer_s, zero_bubble_s)
from costmodels.plan import (PlanArrays, Recompute, RecomputeModule, as_plan_arrays, data_parallel_size,
                             layers_on_stage, num_microbatches, recomputes_module)
from costmodels.specs import (ClusterSpec, Engine, Fp8Recipe, ModelSpec, MoEDispatcher, Precision, TrainingSpec,
                              fp8_copy_bytes_per_element)
from costmodels.structure import per_knobs, per_structure, stage_list

PARAM_BYTES = 2
"""bf16 parameters, all-gathered by the distributed optimizer / ZeRO-3 (the embedding and output layer always; the
decoder layers' at TrainingSpec.param_gather_bytes_by_zero, fp8 with fp8_param_gather)."""
ADAM_BYTES_PER_PARAM = 34
"""HBM traffic of one fused Adam update per parameter: read fp32 param, grad, m, v (16), write fp32 param, m, v and
the bf16 copy (14), plus the fp32 gradient read of the global-norm clip (4) (Megatron `optimizer/optimizer.py`:
clip_grad_norm then Adam, apex/TE multi-tensor kernels)."""
BF16_GRAD_COPY_BYTES_PER_PARAM = 6
"""With bf16 main gradients (TrainingSpec.grad_reduce_in_fp32 off) Megatron's optimizers first copy each gradient
to fp32 (distrib_optimizer.py _copy_model_grads_to_main_grads, optimizer.py Float16OptimizerWithFloat16Params:
`.float()`): read 2 bytes, write 4."""

TERM_KNOBS: dict[str, tuple[str, ...]] = {
    # m × per-microbatch stage FLOP time; m = gbs/(dp·mbs) brings (tp, cp, pp, mbs); layers per stage bring
    # (pp, first/last_stage_layers); recompute_layers acts per virtual chunk (vpp); MoE expert GEMMs (ep, etp);
    # sp splits the norm/dropout elementwise work over tp.
    "compute": ("tp", "cp", "pp", "mbs", "sp", "recompute", "recompute_layers", "recompute_modules", "vpp", "ep",
                "etp", "first_stage_layers", "last_stage_layers"),
    # with --tp-comm-overlap the exposed part depends on the linear GEMM time it hides behind (compute's knobs)
    "tp_comm": ("tp", "cp", "pp", "mbs", "sp", "recompute", "recompute_layers", "recompute_modules", "vpp", "ep",
                "etp", "first_stage_layers", "last_stage_layers"),
    # ring exchange exposed beyond the attention core it overlaps with
    "cp_comm": ("tp", "cp", "pp", "mbs", "recompute", "recompute_layers", "recompute_modules", "vpp",
                "first_stage_layers", "last_stage_layers"),
    # the host's launches and synchronisations beside the micro-batch's GPU work (compute's and the collectives'
    # knobs); zero under FSDP / ZeRO engines, whose per-layer gathers the host launches (engines.host_reads_zero)
    "host": ("tp", "cp", "pp", "mbs", "sp", "recompute", "recompute_layers", "recompute_modules", "vpp", "ep",
             "etp", "zero", "first_stage_layers", "last_stage_layers"),
    # with --overlap-moe-expert-parallel-comm: hidden behind another micro-batch's compute (compute's knobs)
    "ep_comm": ("tp", "cp", "pp", "mbs", "sp", "ep", "etp", "recompute", "recompute_layers", "recompute_modules",
                "vpp", "first_stage_layers", "last_stage_layers"),
    # (p-1)/v × (per-microbatch compute + tp + cp + ep + host): the union of those five plus vpp
    "pp_bubble": ("tp", "cp", "pp", "vpp", "mbs", "sp", "ep", "etp", "zero", "recompute", "recompute_layers",
                  "recompute_modules", "first_stage_layers", "last_stage_layers"),
    # with --overlap-p2p-communication the steady-state backward sends hide behind a chunk's forward (layer knobs)
    "pp_p2p": ("tp", "cp", "pp", "vpp", "mbs", "sp", "ep", "etp"),
    # gradient sync of the stage's parameters, hidden behind one microbatch's backward (its compute knobs)
    "dp_comm": ("tp", "cp", "pp", "mbs", "sp", "ep", "etp", "zero", "recompute", "recompute_layers",
                "recompute_modules", "vpp", "first_stage_layers", "last_stage_layers"),
    # the Adam step over the stage's parameters; under Megatron-Core the DDP buckets' NaN checks too, whose count
    # depends on the model chunks (vpp: each its own buffers; engines.megatron_bucket_checks)
    "optimizer": ("tp", "cp", "pp", "vpp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers"),
    # fine-grained activation offloading's copies beyond the layer compute they overlap (compute's and the stored
    # activations' knobs); a term only when TrainingSpec.offload_modules names some
    "offload_copies": ("tp", "cp", "pp", "mbs", "sp", "ep", "etp", "recompute", "recompute_layers",
                       "recompute_modules", "vpp", "first_stage_layers", "last_stage_layers"),
}
"""For each term of `step_time_terms_s`, the Plan fields it depends on (dp counts through tp, cp, pp; the number of
microbatches through tp, cp, pp, mbs). Under 1F1B pp_bubble factors as bubble_microbatch_equivalents(pp, vpp) × the
sum of the compute, tp_comm, cp_comm and ep_comm terms divided by m: a solver can form it as a product of two
variables instead of tabulating it over all its knobs (pipeline.bubble_is_proportional; the zero-bubble schedules'
bubble is an ordinary term on the same knobs, and so is 1F1B's under --overlap-moe-expert-parallel-comm, whose
bubble takes the whole all-to-all of its unpaired chunks while ep_comm carries the overlap's discount)."""


# ---- profile knobs -----------------------------------------------------------------------------------------------

def overlap_fraction(profile: HardwareProfile, name: str) -> float:
    """Fraction of a communication hidden behind compute, from the profile's `overlap:` section (0 if absent).
    hardware.parse_profile has checked the section: known names, values in [0, 1]."""
    assert name in OVERLAP_TERMS, f"{name!r} is not one of hardware.OVERLAP_TERMS"
    section = profile.extra.get("overlap", {}) or {}
    return float(section.get(name, 0.0))


TE_USERBUFFERS_SM_MARGIN = 16
"""SMs Transformer Engine's userbuffers hold beside the GEMMs they overlap with the 'pipeline' and 'bulk' methods:
TE `pytorch/module/base.py` initialize_ub, get_default_config: num_sm = 16 and set_sm_margin = True for both, so
the GEMM itself is launched on the other SMs (proj_fprop / fc2_fprop: pipeline; qkv_/fc1_ dgrad and wgrad: bulk);
the 'ring_exchange' method (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) uses one SM and the copy engines."""


DEEPEP_NUM_SMS = 20
"""SMs DeepEP's normal kernels run on under Megatron-Core's flex dispatcher (TransformerConfig.moe_deepep_num_sms,
default 20; `moe/fused_a2a.py` set_deepep_num_sms -> deep_ep Buffer.set_num_sms)."""


def ep_comm_sms(training: TrainingSpec) -> int:
    """SMs the EP dispatch and combine hold while they overlap compute: DeepEP's kernels or NCCL's CTAs."""
    return DEEPEP_NUM_SMS if training.moe_dispatcher is MoEDispatcher.DEEPEP else training.nccl_ctas


def overlap_contention_share(profile: HardwareProfile, comm_sms: int) -> float:
    """Fraction of the GPU's SMs a communication kernel of `comm_sms` CTAs holds while it runs (0 where the profile
    does not state its SM count). A CTA of a large GEMM needs a whole SM (its shared memory and registers), so the
    compute beside the collective runs on the other SMs."""
    sms = profile.streaming_multiprocessors
    return min(comm_sms, sms) / sms if sms else 0.0


def overlapped_exposed_s(comm_s: "np.ndarray | float", window_s: "np.ndarray | float", share: float) -> np.ndarray:
    """What a collective of `comm_s` run beside `window_s` of compute adds to the step, its CTAs holding `share` of
    the SMs: while both run the compute advances at (1 − share) of its rate, so the pair ends at
    max(comm, window + share·comm): its excess over the window or share × its length, whichever is larger.
    A lower bound on the contention: a GEMM whose grid fills the whole GPU can lose a wave more."""
    comm_s = np.asarray(comm_s, dtype=float)
    return np.maximum(comm_s - window_s, share * comm_s)


def sm_margin_s(profile: HardwareProfile, margin_sms: int, gemm_s: np.ndarray) -> np.ndarray:
    """Extra time of GEMMs launched on all SMs but `margin_sms` (Transformer Engine's set_sm_margin): they run at
    (SMs − margin)/SMs of their rate for their whole length. 0 where the profile does not state its SM count."""
    sms = profile.streaming_multiprocessors
    if not sms or margin_sms >= sms:
        return np.zeros_like(gemm_s)
    return gemm_s * margin_sms / (sms - margin_sms)


# ---- per-stage, per-microbatch pieces ----------------------------------------------------------------------------

@dataclass(frozen=True)
class StageMicrobatch:
    """Seconds per microbatch on one pipeline stage, by term."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray
    tp_comm_s: np.ndarray
    cp_comm_s: np.ndarray
    ep_comm_s: np.ndarray
    weight_grad_s: "np.ndarray | float" = 0.0
    """The part of backward_s that is weight-gradient GEMMs (the zero-bubble schedules' W; `stage_weight_grad_s`)."""
    ep_paired_exposed_s: "np.ndarray | float" = 0.0
    """What ep_comm_s adds where the EP-overlap schedule pairs this micro-batch with another (`ep_paired_exposed_s`)."""
    host_s: "np.ndarray | float" = 0.0
    """What the host adds to this micro-batch's GPU work on the stage (`stage_host_s`)."""

    @property
    def compute_s(self) -> np.ndarray:
        return self.forward_s + self.backward_s + self.recompute_s


def candidate_stages(plans: PlanArrays) -> list[np.ndarray]:
    """First, second, second-to-last and last rank: the stages that can differ (embedding, logits, uneven split)."""
    return stage_list(plans, ("candidate_stages",), _candidate_stages)


def _candidate_stages(plans: PlanArrays) -> list[np.ndarray]:
    last = plans.pp - 1
    return [np.zeros_like(last), np.minimum(1, last), np.maximum(last - 1, 0), last]


def first_equal_stage(stages: list[np.ndarray]) -> list[int]:
    """For each candidate stage array, the position of the first one equal to it (itself when none before is): with
    pp = 1 all four are rank 0, with pp = 2 the second-to-last is the first. A stage's pieces are priced once and
    reused where the same ranks recur (the same values: the pieces are functions of the rank)."""
    return [next(j for j in range(k + 1) if j == k or np.array_equal(stages[j], stage))
            for k, stage in enumerate(stages)]


def per_distinct_stage(stages: list[np.ndarray], price) -> list:
    """[price(stage) for stage in stages], each distinct rank array priced once (`first_equal_stage`)."""
    out: list = []
    for k, first in enumerate(first_equal_stage(stages)):
        out.append(out[first] if first < k else price(stages[k]))
    return out


LAYER_KNOBS: tuple[str, ...] = ("tp", "cp", "ep", "etp", "mbs", "sp", "recompute", "recompute_modules")
"""What one layer's times (compute.layer_times_s) and collectives (`layer_comm_s`) read: not the pipeline (pp, vpp,
the split), ZeRO or recompute_layers, which enter only through the stage functions that scale them by the stage's
layer counts. A search evaluates them once per distinct combination (costmodels.structure.per_knobs)."""


@dataclass(frozen=True)
class LayerComm:
    """Seconds per microbatch of one decoder layer's collectives, before the stage functions scale them by the
    stage's layers and recompute passes (tp_comm_s, cp_comm_s, ep_all_to_all_s cite the sources)."""

    tp_block_s: np.ndarray
    """One TP block's collectives (2 all-reduces, or with SP an all-gather + reduce-scatter) on the tp group."""
    etp_block_s: np.ndarray
    """The same for a routed-expert block on the etp group (0 for a dense model)."""
    tp_gather_s: np.ndarray
    """One SP all-gather on the tp group (with --tp-comm-overlap each hides behind its own GEMM)."""
    tp_scatter_s: np.ndarray
    """One SP reduce-scatter on the tp group."""
    tp_amax_s: np.ndarray
    """One FP8 amax all-reduce on the tp group (per-tensor current scaling with SP; else 0)."""
    tp_backward_extra_s: np.ndarray
    """What one TP block's backward all-gather costs beyond its forward one (block-scaled fp8 with SP; else 0)."""
    cp_forward_s: np.ndarray
    """Exposed CP ring exchange of one layer's forward pass."""
    cp_backward_s: np.ndarray
    """... and of its backward pass."""
    ep_all_to_all_s: np.ndarray
    """One EP all-to-all (a dispatch or a combine) of one MoE layer (0 for a dense model)."""
    mla_gather_saving_s: np.ndarray
    """What an MLA attention block's SP all-gather costs less than tp_gather_s (mla_gather_saving_s; 0 without)."""


def layer_comm_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                 times: compute_model.LayerTimes) -> LayerComm:
    tp_block, etp_block, gather, scatter, amax, backward_extra = tp_block_s(model, cluster, training, plans)
    cp_forward, cp_backward = cp_exchange_s(model, cluster, training, plans, times.attention_core_fwd_s,
                                            times.core_backward_s(training))
    return LayerComm(tp_block_s=tp_block, etp_block_s=etp_block, tp_gather_s=gather, tp_scatter_s=scatter,
                     tp_amax_s=amax, tp_backward_extra_s=backward_extra, cp_forward_s=cp_forward,
                     cp_backward_s=cp_backward,
                     ep_all_to_all_s=ep_all_to_all_one_s(model, cluster, training, plans),
                     mla_gather_saving_s=mla_gather_saving_s(model, cluster, training, plans, gather))


def layer_pieces(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays
                 ) -> tuple[compute_model.LayerTimes, LayerComm]:
    """One layer's times and collectives, per plan: evaluated once per distinct LAYER_KNOBS combination of a search
    (costmodels.structure.per_knobs), or directly."""
    def evaluate(sub: PlanArrays) -> tuple[compute_model.LayerTimes, LayerComm]:
        times = compute_model.layer_times_s(model, cluster.profile, training, sub)
        return times, layer_comm_s(model, cluster, training, sub, times)

    return per_knobs(plans, LAYER_KNOBS, evaluate, key=("layer_pieces", id(model), id(cluster), id(training)))


def stage_compute_s(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, times: compute_model.LayerTimes,
                    stage: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, recompute) seconds per microbatch on `stage`: layer GEMM times × layers on the stage,
    logits, loss and MTP on the last; backward = 2 × forward (arXiv 2104.04473 appendix), 2.5 × for a fused attention
    core (compute.FLASH_CORE_BACKWARD_TO_FORWARD); recompute per
    arXiv 2205.05198 §4 (selective: attention core forward; full: whole layer forward)."""
    layers = layers_on_stage(model.num_layers, plans, stage)
    moe_layers = moe_layers_on_stage(model, plans, stage)
    dense_layers = layers - moe_layers
    layer_forward = dense_layers * times.dense_layer_fwd_s + moe_layers * times.moe_layer_fwd_s
    is_last = stage == plans.pp - 1
    forward = layer_forward + np.where(is_last, times.logits_fwd_s + times.mtp_fwd_s, 0.0)
    # the attention core's backward is its own kernel's (compute.attention_core_backward_s: 2.5x the forward FLOPs
    # at the backward's measured rate for a fused kernel), not 2x its forward
    core_extra_s = times.core_backward_s(training) - compute_model.BACKWARD_TO_FORWARD * times.attention_core_fwd_s
    backward = compute_model.BACKWARD_TO_FORWARD * forward + layers * core_extra_s \
        + moe_layers * times.moe_layer_bwd_extra_s      # grouped-kernel wgrad accumulation, one-pass dispatch copies
    # the cross entropy's memory-bound kernels, forward and backward each from its own byte count
    forward = forward + np.where(is_last, times.loss_fwd_s, 0.0)
    backward = backward + np.where(is_last, times.loss_bwd_s, 0.0)
    full_fraction = compute_model.recomputed_layer_fraction(plans, layers)
    selective = dense_layers * times.selective_dense_fwd_s + moe_layers * times.selective_moe_fwd_s
    recompute = np.where(plans.recompute == Recompute.SELECTIVE, selective, full_fraction * layer_forward)
    return forward, backward, recompute


def stage_weight_grad_s(model: ModelSpec, plans: PlanArrays, times: compute_model.LayerTimes,
                        stage: np.ndarray) -> np.ndarray:
    """Seconds per microbatch of `stage`'s weight-gradient GEMMs, the W pass of a zero-bubble schedule: one per
    forward GEMM with weights, with its FLOPs (dL/dW = x^T · dL/dy; arXiv 2401.10241 §2.3 and Table 1: W of a layer
    is sbh·24h FLOPs, its F sbh·(24h + 4s)), priced at the forward GEMM's rate; the output layer's on the last
    stage. The attention core has no weights: its whole backward is B."""
    layers = layers_on_stage(model.num_layers, plans, stage)
    moe_layers = moe_layers_on_stage(model, plans, stage)
    per_layers = (layers - moe_layers) * times.dense_weight_gemm_fwd_s + moe_layers * times.moe_weight_gemm_fwd_s
    return per_layers + np.where(stage == plans.pp - 1, times.logits_fwd_s, 0.0)


def tp_gather_bytes_per_element(training: TrainingSpec, backward: bool = False) -> float:
    """Bytes per element of a sequence-parallel all-gather into a linear layer: in FP8, Transformer Engine casts the
    local shard first and gathers the FP8 copy with its scales (TE module/linear.py: `inputmat =
    input_quantizer(inputmat)` then `gather_along_first_dim(inputmat, tp_group, quantizer=...)`), with or without
    userbuffers; the reduce-scatters carry the bf16 GEMM outputs. The row-parallel `backward` gathers its quantized
    output gradient alike (module/base.py grad_output_preprocess), both layouts under block scaling (the quantizer
    wants rowwise and columnwise data there, and distributed.py _all_gather_mxfp8 / _start_all_gather_fp8_blockwise
    gather each with its scales): 2 copies, a little more than bf16. In bf16, the bf16 activation."""
    recipe = training.fp8_scaling
    if recipe is None:
        return float(ACTIVATION_BYTES)
    return (2.0 if backward and recipe.block_scaled else 1.0) * fp8_copy_bytes_per_element(recipe)


AMAX_BYTES = 4
"""One fp32 amax."""


def fp8_amax_reduction_s(cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """One TP block's amax all-reduce per pass under per-tensor current scaling with sequence parallelism: the
    column-parallel input's amax (forward, and a recomputed forward) and the row-parallel output gradient's
    (backward) are all-reduced over the tp group before the scale is set, so every rank casts its shard alike (TE
    module/linear.py set_quantizer_amax_reduction_group; csrc/quantizer.cpp quantize_impl: allreduce(MAX) and wait
    before nvte_compute_scale_from_amax). A 4-byte all-reduce: its latency, on the critical path beside nothing
    (userbuffers do not carry it). 0 for other recipes, bf16, without SP or at tp 1."""
    if training.fp8_scaling is not Fp8Recipe.TENSORWISE:
        return np.zeros(len(plans))
    reduce_s = group_collective_time_s(cluster.profile, tp_group(plans, cluster.nvlink_domain_gpus), "all_reduce",
                                       float(AMAX_BYTES))
    return np.where(plans.sp & (plans.tp > 1), reduce_s, 0.0)


AMAXES_PER_LINEAR_PASS = 3
"""Amaxes one Transformer Engine linear layer records per pass under delayed scaling: input, weight and output
(forward), or the gradients (backward) (TE's fp8 meta: 3 forward, 2 backward scaling factors per GEMM; 3, an upper
bound, for both)."""


def fp8_delayed_amax_reduction_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                                 stage: np.ndarray) -> np.ndarray:
    """One pass's amax all-reduce under delayed scaling: Megatron-Core wraps a model chunk's layers in one fp8
    autocast (transformer_block.py) whose amax reduction group spans the stage's ranks, tp·cp·dp (fp8_utils.py
    get_fp8_context: get_amax_reduction_group(with_context_parallel=True)), and TE reduces every amax the pass
    recorded in one blocking all-reduce when it leaves the autocast, forward and backward (pytorch/quantization.py
    reduce_and_update_fp8_tensors: all_reduce(MAX)). A few hundred bytes: its latency over a group that crosses
    nodes once dp > 1; the bytes count the four linear layers of a layer (not MLA's extra ones nor each expert's),
    which the latency dwarfs. 0 in bf16 and under the other recipes (current and block scaling take each tensor's
    own)."""
    if training.fp8_scaling is not Fp8Recipe.DELAYED:
        return np.zeros(len(plans))
    linears = 4.0 * layers_on_stage(model.num_layers, plans, stage)      # qkv, proj, fc1, fc2 per layer
    amax_bytes = linears * AMAXES_PER_LINEAR_PASS * AMAX_BYTES
    return group_collective_time_s(cluster.profile, stage_group(plans, cluster.num_gpus, cluster.nvlink_domain_gpus),
                                   "all_reduce", amax_bytes)


def tp_block_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tp block, etp block, tp all-gather, tp reduce-scatter, amax all-reduce, backward extra) seconds of one TP
    block's collectives in a forward pass (see tp_comm_s): 2 all-reduces of the b·(s/cp)·h activation, or with SP an
    all-gather (FP8 in fp8, `tp_gather_bytes_per_element`) + reduce-scatter of the same elements, plus current
    scaling's amax all-reduce (`fp8_amax_reduction_s`; each also returned alone, for --tp-comm-overlap); what the
    backward's all-gather costs beyond the forward's (block scaling gathers two copies there); a routed-expert block
    moves top_k·etp/tp of it (× the load factor, bf16: the dispatcher's own collectives) on the etp group (0 for a
    dense model)."""
    profile = cluster.profile
    activation_elements = plans.mbs * (training.seq_len / plans.cp) * model.hidden_size
    activation_bytes = activation_elements * ACTIVATION_BYTES

    def block_s(placement, bytes_):
        reduce_s = group_collective_time_s(profile, placement, "all_reduce", bytes_)
        split_s = group_collective_time_s(profile, placement, "all_gather", bytes_) + \
            group_collective_time_s(profile, placement, "reduce_scatter", bytes_)
        return np.where(plans.sp, split_s, reduce_s)

    tp_placement = tp_group(plans, cluster.nvlink_domain_gpus)
    gather_s = group_collective_time_s(profile, tp_placement, "all_gather",
                                       activation_elements * tp_gather_bytes_per_element(training))
    scatter_s = group_collective_time_s(profile, tp_placement, "reduce_scatter", activation_bytes)
    backward_gather_s = group_collective_time_s(
        profile, tp_placement, "all_gather", activation_elements * tp_gather_bytes_per_element(training, backward=True))
    backward_extra_s = np.where(plans.sp, backward_gather_s - gather_s, 0.0)
    amax_s = fp8_amax_reduction_s(cluster, training, plans)
    tp_block = np.where(plans.sp, gather_s + scatter_s + amax_s,
                        group_collective_time_s(profile, tp_placement, "all_reduce", activation_bytes))
    etp_block = np.zeros(len(plans))
    if model.moe is not None and engines.moe_router_replicated(training):
        etp_block = tp_block      # torchtitan: the MoE input all-gathered over TP, its output reduce-scattered
    elif model.moe is not None:
        etp_block = expert_tp_block_s(model, cluster, training, plans, block_s, activation_bytes)
    return tp_block, etp_block, gather_s, scatter_s, amax_s, backward_extra_s


def tp_comm_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              stage: np.ndarray, overlap: "compute_model.TpOverlapGemms | None" = None,
              comm: "LayerComm | None" = None) -> np.ndarray:
    """Exposed TP/SP collectives per microbatch on `stage`.

    Megatron TP (Shoeybi et al., arXiv 1909.08053 §3): per layer 2 all-reduces forward (after attention and MLP)
    and 2 backward of the b·(s/cp)·h activation; with SP each becomes an all-gather + reduce-scatter of the same
    volume (Korthikanti et al., arXiv 2205.05198 §4.2.2); full recompute repeats the 2 forward ones (§5).
    MoE layers: the attention half (and a shared-expert MLP) on the tp group, the routed-expert half on the etp group;
    under torchtitan the whole MoE block (shared experts included) one TP block, plus expert TP's gradient all-reduce
    (`routed_input_grad_reduce_s`). One block of each is `tp_block_s` (`comm` when given).
    With `training.tp_comm_overlap` (and SP) each collective of a TP block hides behind the one GEMM it is fused with
    (`overlap`, see `tp_block_overlapped_s`); the routed experts' etp collectives are not userbuffer-fused and stay
    exposed; the GEMMs Transformer Engine runs beside its userbuffer SMs pay `tp_overlap_sm_margin_s`. The
    profile's `overlap.tp_comm` fraction (default 0) applies on top of the collectives, for calibrated profiles.
    Under MLA the attention block's all-gather carries its latents (`mla_gather_saving_s`).
    In fp8 the SP all-gathers carry fp8 (`tp_gather_bytes_per_element`), current scaling adds its amax all-reduce
    per block and pass (`fp8_amax_reduction_s`), delayed scaling one amax all-reduce per pass over the stage's ranks
    (`fp8_delayed_amax_reduction_s`), counted here with the other collectives of the stage's micro-batch.
    """
    profile = cluster.profile
    tp_block, etp_block, gather_s, scatter_s, amax_s, backward_extra_s = (
        (comm.tp_block_s, comm.etp_block_s, comm.tp_gather_s, comm.tp_scatter_s, comm.tp_amax_s,
         comm.tp_backward_extra_s) if comm is not None else tp_block_s(model, cluster, training, plans))
    layers = layers_on_stage(model.num_layers, plans, stage)
    moe_layers = moe_layers_on_stage(model, plans, stage)
    recomputed = compute_model.recomputed_layer_fraction(plans, layers)
    per_block = 2.0 + recomputed                               # fwd + bwd (+ recomputed fwd) per TP block
    # attention blocks, dense-MLP blocks, and the shared-expert MLP of MoE layers: Megatron-Core's SharedExpertMLP is
    # an ordinary TP MLP (moe/shared_experts.py: MLP.forward through Transformer Engine's linear layers, so its SP
    # gather is FP8 in fp8 like the others'; only --moe-shared-expert-overlap, not modelled, gathers outside TE)
    # (torchtitan's shared experts run on the MoE block's gathered input, inside its collectives: etp_block)
    has_shared = model.moe is not None and bool(model.moe.num_shared_experts) \
        and not engines.moe_router_replicated(training)
    shared_expert_blocks = moe_layers if has_shared else 0.0
    block_count = 2.0 * layers - moe_layers + shared_expert_blocks
    total = per_block * block_count * tp_block + block_count * backward_extra_s
    if training.tp_comm_overlap and overlap is not None:    # userbuffers gather one copy: no backward extra
        def blocks(block):
            return (layers * block(overlap.attention_in_s, overlap.attention_out_s)
                    + (layers - moe_layers) * block(overlap.mlp_in_s, overlap.mlp_out_s)
                    + (moe_layers * block(overlap.shared_in_s, overlap.shared_out_s) if has_shared else 0.0))

        overlapped = plans.sp & (plans.tp > 1)
        total = np.where(overlapped, blocks(lambda in_s, out_s: tp_block_overlapped_s(
            gather_s, scatter_s, in_s, out_s, plans.tp, recomputed) + per_block * amax_s), total)
        # the userbuffer SMs slow GEMMs, not collectives: outside the calibrated overlap fraction below
        margin = np.where(overlapped, blocks(lambda in_s, out_s: tp_overlap_sm_margin_s(profile, in_s, out_s,
                                                                                           recomputed)), 0.0)
    else:
        margin = 0.0
        # MLA under sequence parallelism gathers the attention's latents, not the hidden states
        saving = comm.mla_gather_saving_s if comm is not None else mla_gather_saving_s(model, cluster, training,
                                                                                        plans, gather_s)
        total = total - per_block * layers * saving
    if model.moe is not None:
        total = total + per_block * moe_layers * etp_block \
            + moe_layers * routed_input_grad_reduce_s(model, cluster, training, plans)
    # delayed scaling's amax all-reduce, once a pass (forward, backward, a recomputed forward) per model chunk: each
    # of the vpp chunks is a TransformerBlock with its own fp8 autocast (transformer_block.py)
    passes = (2.0 + np.minimum(recomputed * layers, 1.0)) * plans.vpp
    delayed_amax_s = passes * fp8_delayed_amax_reduction_s(model, cluster, training, plans, stage)
    return (1.0 - overlap_fraction(profile, "tp_comm")) * total + margin + delayed_amax_s


def mla_gather_saving_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                        gather_s: np.ndarray) -> np.ndarray:
    """What an MLA attention block's sequence-parallel all-gather costs less than the h-wide one `tp_block_s`
    prices: Megatron-Core runs the down projections on the rank's s/tp tokens (duplicated linears) and gathers their
    outputs, the q latent, the kv latent and the rope key (multi_latent_attention.py: the column-parallel
    linear_q_up_proj / linear_kv_up_proj gather their inputs, k_pos_emb goes through
    gather_from_sequence_parallel_region); without a q latent linear_q_proj gathers the hidden states. 0 where
    there is no MLA, no sequence parallelism, or the engine replicates the down projections (torchtitan)."""
    if model.mla is None or training.engine is not Engine.MEGATRON:
        return np.zeros(len(plans))
    mla = model.mla
    latents = (mla.q_lora_rank or model.hidden_size) + mla.kv_lora_rank + mla.qk_rope_head_dim
    elements = plans.mbs * (training.seq_len / plans.cp) * latents
    latent_s = group_collective_time_s(cluster.profile, tp_group(plans, cluster.nvlink_domain_gpus), "all_gather",
                                       elements * tp_gather_bytes_per_element(training))
    return np.where(plans.sp & (plans.tp > 1), np.maximum(gather_s - latent_s, 0.0), 0.0)


def expert_tp_block_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays, block_s,
                      activation_bytes: np.ndarray) -> np.ndarray:
    """One routed-expert block's collectives on the etp group: Megatron-Core's alltoall dispatcher gathers the
    received tokens over the expert-TP group after the EP all-to-all and reduce-scatters them before the combine
    (`moe/token_dispatcher.py` MoEAlltoAllTokenDispatcher: "permute->A2A(EP)->AG(TP)->sort_chunk"), top_k copies of
    the GPU's tokens at the busiest rank's load. They are plain collectives of the dispatcher, outside Transformer
    Engine's userbuffers (which wrap the qkv/proj/fc1/fc2 linear layers), so --tp-comm-overlap does not hide them."""
    assert model.moe is not None
    expert_bytes = activation_bytes * model.moe.top_k * plans.etp / plans.tp * compute_model.moe_load_factor(training)
    return block_s(etp_group(plans, cluster.nvlink_domain_gpus), expert_bytes)


def routed_input_grad_reduce_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                               plans: PlanArrays) -> np.ndarray:
    """torchtitan's expert TP, once per MoE layer backward: ExpertTensorParallel._token_dispatch makes the routed
    input (top_k copies of the micro-batch's mbs·s/cp tokens, h bf16 values each, replicated over TP) a Replicate
    DTensor on the tp mesh with grad_placements=(Partial(),) ("the necessary reductions are performed during
    backward", distributed/expert_parallel.py): its gradient is all-reduced over the tp group. 0 elsewhere, torchtitan's
    DeepEP path under TP included (DeepEPExpertParallel has no such reduction)."""
    replicated = np.full(len(plans), engines.moe_router_replicated(training)) & (plans.etp > 1)
    if model.moe is None or not replicated.any():
        return np.zeros(len(plans))
    bytes_ = plans.mbs * training.seq_len / plans.cp * model.moe.top_k * model.hidden_size * ACTIVATION_BYTES
    reduce_s = group_collective_time_s(cluster.profile, tp_group(plans, cluster.nvlink_domain_gpus), "all_reduce",
                                       bytes_)
    return np.where(replicated, reduce_s, 0.0)


def tp_block_overlapped_s(gather_s: np.ndarray, scatter_s: np.ndarray, in_gemm_s: np.ndarray,
                          out_gemm_s: np.ndarray, tp: np.ndarray, recomputed: np.ndarray) -> np.ndarray:
    """Exposed SP collectives of one TP block per microbatch under --tp-comm-overlap (Transformer Engine
    userbuffers, `module/base.py` initialize_ub). Forward (and a recomputed forward): the input all-gather is fused
    with the input GEMM (ring exchange), the output reduce-scatter with the output GEMM (pipelined). Backward: the
    gradient's all-gather with the output GEMM's dgrad (proj_dgrad / fc2_dgrad ring exchange), the input gradient's
    reduce-scatter with the input GEMM's wgrad (bulk overlap: no ring steps, the whole collective runs beside the
    GEMM; the input GEMM's dgrad hides the re-gather of the saved input, which is not counted here either)."""
    forward = tp_overlap_exposed_s(gather_s, in_gemm_s, tp) + tp_overlap_exposed_s(scatter_s, out_gemm_s, tp)
    backward = tp_overlap_exposed_s(gather_s, out_gemm_s, tp) + np.maximum(0.0, scatter_s - in_gemm_s)
    return (1.0 + recomputed) * forward + backward


def tp_overlap_sm_margin_s(profile: HardwareProfile, in_gemm_s: np.ndarray, out_gemm_s: np.ndarray,
                           recomputed: np.ndarray) -> np.ndarray:
    """What --tp-comm-overlap costs the GEMMs of one TP block per microbatch: the output GEMM's forward (pipelined
    reduce-scatter, again when recomputed) and the input GEMM's dgrad and wgrad (bulk overlap) run beside
    TE_USERBUFFERS_SM_MARGIN userbuffer SMs for their whole length (`sm_margin_s`); the ring-exchange GEMMs use
    one SM and the copy engines, priced free."""
    margin_gemm_s = (1.0 + recomputed) * out_gemm_s + 2.0 * in_gemm_s
    return sm_margin_s(profile, TE_USERBUFFERS_SM_MARGIN, margin_gemm_s)


def tp_overlap_exposed_s(comm_s: np.ndarray, gemm_s: "np.ndarray | float", tp: np.ndarray) -> np.ndarray:
    """Exposed part of one SP collective fused with a GEMM (userbuffers: the collective is split into tp ring steps,
    step i sent while the GEMM of chunk i-1 runs; Wang et al., "Overlap communication with dependent computation via
    decomposition", ASPLOS 2023): the first chunk cannot hide (comm/tp), the rest hides behind that GEMM as far as it
    lasts."""
    first_chunk = comm_s / tp
    return first_chunk + np.maximum(0.0, comm_s - first_chunk - gemm_s)


def cp_exchange_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                  attention_core_fwd_s: np.ndarray, attention_core_bwd_s: "np.ndarray | None" = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) exposed CP ring exchange of one layer per microbatch (see cp_comm_s); the backward steps
    hide behind the core's backward (its own kernel rate where given, else 2 × the forward); the hidden sends slow
    the core beside them (`overlapped_exposed_s`, NCCL's CTAs)."""
    profile = cluster.profile
    if model.mla is not None:
        kv_width = model.num_attention_heads * (model.mla.qk_head_dim + model.mla.v_head_dim) / plans.tp
    else:
        kv_width = np.maximum(2.0 * model.kv_size / plans.tp, 2.0 * model.head_dim)  # kv heads replicate past tp
    kv_bytes = plans.mbs * (training.seq_len / plans.cp) * kv_width * ACTIVATION_BYTES
    placement = cp_group(plans, cluster.nvlink_domain_gpus)
    steps = plans.cp - 1.0
    share = overlap_contention_share(profile, training.nccl_ctas)
    core_step_s = attention_core_fwd_s / plans.cp
    core_bwd_step_s = (compute_model.BACKWARD_TO_FORWARD * attention_core_fwd_s if attention_core_bwd_s is None
                       else attention_core_bwd_s) / plans.cp

    def exposed_s(send_s, core_s):           # each step's send beside one chunk of the core
        return steps * overlapped_exposed_s(send_s, core_s, share)

    forward = exposed_s(group_collective_time_s(profile, placement, "send_recv", kv_bytes), core_step_s)
    backward = exposed_s(group_collective_time_s(profile, placement, "send_recv", 2.0 * kv_bytes), core_bwd_step_s)
    return forward, backward


def cp_comm_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              stage: np.ndarray, attention_core_fwd_s: np.ndarray, attention_core_bwd_s: "np.ndarray | None" = None,
              comm: "LayerComm | None" = None) -> np.ndarray:
    """Exposed CP ring exchange per microbatch on `stage` (ring attention, Liu et al. arXiv 2310.01889; Megatron-Core
    `transformer/dot_product_attention` CP via TE): cp-1 steps per layer, each sending the local K and V chunk
    (b·(s/cp)·2·g·d/tp, bf16) forward and K, V plus their gradients backward, each step overlapped with one
    chunk of attention core compute: exposed (cp-1)·max(0, t_send - t_core/cp) per pass (one layer's passes:
    `cp_exchange_s`, `comm` when given); recomputed layers repeat the forward pass, and so does selective
    recompute of the attention core (core_attn: Megatron-Core's _checkpointed_attention_forward re-runs TE's
    context-parallel attention, its ring included; torchtitan's per-op SAC keeps the attention's outputs)."""
    forward, backward = ((comm.cp_forward_s, comm.cp_backward_s) if comm is not None
                         else cp_exchange_s(model, cluster, training, plans, attention_core_fwd_s,
                                            attention_core_bwd_s))
    layers = layers_on_stage(model.num_layers, plans, stage)
    core_rerun = recomputes_module(plans, RecomputeModule.CORE_ATTN) & ~engines.per_op_sac(training, plans)
    passes_forward = 1.0 + compute_model.recomputed_layer_fraction(plans, layers) + core_rerun
    return layers * (passes_forward * forward + backward)


def ep_comm_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              stage: np.ndarray, comm: "LayerComm | None" = None) -> np.ndarray:
    """All EP all-to-all time per microbatch on `stage` (before any overlap); see `ep_all_to_all_s`."""
    return ep_all_to_all_s(model, cluster, training, plans, stage, comm)


def ep_a2a_overlap_applies(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Where --overlap-moe-expert-parallel-comm runs: Megatron-Core's TransformerConfig refuses it without expert
    parallelism, with a pipeline that is not interleaved ('virtual_pipeline_model_parallel_size must be specified
    when pipeline_model_parallel_size > 1'), with full recompute, with 'moe' among the recomputed modules and with
    more than one MTP layer (megatron/core/transformer/transformer_config.py __post_init__); elsewhere the
    all-to-all stays exposed (and the exports leave the flag out, export.common.model_parallel_overlap)."""
    allowed = training.moe_a2a_overlap and model.is_moe and model.num_mtp_layers <= 1
    return (np.full(len(plans), allowed) & (plans.ep > 1) & ((plans.pp == 1) | (plans.vpp > 1))
            & (plans.recompute != Recompute.FULL) & ~recomputes_module(plans, RecomputeModule.MOE))


def ep_overlap_exposed_s(a2a_s: np.ndarray, paired_s: np.ndarray, microbatches: np.ndarray,
                         plans: "PlanArrays | None" = None, group: int = 0) -> np.ndarray:
    """Exposed EP all-to-all per step under --overlap-moe-expert-parallel-comm (`a2a_s`: one micro-batch's on the
    stage; `paired_s`: what it adds when paired, `ep_paired_exposed_s`). Megatron-Core runs the forward of one
    micro-batch (chunk) and the backward of another as one merged schedule (`pipeline_parallel/combined_1f1b.py`;
    MoE README "EP A2A overlap"), so their dispatch/combine hide behind each other's computation; a forward with
    no backward to pair with keeps its all-to-alls exposed, and so does a backward alone: the first forward and the
    last backward without a pipeline, the warmup forwards and the cooldown backwards of the interleaved schedule,
    which runs one extra warmup chunk with the overlap (schedules.py get_pp_rank_microbatches: interleaved warmup
    + 1; `group` the run's micro-batch group, pipeline.interleaved_warmup_chunks). With v chunks a chunk pass
    carries 1/v of a micro-batch's all-to-alls."""
    if plans is None:
        alone_chunks, chunks = np.ones_like(microbatches, dtype=float), microbatches
    else:
        chunks = plans.vpp * microbatches
        alone_chunks = np.minimum(interleaved_warmup_chunks(plans, microbatches, group) + 1.0, chunks)
        alone_chunks, chunks = alone_chunks / plans.vpp, chunks / plans.vpp   # in micro-batches
    return alone_chunks * a2a_s + (chunks - alone_chunks) * paired_s


def ep_paired_exposed_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec, plans: PlanArrays,
                        times: compute_model.LayerTimes, stage: np.ndarray, one_s: np.ndarray) -> np.ndarray:
    """What one micro-batch's EP all-to-alls on `stage` (`one_s` each) add to the step when the EP-overlap schedule
    pairs its forward with another micro-batch's backward. Per MoE layer the pair runs three phases, a
    communication beside a computation in each (Megatron-Core `models/common/model_chunk_schedule_plan.py`,
    TransformerLayerSchedulePlan.run):

        comm stream: combine_bwd      | dispatch_fwd -> dispatch_bwd     | combine_fwd
        comp stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd

    so an all-to-all hides only behind its own phase's computation, and a phase adds its excess or its SMs' share of
    the compute (`overlapped_exposed_s`, DeepEP's or NCCL's SMs). The pieces of a MoE layer: the pre-dispatch
    forward A (`LayerTimes.moe_pre_dispatch_fwd_s`), its backward 2·(A − core) + the core's backward; the routed part
    M = moe_layer_fwd_s − A, its backward 2·M + moe_layer_bwd_extra_s. The stage's dense layers, logits and loss
    carry no all-to-all and hide none; recompute is left out of the windows."""
    share = overlap_contention_share(profile, ep_comm_sms(training))
    pre_fwd = times.moe_pre_dispatch_fwd_s
    pre_bwd = compute_model.BACKWARD_TO_FORWARD * np.maximum(pre_fwd - times.attention_core_fwd_s, 0.0) \
        + times.core_backward_s(training)
    routed_fwd = times.moe_layer_fwd_s - pre_fwd
    routed_bwd = compute_model.BACKWARD_TO_FORWARD * routed_fwd + times.moe_layer_bwd_extra_s
    per_layer = overlapped_exposed_s(one_s, pre_fwd, share) \
        + overlapped_exposed_s(2.0 * one_s, routed_fwd + routed_bwd, share) \
        + overlapped_exposed_s(one_s, pre_bwd, share)
    return moe_layers_on_stage(model, plans, stage) * per_layer


def ep_exposed_per_microbatch_s(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, a2a_s: np.ndarray,
                                paired_s: np.ndarray, microbatches: np.ndarray) -> np.ndarray:
    """One micro-batch's share of the EP all-to-all a step exposes (`a2a_s`, `paired_s`: a stage's or a chunk's
    per micro-batch, `ep_paired_exposed_s`): `ep_overlap_exposed_s` / m where --overlap-moe-expert-parallel-comm
    runs (`ep_a2a_overlap_applies`), the whole all-to-all elsewhere. The layout tables (costmodels.layout) price
    each virtual stage with it."""
    overlapped = ep_overlap_exposed_s(a2a_s, paired_s, microbatches, plans,
                                      training.microbatch_group_size_per_vp_stage) / microbatches
    return np.where(ep_a2a_overlap_applies(model, training, plans), overlapped, a2a_s)


def ep_all_to_all_one_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays
                        ) -> np.ndarray:
    """One all-to-all (a dispatch or a combine) of one MoE layer per microbatch (see ep_all_to_all_s), with the
    training's dispatcher (NCCL all-to-all, or DeepEP: comm.deepep_all_to_all_time_s); 0 for a dense model."""
    if model.moe is None:
        return np.zeros(len(plans))
    tp_share = np.where(engines.moe_dispatch_replicated(training, plans), 1.0, plans.tp)
    tokens = plans.mbs * training.seq_len / (tp_share * plans.cp)
    bytes_ = tokens * model.moe.top_k * model.hidden_size * ACTIVATION_BYTES * compute_model.moe_load_factor(training)
    group = ep_group(plans, cluster.nvlink_domain_gpus)
    if training.moe_dispatcher is MoEDispatcher.DEEPEP:
        moe = model.moe
        return deepep_all_to_all_time_s(cluster.profile, group, bytes_, moe.num_experts, moe.top_k,
                                        moe.router.num_groups, moe.router.group_topk, moe.router.group_by_max)
    return group_collective_time_s(cluster.profile, group, "all_to_all", bytes_)


def ep_all_to_all_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                    stage: np.ndarray, comm: "LayerComm | None" = None) -> np.ndarray:
    """EP all-to-all per microbatch on `stage` (GShard, Lepikhin et al. arXiv 2006.16668; Megatron-Core
    `moe/token_dispatcher.py` alltoall): dispatch + combine, forward + backward (4 per MoE layer, +2 for a
    recomputed layer); each GPU sends its own mbs·s/(tp·cp) tokens × top_k copies of h bf16 values (the expert-TP
    all-gather happens after the all-to-all, on the etp group, and is priced in tp_comm_s); the busiest rank receives
    `moe_load_factor` × the average. Overlap (--overlap-moe-expert-parallel-comm) is applied per step in
    `step_time_terms_s`, see `ep_overlap_exposed_s`. One all-to-all is `ep_all_to_all_one_s` (`comm` when given).
    torchtitan with expert TP, and its DeepEP path under TP, sends every token of the micro-batch from each TP rank
    (engines.moe_dispatch_replicated: its tokens are replicated over TP)."""
    if model.moe is None:
        return np.zeros(len(plans))
    layers = layers_on_stage(model.num_layers, plans, stage)
    moe_layers = moe_layers_on_stage(model, plans, stage)
    recomputed = compute_model.recomputed_layer_fraction(plans, layers)
    one = comm.ep_all_to_all_s if comm is not None else ep_all_to_all_one_s(model, cluster, training, plans)
    # module `moe` of selective recompute re-runs the dispatch and combine of every stored MoE layer
    moe_module = recomputes_module(plans, RecomputeModule.MOE)
    # torchtitan's per-op SAC re-runs them with the block unless its policy keeps their outputs
    sac_rerun = engines.per_op_sac(training, plans) & (not training.sac_saves_all_to_all)
    return moe_layers * (4.0 + 2.0 * recomputed + 2.0 * moe_module + 2.0 * sac_rerun) * one


def stage_microbatch(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                     times: compute_model.LayerTimes, stage: np.ndarray, comm: LayerComm | None = None,
                     with_host: bool = True, launches: "engines.LayerLaunches | None" = None) -> StageMicrobatch:
    """Every per-microbatch piece of `stage`: one layer's times (and collectives, `layer_comm_s` when not given)
    scaled by the stage's layers. `with_host` False leaves the host's share (the costliest piece to price) at 0, for
    a caller that does not read it; `launches` (engines.layer_launches, the same on every stage) when the caller has
    them already."""
    if comm is None:
        comm = layer_comm_s(model, cluster, training, plans, times)
    forward, backward, recompute = stage_compute_s(model, training, plans, times, stage)
    tp = tp_comm_s(model, cluster, training, plans, stage, times.tp_overlap, comm)
    cp = cp_comm_s(model, cluster, training, plans, stage, times.attention_core_fwd_s,
                   times.core_backward_s(training), comm)
    ep = ep_comm_s(model, cluster, training, plans, stage, comm)
    return StageMicrobatch(
        forward_s=forward, backward_s=backward, recompute_s=recompute, tp_comm_s=tp, cp_comm_s=cp, ep_comm_s=ep,
        weight_grad_s=stage_weight_grad_s(model, plans, times, stage),
        ep_paired_exposed_s=ep_paired_exposed_s(model, cluster.profile, training, plans, times, stage,
                                                comm.ep_all_to_all_s),
        host_s=stage_host_s(model, cluster, training, plans, times, stage, forward, backward, recompute,
                            tp + cp + ep, launches) if with_host else np.zeros(len(plans)),
    )


COLLECTIVES_FORWARD_SHARE = 1.0 / 3.0
"""Of a micro-batch's exposed TP, CP and EP collectives, the forward pass's: one per block and pass forward, two
backward (tp_comm_s, cp_comm_s, ep_all_to_all_s), so a third."""


def stage_host_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                 times: compute_model.LayerTimes, stage, forward_s: np.ndarray, backward_s: np.ndarray,
                 recompute_s: np.ndarray, collectives_s: np.ndarray,
                 launches: "engines.LayerLaunches | None" = None) -> np.ndarray:
    """What the host adds to one micro-batch's GPU work on `stage` (costmodels.host_timeline): the engine's
    launches (costmodels.engines; built here when not given) beside the stage's passes, their GPU seconds with the
    exposed collectives."""
    if launches is None:
        launches = engines.layer_launches(model, training, plans)
    pieces = host_timeline.stage_pieces(
        model, training, plans, times, launches, cluster.profile.host_costs, stage, forward_s, backward_s,
        recompute_s, COLLECTIVES_FORWARD_SHARE * collectives_s, (1.0 - COLLECTIVES_FORWARD_SHARE) * collectives_s)
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    return host_timeline.host_exposed_per_microbatch_s(pieces, launches, plans, cluster.profile.host_costs,
                                                       microbatches)


# ---- per-step terms -----------------------------------------------------------------------------------------------

def chunk_forward_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays
                    ) -> np.ndarray:
    """Forward seconds of one virtual-pipeline chunk per microbatch on the even split: L/(p·v) layers at the model's
    mean decoder layer (its dense and MoE layers in proportion). The window an overlapped stage-to-stage transfer
    runs beside (`pp_p2p_s`): a steady-state backward send is waited on after the next chunk's forward."""
    times, _ = layer_pieces(model, cluster, training, plans)
    moe_layers = float(moe_layers_before(model, np.array([model.num_layers]))[0]) if model.is_moe else 0.0
    layers_s = (model.num_layers - moe_layers) * times.dense_layer_fwd_s + moe_layers * times.moe_layer_fwd_s
    return layers_s / (plans.pp * plans.vpp)


def pp_p2p_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
             microbatches: np.ndarray) -> np.ndarray:
    """Stage-to-stage transfer time a step adds (pipeline.p2p_transfer_counts): the blocking transfers whole, and
    each send --overlap-p2p-communication leaves in flight as what it adds beside a chunk's forward
    (`overlapped_exposed_s`: its excess over the window, or the share of the SMs its NCCL CTAs hold)."""
    one = p2p_transfer_s(model, cluster.profile, training, plans, cluster.num_gpus, cluster.nvlink_domain_gpus)
    exposed, overlapped = p2p_transfer_counts(training, plans, microbatches)
    hidden_s = np.zeros(len(plans))
    if np.any(overlapped > 0):
        share = overlap_contention_share(cluster.profile, training.nccl_ctas)
        hidden_s = overlapped * overlapped_exposed_s(one, chunk_forward_s(model, cluster, training, plans), share)
    return exposed * one + hidden_s


def dp_collective_counts(model: ModelSpec, plans: PlanArrays, stage: np.ndarray, params: np.ndarray,
                         bucket_params: np.ndarray, overlap_grad_reduce: bool, experts: bool = False,
                         zero3_per_layer: float = 1.0, units_from_zero: int = 3) -> np.ndarray:
    """How many collectives carry `params` of `stage` per reduce (or gather): every one pays its own latency.
    FSDP units from ZeRO stage `units_from_zero` on (2 for the FSDP engines, whose ZeRO-2 wraps the same units:
    `fsdp_units_from_zero`), buckets below it.

    ZeRO-0..2, Megatron-Core DDP / distributed optimizer (`distributed/distributed_data_parallel.py`): buckets of
    `bucket_params` (max(40M, 1M·dp)) with overlap_grad_reduce, one bucket for everything without it ('Set
    bucket_size to infinity if overlap_grad_reduce is False'). ZeRO-3 (FSDP): one unit per decoder layer, plus the
    embedding on the first stage and the output layer on the last (torchtitan's and llm-foundry's per-block
    wrapping); the `experts`' parameters one unit per MoE layer. DeepSpeed's ZeRO-3 fetches per parameter-holding
    submodule, or (before v0.6) per parameter: `zero3_per_layer` collectives a layer (`zero3_collectives_per_layer`)."""
    buckets = np.maximum(np.ceil(params / bucket_params), 1.0) if overlap_grad_reduce else np.ones(len(plans))
    if experts:
        units = moe_layers_on_stage(model, plans, stage) * zero3_per_layer
    else:
        ranks = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(plans),))
        units = layers_on_stage(model.num_layers, plans, stage) * zero3_per_layer \
            + (ranks == 0) + (ranks == plans.pp - 1)
    return np.where(plans.zero >= units_from_zero, np.maximum(units, 1.0), buckets)


def fsdp_units_from_zero(training: TrainingSpec) -> int:
    """The ZeRO stage from which the engine moves a stage's parameters in per-layer units: 2 where ZeRO-2 is FSDP
    with gradients sharded per unit (torchtitan's FSDP2 with reshard_after_forward never, PyTorch FSDP's
    SHARD_GRAD_OP, Megatron-FSDP's optim_grads), 3 elsewhere (DeepSpeed's ZeRO-2 reduces in reduce_bucket_size
    buckets, as the Megatron DDP buckets are priced)."""
    return 2 if training.engine in (Engine.TORCHTITAN, Engine.PYTORCH, Engine.MEGATRON) else 3


def zero3_collectives_per_layer(model: ModelSpec, training: TrainingSpec) -> tuple[float, float]:
    """Collectives one decoder layer's ZeRO-3 gather (and reduce-scatter) takes, for its dense parameters and for a
    MoE layer's experts: one each for an FSDP unit (torchtitan, FSDP, Megatron-FSDP); DeepSpeed's fetch all-gathers
    per parameter-holding submodule (v0.6+: coalesced, partitioned_param_coordinator.py fetch_sub_module): a MoE
    block's experts at once where it is the ZeRO-3 leaf module the frameworks register it as
    (TrainingSpec.zero3_moe_leaf, engines._deepspeed_expert_fetch; its gradients reduced together once its backward
    is done), else each expert linear on its own; before v0.6, which had no leaf modules, every parameter alone
    (partition_parameters.py _allgather_param, TrainingSpec.zero3_serial_fetch)."""
    if training.engine is not Engine.DEEPSPEED:
        return 1.0, 1.0
    per_linear = 3.0 * model.moe.num_experts if model.moe is not None else 1.0
    if training.zero3_serial_fetch:
        return engines.param_tensors_per_layer(model), per_linear
    # the layer's linears (norms and biases stay whole: engines.ZERO3_PERSISTENCE_THRESHOLD_PARAMS); a MoE model's
    # layers gather their attention side so, and the block's router and experts at once (a leaf) or each alone
    dense = engines.zero3_fetched_linears_per_layer(model, moe_layer=model.is_moe)
    return dense, 1.0 if training.zero3_moe_leaf else 1.0 + per_linear


def dp_traffic_s(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, stage: np.ndarray,
                 overlap_grad_reduce: bool = False, grad_bytes: int = 4,
                 layer_param_bytes_by_zero: tuple[float, ...] = (PARAM_BYTES,) * 4,
                 zero3_collectives: tuple[float, float] = (1.0, 1.0), units_from_zero: int = 3
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(gradient reduce, parameter gather, last-bucket reduce, last-bucket gather) seconds of `stage`'s data-parallel
    traffic per step (see dp_comm_s for the collectives and their sources), each the sum of its collectives
    (`dp_collective_counts`; a ZeRO-3 "bucket" is one layer's unit), the gradients `grad_bytes` per element
    (TrainingSpec.gradient_bytes_per_param), the decoder layers' parameters `layer_param_bytes_by_zero[zero]` per
    element in a gather (TrainingSpec.param_gather_bytes_by_zero) and the embedding's and output layer's
    PARAM_BYTES (a bucket's bytes at its group's mean); reads the structure knobs only."""
    profile = cluster.profile
    dense_params, expert_params = stage_params_per_gpu(model, plans, stage)
    embedding_params = stage_embedding_params_per_gpu(model, plans, stage)
    layer_param_bytes = np.asarray(layer_param_bytes_by_zero, dtype=float)[plans.zero]
    dense_gather_bytes = layer_param_bytes + (PARAM_BYTES - layer_param_bytes) * embedding_params / np.maximum(
        dense_params, 1.0)
    dense_group = dp_cp_group(plans, cluster.num_gpus, cluster.nvlink_domain_gpus)
    expert_group = edp_group(plans, cluster.num_gpus, cluster.nvlink_domain_gpus)
    sharded = plans.zero >= 1
    bucket = engines.megatron_ddp_bucket_params(plans, cluster.num_gpus)
    dense_count, expert_count = (dp_collective_counts(model, plans, stage, params, bucket, overlap_grad_reduce,
                                                      experts, per_layer, units_from_zero)
                                 for params, experts, per_layer in ((dense_params, False, zero3_collectives[0]),
                                                                    (expert_params, True, zero3_collectives[1])))

    def traffic_s(dense, expert, counts):
        groups = ((dense_group, dense, counts[0], dense_gather_bytes),
                  (expert_group, expert, counts[1], layer_param_bytes))
        # each of `count` collectives carries p / count; a group with no parameters (a dense model's experts) none
        reduce = sum(np.where(p > 0, count, 0.0) * np.where(
            sharded, group_collective_time_s(profile, g, "reduce_scatter", p / count * grad_bytes),
            group_collective_time_s(profile, g, "all_reduce", p / count * grad_bytes)) for g, p, count, _ in groups)
        gather = sum(np.where(p > 0, count, 0.0) * np.where(
            sharded, group_collective_time_s(profile, g, "all_gather", p / count * gathered_bytes), 0.0)
            for g, p, count, gathered_bytes in groups)
        return reduce, gather

    reduce_s, gather_s = traffic_s(dense_params, expert_params, (dense_count, expert_count))
    last = tuple(np.where(plans.zero >= units_from_zero, params / count, np.minimum(bucket, params))
                 for params, count in ((dense_params, dense_count), (expert_params, expert_count)))
    bucket_reduce_s, bucket_gather_s = traffic_s(*last, (np.ones(len(plans)),) * 2)
    return reduce_s, gather_s, bucket_reduce_s, bucket_gather_s


def dp_comm_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              stage: np.ndarray, microbatch: StageMicrobatch, microbatches: np.ndarray) -> np.ndarray:
    """Exposed data-parallel traffic of `stage` per step.

    - ZeRO-0: all-reduce of the fp32 gradients; ZeRO-1 (Megatron distributed optimizer): reduce-scatter of the
      fp32 gradients once per step + all-gather of the bf16 parameters (Rajbhandari et al., arXiv 1910.02054 §5;
      Megatron-Core `distributed/param_and_grad_buffer.py`). With training.grad_reduce_in_fp32 off every gradient
      collective carries bf16, half the bytes; with fp8 parameters (training.fp8_param_gather) the decoder
      layers' gathers carry fp8 (MXFP8 under the distributed optimizer bf16: TrainingSpec.param_gather_bytes_by_zero).
    - ZeRO-2: the gradients are partitioned, so they are reduce-scattered after every microbatch's backward, not
      accumulated (ZeRO §5.2; DeepSpeed issue #2252: "for zero stage 2 (and 3), gradient reduction is required after
      every backward"), as each engine runs it (`zero2_exposed_s`).
    - ZeRO-3: every microbatch all-gathers the bf16 parameters for its forward and again for its backward and
      reduce-scatters its gradients (§5.3), hidden behind that microbatch's compute; no step-level gather.
    - Dense gradients reduce over dp·cp (stride tp); expert gradients over edp (stride etp·ep).
    - ZeRO-0/1 (Megatron DDP / distributed optimizer): with `training.overlap_grad_reduce` the reduce overlaps the
      last microbatch's backward, with `overlap_param_gather` the gather the next forward, bucket by bucket:
      exposed = the last bucket + what the rest adds beside the window, the bucket max(40M, 1M·dp) parameters.
      Off (Megatron-Core's default), each runs after the backward / after the optimizer step, fully exposed.
    - ZeRO-3 (FSDP, DeepSpeed) overlaps by design (FSDP backward prefetch, DeepSpeed overlap_comm, on at stage 3),
      whatever the Megatron switches say.
    - torchtitan with pipeline parallelism (engines.fsdp_gradients_unsynced): one reduce-scatter after the stage's
      last backward, exposed, per step; the parameters gathered once (ZeRO-2) or once a micro-batch (ZeRO-3).
    - What a collective adds beside compute is `overlapped_exposed_s`: its excess over the window or the share of
      the SMs its CTAs take (TrainingSpec.nccl_ctas) × its length, whichever is larger.
    """
    zero3_collectives = zero3_collectives_per_layer(model, training)
    units_from_zero = fsdp_units_from_zero(training)
    reduce_s, gather_s, bucket_reduce_s, bucket_gather_s = per_structure(
        plans, ("dp_traffic_s", id(model), id(cluster), training.overlap_grad_reduce,
                training.gradient_bytes_per_param, training.param_gather_bytes_by_zero, zero3_collectives,
                units_from_zero),
        lambda p, s: dp_traffic_s(model, cluster, p, s, training.overlap_grad_reduce,
                                  training.gradient_bytes_per_param, training.param_gather_bytes_by_zero,
                                  zero3_collectives, units_from_zero), stage,
        knobs=TERM_KNOBS["optimizer"])
    sharded = plans.zero >= 1
    share = overlap_contention_share(cluster.profile, training.nccl_ctas)
    backward_s = microbatch.backward_s + microbatch.recompute_s
    reduce_exposed = reduce_s
    if training.overlap_grad_reduce:   # the last bucket after the backward, the rest beside it
        reduce_exposed = bucket_reduce_s + overlapped_exposed_s(reduce_s - bucket_reduce_s, backward_s, share)
    gather_exposed = gather_s
    if training.overlap_param_gather:  # the first bucket before the forward, the rest beside it
        gather_exposed = bucket_gather_s + overlapped_exposed_s(gather_s - bucket_gather_s, microbatch.forward_s,
                                                                share)
    exposed = reduce_exposed + np.where(sharded, gather_exposed, 0.0)
    zero2 = zero2_exposed_s(training, microbatch, microbatches, share, reduce_s, gather_s, bucket_reduce_s,
                            bucket_gather_s, gather_exposed)
    # ZeRO-3: per microbatch, gathers for forward and backward plus the reduce-scatter, beside its compute; the last
    # bucket of reduce-scatter waits for its backward to end, so only the rest runs beside it: on the last micro-batch
    # under Megatron-FSDP, on every one where the engine waits at each backward's end (`waits_each_backward`)
    zero3_traffic = 2.0 * gather_s + reduce_s
    zero3 = fsdp_microbatches_exposed_s(training, microbatch.compute_s, microbatches, share, zero3_traffic,
                                        bucket_reduce_s)
    if training.zero3_serial_fetch:   # DeepSpeed < 0.6: nothing overlaps (zero3_serial_fetch_s)
        zero3 = microbatches * zero3_traffic + zero3_serial_fetch_s(model, cluster, training, plans, stage,
                                                                    microbatches)
    sharded_dp = np.where(plans.zero >= 3, zero3, np.where(plans.zero == 2, zero2, exposed))
    # torchtitan with pipeline parallelism (engines.fsdp_gradients_unsynced) reduce-scatters once, after the stage's
    # last backward, waited for; its parameters are gathered once beside the first forward at ZeRO-2 (no backward
    # reshards them), and once per micro-batch, for its backward, beside the compute at ZeRO-3
    # (ZeRO-3: each backward, and each warmup forward after the first, which finds the stage resharded)
    warmup = np.maximum(plans.pp - 1 - np.asarray(stage), 0)
    gathers = np.where(plans.zero >= 3,
                       (microbatches + warmup) * overlapped_exposed_s(gather_s, microbatch.compute_s, share),
                       bucket_gather_s + overlapped_exposed_s(gather_s - bucket_gather_s, microbatch.forward_s,
                                                              share))
    tied = per_structure(plans, ("tied_embedding_allreduce_s", id(model), id(cluster), training.engine,
                                 training.gradient_bytes_per_param),
                         lambda p, s: tied_embedding_allreduce_s(model, cluster, training, p, s), stage,
                         knobs=("tp", "cp", "pp", "zero"))
    return np.where(engines.fsdp_gradients_unsynced(training, plans), gathers + reduce_s, sharded_dp) + tied


def waits_each_backward(training: TrainingSpec) -> bool:
    """Whether the engine waits for its last reduce-scatter at the end of every micro-batch's backward, not only the
    step's last: PyTorch FSDP1 (_runtime_utils._post_backward_final_callback waits on the post-backward stream
    whenever gradients sync, every backward under Composer, which never no_syncs FSDP), FSDP2
    (_root_post_backward_final_callback with is_last_backward, True unless a pipeline schedule clears it) and
    DeepSpeed's ZeRO-3 (stage3.py independent_gradient_partition_epilogue ends every backward in
    reduce_and_partition_stream.synchronize()); not Megatron-FSDP."""
    return training.engine in (Engine.TORCHTITAN, Engine.PYTORCH, Engine.DEEPSPEED)


def fsdp_microbatches_exposed_s(training: TrainingSpec, compute_s: np.ndarray, microbatches: np.ndarray,
                                share: float, traffic_s: np.ndarray, bucket_reduce_s: np.ndarray) -> np.ndarray:
    """A step of micro-batches each moving `traffic_s` of per-unit gathers and reduce-scatters beside its compute:
    the last unit's reduce-scatter runs after the backward, exposed, on the last micro-batch, or on every one where
    the engine waits for it at each backward's end (`waits_each_backward`)."""
    waited = microbatches if waits_each_backward(training) else 1.0
    return (microbatches - waited) * overlapped_exposed_s(traffic_s, compute_s, share) \
        + waited * (bucket_reduce_s + overlapped_exposed_s(traffic_s - bucket_reduce_s, compute_s, share))


def zero2_exposed_s(training: TrainingSpec, microbatch: StageMicrobatch, microbatches: np.ndarray, share: float,
                    reduce_s: np.ndarray, gather_s: np.ndarray, bucket_reduce_s: np.ndarray,
                    bucket_gather_s: np.ndarray, step_gather_exposed_s: np.ndarray) -> np.ndarray:
    """ZeRO-2's exposed data-parallel traffic per step as the engine runs it; every micro-batch reduce-scatters its
    gradients (the collectives of `dp_traffic_s`, `fsdp_units_from_zero`'s units or buckets):
    - FSDP (torchtitan's FSDP2 with reshard_after_forward never, PyTorch FSDP's SHARD_GRAD_OP): the parameters
      are resharded after each backward and gathered again for the next forward (torch fsdp _runtime_utils
      _should_free_in_backward; FSDP2 reshard_after_backward), so each micro-batch gathers once and reduce-scatters
      once, prefetched and on their own streams beside its compute; the last unit's reduce-scatter waits for the
      backward to end;
    - Megatron-FSDP's optim_grads: the gradient reduce overlaps every backward whatever the switches
      (megatron_fsdp.py forces overlap_grad_reduce for sharded gradients), the parameters stay whole and are
      gathered once after the step (`step_gather_exposed_s`, with --overlap-param-gather beside the next forward);
    - DeepSpeed: overlap_comm is off below stage 3 (runtime/zero/config.py), so every micro-batch's reduce-scatter
      runs on the compute stream after its backward, and the parameters are gathered after the step, both exposed
      (stage_1_and_2.py reduce_ipg_grads, step);
    - the other engines (llm.c) as Megatron-FSDP."""
    backward_s = microbatch.backward_s + microbatch.recompute_s
    if training.engine in (Engine.TORCHTITAN, Engine.PYTORCH):
        return fsdp_microbatches_exposed_s(training, microbatch.compute_s, microbatches, share, gather_s + reduce_s,
                                           bucket_reduce_s)
    if training.engine is Engine.DEEPSPEED:
        return microbatches * reduce_s + gather_s
    reduce = bucket_reduce_s + overlapped_exposed_s(reduce_s - bucket_reduce_s, backward_s, share) \
        + (microbatches - 1.0) * overlapped_exposed_s(reduce_s, backward_s, share)
    return reduce + step_gather_exposed_s


def tied_embedding_allreduce_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                               stage: np.ndarray) -> np.ndarray:
    """Megatron-Core with a tied embedding (or MTP) under pipeline parallelism: after the DP grad sync
    finalize_model_grads all-reduces the word embedding's main gradient between the first and the last pipeline
    stage, blocking, once a step (distributed/finalize_model_grads.py _allreduce_word_embedding_grads: a
    torch.distributed.all_reduce over the embedding group), V_padded/tp × h elements in the gradient dtype (under
    Megatron-FSDP, zero >= 2, the rank's shard of them: `orig_grad._local_tensor`, 1/(dp·cp)), on the two end
    stages' ranks (num_gpus·(pp−1)/pp apart in Megatron's rank order)."""
    megatron = training.engine is Engine.MEGATRON and (model.tied_embeddings or model.num_mtp_layers > 0)
    if not megatron:
        return np.zeros(len(plans))
    rank = np.broadcast_to(np.asarray(stage), (len(plans),))
    ends = (plans.pp > 1) & ((rank == 0) | (rank == plans.pp - 1))
    group = place_group(2, cluster.num_gpus * np.maximum(plans.pp - 1, 1) / plans.pp, cluster.nvlink_domain_gpus)
    elements = padded_vocab_size(model, plans.tp) / plans.tp * model.hidden_size
    elements = elements / np.where(plans.zero >= 2, np.maximum(data_parallel_size(plans, cluster.num_gpus) * plans.cp,
                                                              1.0), 1.0)
    return np.where(ends, group_collective_time_s(cluster.profile, group, "all_reduce",
                                                  elements * training.gradient_bytes_per_param), 0.0)


def dp_comm_floor_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    plans: PlanArrays) -> np.ndarray:
    """A lower bound on the `dp_comm` term that reads no micro-batch compute: each stage's `dp_comm_s` with every
    overlapped collective beside an endless compute window, so that it adds only its SMs' share × its length
    (`overlapped_exposed_s` is non-increasing in the window); what runs exposed is counted whole. It reads the
    structure knobs (TERM_KNOBS["optimizer"]) and the micro-batch count, so a search can drop plans on it before
    pricing their compute windows (autopar.search.objective.time_bound_units)."""
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    endless = np.full(len(plans), np.inf)
    windowless = StageMicrobatch(forward_s=endless, backward_s=endless, recompute_s=endless, tp_comm_s=endless,
                                 cp_comm_s=endless, ep_comm_s=endless)
    with np.errstate(invalid="ignore"):
        floor = np.max(np.stack(per_distinct_stage(candidate_stages(plans), lambda stage: dp_comm_s(
            model, cluster, training, plans, stage, windowless, microbatches))), axis=0)
    return np.where(np.isnan(floor), 0.0, floor)     # an endless collective beside the endless window: no bound


def zero3_serial_fetch_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                         stage: np.ndarray, microbatches: np.ndarray) -> np.ndarray:
    """The host's share of DeepSpeed's ZeRO-3 as released in 2021 (v0.3.13-v0.5.10), per step: every parameter's
    gather is preceded by torch.cuda.synchronize() and (v0.3.15+) followed by a debug string formatting param.norm()
    -- a device read -- (partition_parameters.py _allgather_param, stage3.py fetch_sub_module), and every
    submodule's fetch ends in comm_stream.synchronize() and torch.cuda.synchronize() (_synchronize_communication):
    each drains the queue, so the gathers cannot overlap the compute (dp_comm_s takes them whole) and the host
    wakes up after each, forward and backward, per micro-batch. Each gather is torch.distributed.all_gather into a
    list of one tensor per rank, which ProcessGroupNCCL runs as one NCCL all-gather into a flat buffer and then one
    copy kernel per rank into the list (ProcessGroupNCCL.cpp allgather: 'Copy the flattened output tensors to the
    outputs'): a launch from C++ per rank of the data-parallel group, per parameter, behind the synchronisations."""
    layers = layers_on_stage(model.num_layers, plans, stage)
    costs = cluster.profile.host_costs
    tensors = engines.param_tensors_per_layer(model)
    syncs = 2.0 * tensors + engines.param_modules_per_layer(model)
    dp = cluster.num_gpus / (plans.tp * plans.pp * plans.cp)
    copies = tensors * dp
    return microbatches * 2.0 * layers * (syncs * costs.sync_s + copies * costs.launch_s)


def optimizer_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                stage: np.ndarray) -> np.ndarray:
    """Adam step over the GPU's share of the parameters, HBM-bound (ADAM_BYTES_PER_PARAM per parameter, and the
    fp32 copy of bf16 gradients under Megatron's optimizers, zero <= 1: BF16_GRAD_COPY_BYTES_PER_PARAM); the
    distributed optimizer / ZeRO shards it over dp·cp (dense) and edp (experts). Plus the host's share of the step
    (engines.step_host_s: the engine's synchronisations around it and its launches after them)."""
    copy = 0 if training.grad_reduce_in_fp32 else BF16_GRAD_COPY_BYTES_PER_PARAM
    return per_structure(plans, ("optimizer_s", id(model), id(cluster), copy),
                         lambda p, s: _optimizer_s(model, cluster, p, s, copy), stage, knobs=TERM_KNOBS["optimizer"]) \
        + engines.step_host_s(model, training, plans, cluster.profile.host_costs, cluster.num_gpus, stage)


def _optimizer_s(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, stage: np.ndarray,
                 grad_copy_bytes: int) -> np.ndarray:
    dense_params, expert_params = stage_params_per_gpu(model, plans, stage)
    sharded = plans.zero >= 1
    dense_shards = np.where(sharded, cluster.num_gpus / (plans.tp * plans.pp), 1.0)
    expert_shards = np.where(sharded, cluster.num_gpus / (plans.etp * plans.ep * plans.pp), 1.0)
    local = dense_params / dense_shards + expert_params / expert_shards
    per_param = ADAM_BYTES_PER_PARAM + np.where(plans.zero <= 1, grad_copy_bytes, 0)
    return local * per_param / cluster.profile.hbm_bandwidth_bytes_per_s


OFFLOAD_TERM = "offload_copies"
"""The step-time term of fine-grained activation offloading (`offload_copies_s`), present only where the training
offloads (TrainingSpec.offload_modules), so that no other estimate carries a zero term for it."""


def offload_copies_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                     microbatches: np.ndarray) -> np.ndarray:
    """The part of fine-grained activation offloading's copies the layers' compute does not hide, per step.

    Megatron-Core copies each layer's offloaded tensors (memory.offloaded_bytes_per_layer) to the host on a side
    stream while the next layer runs its forward, and back one layer ahead of their backward
    (pipeline_parallel/fine_grained_activation_offload.py: bulk_offload_group on the D2H stream, bulk_reload_group
    on the H2D stream, the compute stream waiting on their events). A copy longer than the layer it overlaps holds
    the stream: per stored layer and micro-batch max(0, bytes / host link − the layer's forward) out and
    max(0, bytes / host link − its backward, BACKWARD_TO_FORWARD × the forward) back, at the profile's
    host_link_bytes_per_s (the spec sheet's nominal rate: a lower bound), on the rank where it is largest. Added
    to the step beside the pipeline (not scaled by the bubble). Zero where nothing is offloaded or the profile
    states no host link."""
    bandwidth = cluster.profile.host_link_bytes_per_s
    zeros = np.zeros(len(plans))
    if not training.offload_modules or not bandwidth:
        return zeros
    times, _ = layer_pieces(model, cluster, training, plans)     # the compute term's layer times, shared
    backward = compute_model.BACKWARD_TO_FORWARD

    def exposed(copy_s: np.ndarray, forward_s: np.ndarray) -> np.ndarray:
        return np.maximum(copy_s - forward_s, 0.0) + np.maximum(copy_s - backward * forward_s, 0.0)

    def on_stage(stage: np.ndarray) -> np.ndarray:
        shape = memory.stage_shape(model, cluster, training, plans, stage)
        (dense, dense_bytes), (moe, moe_bytes) = memory.offloaded_bytes_by_layer_kind(model, training, shape)
        return dense * exposed(dense_bytes / bandwidth, times.dense_layer_fwd_s) \
            + moe * exposed(moe_bytes / bandwidth, times.moe_layer_fwd_s)

    per_microbatch = np.max(np.stack(per_distinct_stage(candidate_stages(plans), on_stage)), axis=0)
    return microbatches * per_microbatch


TERM_NAMES: tuple[str, ...] = ("compute", "tp_comm", "cp_comm", "ep_comm", "host", "pp_bubble", "pp_p2p",
                               "dp_comm", "optimizer")
PIPELINED_TERM_NAMES = ("compute", "tp_comm", "cp_comm", "ep_comm", "host", "pp_bubble")
"""The terms that need every per-microbatch piece of a stage (compute, the TP/CP/EP collectives, the host)."""
MICROBATCH_KNOBS: tuple[str, ...] = tuple(dict.fromkeys(
    knob for term in ("compute", "tp_comm", "cp_comm", "ep_comm") for knob in TERM_KNOBS[term]))
"""What `stage_microbatch` reads on the candidate stages: every knob but zero (and zero where the engine's host
launches read it, engines.host_reads_zero). A search evaluates it once per distinct combination in each batch
(costmodels.structure.per_knobs) and copies it to the plans differing only in the knobs it does not read."""


def microbatch_knobs(training: TrainingSpec) -> tuple[str, ...]:
    """MICROBATCH_KNOBS, with zero where the engine's launches depend on it."""
    return MICROBATCH_KNOBS + (("zero",) if engines.host_reads_zero(training) else ())


def pp_bubble_s(training: TrainingSpec, plans: PlanArrays, microbatches: np.ndarray,
                per_stage: "list[StageMicrobatch]", worst_microbatch_s: np.ndarray) -> np.ndarray:
    """The pipeline's idle time per step: 1F1B's (p − 1)/v × the micro-batch time taken term by term on its worst
    stage (`worst_microbatch_s`; pipeline.bubble_microbatch_equivalents), or a zero-bubble schedule's from each
    candidate stage's own micro-batch time and weight-gradient GEMMs (pipeline.zero_bubble_s)."""
    if bubble_is_proportional(training):
        return bubble_microbatch_equivalents(plans) * worst_microbatch_s
    shape = worst_microbatch_s.shape
    stage_s = np.stack([np.broadcast_to(s.compute_s + s.tp_comm_s + s.cp_comm_s + s.ep_comm_s + s.host_s, shape)
                        for s in per_stage])
    weight_s = np.stack([np.broadcast_to(s.weight_grad_s, shape) for s in per_stage])
    return zero_bubble_s(training, plans, microbatches, stage_s, weight_s)


def require_precision_supported(cluster: ClusterSpec, training: TrainingSpec) -> None:
    """InputError when the GPU has no peak FLOP/s for the precision (fp8 on A100) or Transformer Engine does not run
    the FP8 recipe on it (mxfp8 before Blackwell)."""
    cluster.profile.require_precision(training.precision.value)
    if training.precision is Precision.FP8:
        cluster.profile.require_fp8_recipe(training.fp8_recipe.value)


def step_time_terms_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                      plans: "PlanArrays", only: "Collection[str] | None" = None) -> dict[str, np.ndarray]:
    """Named step-time terms (seconds) for every plan; their sum is the step time. With `only`, just the terms named
    there (a solver summing one group of terms; each term's value is the same as in the full call)."""
    plans = as_plan_arrays(plans)
    require_precision_supported(cluster, training)
    names = [name for name in TERM_NAMES if only is None or name in only]
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    stages = candidate_stages(plans)
    per_stage: list[StageMicrobatch] = []
    if any(name in PIPELINED_TERM_NAMES for name in names):
        with_host = "host" in names or "pp_bubble" in names

        def stage_pieces(sub: PlanArrays) -> list[StageMicrobatch]:
            times, comm = layer_pieces(model, cluster, training, sub)
            launches = engines.layer_launches(model, training, sub) if with_host else None
            return per_distinct_stage(candidate_stages(sub), lambda s: stage_microbatch(
                model, cluster, training, sub, times, s, comm, with_host, launches))

        per_stage = per_knobs(plans, microbatch_knobs(training), stage_pieces)
    elif "dp_comm" in names:          # the gradient sync reads only the stage's compute pieces
        def compute_pieces(sub: PlanArrays) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
            sub_times, _ = layer_pieces(model, cluster, training, sub)
            return per_distinct_stage(candidate_stages(sub),
                                      lambda s: stage_compute_s(model, training, sub, sub_times, s))

        zero = np.zeros(len(plans))
        pieces = per_knobs(plans, TERM_KNOBS["compute"], compute_pieces)
        per_stage = [StageMicrobatch(*piece, tp_comm_s=zero, cp_comm_s=zero, ep_comm_s=zero) for piece in pieces]

    def worst(values):
        return np.max(np.stack(values), axis=0)

    terms: dict[str, np.ndarray] = {}
    if any(name in PIPELINED_TERM_NAMES for name in names):
        compute_mb = worst([s.compute_s for s in per_stage])
        tp_mb = worst([s.tp_comm_s for s in per_stage])
        cp_mb = worst([s.cp_comm_s for s in per_stage])
        ep_mb = worst([s.ep_comm_s for s in per_stage])
        ep_paired_mb = worst([np.broadcast_to(s.ep_paired_exposed_s, ep_mb.shape) for s in per_stage])
        host_mb = worst([np.broadcast_to(s.host_s, ep_mb.shape) for s in per_stage])
        terms.update({
            "compute": microbatches * compute_mb,
            "tp_comm": microbatches * tp_mb,
            "cp_comm": microbatches * cp_mb,
            "ep_comm": microbatches * ep_exposed_per_microbatch_s(model, training, plans, ep_mb, ep_paired_mb,
                                                                  microbatches),
            "host": microbatches * host_mb,
            "pp_bubble": pp_bubble_s(training, plans, microbatches, per_stage,
                                     compute_mb + tp_mb + cp_mb + ep_mb + host_mb),
        })
    if "pp_p2p" in names:
        terms["pp_p2p"] = per_knobs(plans, TERM_KNOBS["pp_p2p"], lambda sub: pp_p2p_s(
            model, cluster, training, sub, num_microbatches(sub, cluster.num_gpus, training.global_batch_size)),
            key=("pp_p2p", id(model), id(cluster), id(training)))
    if "dp_comm" in names:
        first = first_equal_stage(stages)      # a rank whose pieces are the same object is priced once
        distinct = [k for k, j in enumerate(first) if j == k or per_stage[k] is not per_stage[j]]
        terms["dp_comm"] = worst([dp_comm_s(model, cluster, training, plans, stages[k], per_stage[k], microbatches)
                                  for k in distinct])
    if "optimizer" in names:
        terms["optimizer"] = worst(per_distinct_stage(
            stages, lambda stage: optimizer_s(model, cluster, training, plans, stage)))
    if training.offload_modules and (only is None or OFFLOAD_TERM in only):
        names.append(OFFLOAD_TERM)
        terms[OFFLOAD_TERM] = per_knobs(plans, TERM_KNOBS[OFFLOAD_TERM], lambda sub: offload_copies_s(
            model, cluster, training, sub, num_microbatches(sub, cluster.num_gpus, training.global_batch_size)))
    return {name: terms[name] for name in names}


def step_time_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """The step time: the explicit sum of `step_time_terms_s`."""
    return sum(step_time_terms_s(model, cluster, training, plans).values())


def model_flops_per_step(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs per step (no recompute, causal attention as Megatron counts it): see costmodels.compute."""
    return compute_model.model_flops_per_step(model, training)


def hardware_flops_per_step(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """FLOPs executed per step, recompute counted: see costmodels.compute."""
    return compute_model.hardware_flops_per_step(model, training, as_plan_arrays(plans))
