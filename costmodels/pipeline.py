"""Pipeline parallelism: the schedule's bubble and the stage-to-stage transfers.

1F1B (PipeDream-Flush; Narayanan et al., arXiv 2104.04473 §2.2.1): with p stages and m microbatches the pipeline
idles (p-1) microbatch-times of forward+backward per step, a bubble fraction (p-1)/m of the ideal time.
Interleaved 1F1B with v virtual chunks per rank (§2.2.2): the bubble shrinks to (p-1)/(v·m), at v times the
point-to-point transfers, whose steady-state backward sends Megatron-Core overlaps with the next chunk
(`p2p_transfer_counts`; what an overlapped transfer still costs is steptime.pp_p2p_s).
The zero-bubble schedules (TrainingSpec.pipeline_schedule zb-1p, zb-2p; Qi et al., arXiv 2401.10241) split the
backward into B and W and fill the fill and drain with W passes (`zero_bubble_s`).
"""

from __future__ import annotations

import numpy as np

from costmodels.comm import group_collective_time_s, pp_group, tp_group
from costmodels.hardware import HardwareProfile
from costmodels.plan import PlanArrays
from costmodels.specs import ModelSpec, PipelineSchedule, TrainingSpec

ACTIVATION_BYTES = 2
"""Activations and their gradients cross stages in bf16 (also with fp8 GEMMs: Transformer Engine keeps them bf16)."""


def bubble_microbatch_equivalents(plans: PlanArrays) -> np.ndarray:
    """Idle time of the pipeline in units of one microbatch's forward+backward on a stage: (p-1)/v
    (arXiv 2104.04473 eqs. 1–2: bubble fraction (p-1)/m, interleaved (p-1)/(v·m), times m microbatches)."""
    return (plans.pp - 1) / plans.vpp.astype(float)


def zero_bubble_2p_min_microbatches(plans: PlanArrays) -> np.ndarray:
    """Micro-batches ZB-2p needs to reach its zero bubble: 2p − 1, the forwards the first rank runs before its first
    B in the handcrafted ZB-H2 (arXiv 2401.10241 §2.2 and Table 2: peak (2p − 1)·M_B on the first worker), which
    fill the (p − 1)·(T_F + T_B) it waits for that micro-batch to come back."""
    return 2 * plans.pp - 1


def zero_bubble_s(training: TrainingSpec, plans: PlanArrays, microbatches: np.ndarray,
                  stage_microbatch_s: np.ndarray, weight_grad_s: np.ndarray) -> np.ndarray:
    """Idle seconds per step of a zero-bubble schedule (arXiv 2401.10241), beyond m micro-batch times of the
    slowest stage. `stage_microbatch_s` and `weight_grad_s` are (stages, plans): each candidate stage's micro-batch
    time T = T_F + T_B + T_W and its weight-gradient part T_W (steptime.stage_weight_grad_s); the bubble is the
    largest over the stages, each stage's T paired with its own W.

    ZB-1p: the paper's Table 2 gives ZB-H1's bubble (p − 1)(T_F + T_B − T_W) = (p − 1)·T − 2(p − 1)·T_W against
    1F1B's (p − 1)·T, for m ≥ p, and its automatic ZB-1p computes the same in every setting (Table 5: the memory
    limit binds). With one micro-batch only the W after the last B can trail: the critical path is p(T_F + T_B) +
    T_W, a bubble (p − 1)(T − T_W). Between the two the saving is priced as (p − 1 + min(m − 1, p − 1))·T_W: one
    more W held back per extra micro-batch, up to p − 1 (an interpolation between the two exact ends).
    ZB-2p: with its 2p memory limit and the optimizer's all-reduce replaced by post-validation (§4), the paper's
    computed bubble is 0.1-0.7 % of the step at m = 3p..16p (Table 5; 4.3 % for its 1.5B model at m = 24 = 3p):
    priced as none once m reaches `zero_bubble_2p_min_microbatches` (2p − 1, below the m the paper measured: the
    handcrafted ZB-H2's warm-up, extrapolated); below that it holds no more micro-batches than ZB-1p could and is
    priced as ZB-1p (an upper bound: a looser memory limit never lengthens the searched schedule)."""
    pp = plans.pp.astype(float)
    held_back = (pp - 1.0) + np.minimum(microbatches - 1.0, pp - 1.0)
    one_p = np.max(np.maximum((pp - 1.0) * stage_microbatch_s - held_back * weight_grad_s, 0.0), axis=0)
    one_p = np.where(plans.pp > 1, one_p, 0.0)
    if training.pipeline_schedule is PipelineSchedule.ZB_1P:
        return one_p
    return np.where(microbatches >= zero_bubble_2p_min_microbatches(plans), 0.0, one_p)


def bubble_is_proportional(training: TrainingSpec) -> bool:
    """Whether the bubble is `bubble_microbatch_equivalents(pp, vpp)` × the stage's micro-batch time (1F1B), which a
    solver can form as a product of two variables; the zero-bubble schedules' depends on the W share of that time."""
    return training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B


def bubble_fraction(plans: PlanArrays, microbatches: np.ndarray) -> np.ndarray:
    """Bubble time over the ideal (bubble-free) pipeline time: (p-1)/(v·m)."""
    return bubble_microbatch_equivalents(plans) / microbatches


def p2p_bytes(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Bytes one GPU sends across a stage boundary per microbatch and direction: the tensor it holds of the
    b·(s/cp)·h bf16 activation. With SP that is its 1/tp share; without SP the TP ranks hold replicas and each sends
    its whole one to its peer of the next stage (Megatron-Core schedules.py get_tensor_shapes: the sequence is
    divided by tp only under sequence parallelism; p2p_communication.py sends the tensor as it is), unless the run
    is Megatron-LM's before core's p2p (TrainingSpec.p2p_scatter_gather: 1/tp of it per rank, all-gathered on the
    receiving side, see p2p_transfer_s)."""
    whole = plans.mbs * (training.seq_len / plans.cp) * model.hidden_size * ACTIVATION_BYTES
    return whole / np.where(plans.sp | training.p2p_scatter_gather, plans.tp, 1)


def p2p_transfer_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec, plans: PlanArrays,
                   num_gpus: int, nvlink_domain_gpus: int) -> np.ndarray:
    """One stage-to-stage transfer (one direction, one microbatch, one chunk): on InfiniBand as soon as the pipeline
    spans nodes (the slowest boundary sets the pace), else NVLink. Under the scatter/gather of Megatron-LM before
    core's p2p (TrainingSpec.p2p_scatter_gather) and without SP it is followed by the TP all-gather that restores the
    tensor (arXiv 2104.04473 §4.1)."""
    placement = pp_group(plans, num_gpus, nvlink_domain_gpus)
    sent_bytes = p2p_bytes(model, training, plans)
    one = group_collective_time_s(profile, placement, "send_recv", sent_bytes)
    if not training.p2p_scatter_gather:
        return one
    regather = group_collective_time_s(profile, tp_group(plans, nvlink_domain_gpus), "all_gather",
                                       sent_bytes * plans.tp)
    return one + np.where(plans.sp, 0.0, regather)


def overlaps_p2p(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Whether the steady-state transfers run asynchronously beside the other pass (--overlap-p2p-communication,
    TrainingSpec.overlap_p2p_comm): Megatron-LM's validate_args turns it off for the non-interleaved schedule
    ('non-interleaved schedule does not support overlapping p2p communication'), so only vpp > 1."""
    return (plans.pp > 1) & (plans.vpp > 1) & training.overlap_p2p_comm


def microbatch_group(pp: "np.ndarray | int", group: int) -> "np.ndarray | int":
    """The interleaved schedule's micro-batch group g (TrainingSpec.microbatch_group_size_per_vp_stage, `group`):
    pp for 0, Megatron's default; taken as pp below it (rule `batch` refuses such a group, as Megatron-Core does)."""
    return np.maximum(group, pp) if group else pp


def interleaved_warmup_chunks(plans: PlanArrays, microbatches: np.ndarray, group: int = 0) -> np.ndarray:
    """Forward chunk passes the first pipeline rank runs before its first backward in the interleaved schedule:
    (p−1)·2 + (v−1)·g, at most all v·m (Megatron-Core `pipeline_parallel/schedules.py`,
    forward_backward_pipelining_with_interleaving: num_warmup_microbatches), g the micro-batch group
    (`microbatch_group`); the cooldown runs as many backward chunk passes."""
    pp = plans.pp.astype(float)
    g = microbatch_group(pp, group)
    return np.minimum((pp - 1.0) * 2.0 + (plans.vpp - 1.0) * g, plans.vpp * microbatches)


def p2p_transfer_counts(training: TrainingSpec, plans: PlanArrays, microbatches: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, overlapped) stage-to-stage transfers on the critical path of a step.

    Each rank sends forward and backward once per chunk per microbatch (2·v·m, arXiv 2104.04473 §2.2.2:
    interleaving multiplies communication by v), plus the 2(p−1) of the pipeline's fill and drain. Megatron's
    schedule blocks on each of them (batched isend/irecv waited on at once), unless `overlaps_p2p`. Then, in the
    Megatron-Core the exports target (core_v0.19.0, schedules.py forward_backward_pipelining_with_interleaving):
    the warmup and cooldown transfers block (overlap_p2p_comm_warmup_flush is off by default; since 4295be1a6c,
    2024-11); in the steady state the backward send of a chunk is left in flight while the next forward computes and
    waited on one step later, while the forward send is waited on at once before its output is freed (Megatron-LM
    always sets deallocate_pipeline_outputs; since 260cba7133, 2026-04, core_v0.18). So v·m − W of the transfers
    overlap, W = interleaved_warmup_chunks (with the run's micro-batch group). (Between 4eeff55d1f, 2023-10, and
    those commits more of them did: priced as today's release, an upper bound for that software.)"""
    transfers = 2.0 * (plans.vpp * microbatches + plans.pp - 1)
    steady_backward_sends = plans.vpp * microbatches - interleaved_warmup_chunks(
        plans, microbatches, training.microbatch_group_size_per_vp_stage)
    overlapped = np.where(overlaps_p2p(training, plans), steady_backward_sends, 0.0)   # 0 without a pipeline
    return np.where(plans.pp > 1, transfers - overlapped, 0.0), overlapped
