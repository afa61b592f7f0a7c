"""Pipeline parallelism: the schedule's bubble and the stage-to-stage transfers.

1F1B (PipeDream-Flush; Narayanan et al., arXiv 2104.04473 §2.2.1): with p stages and m microbatches the pipeline
idles (p-1) microbatch-times of forward+backward per step, a bubble fraction (p-1)/m of the ideal time.
Interleaved 1F1B with v virtual chunks per rank (§2.2.2): the bubble shrinks to (p-1)/(v·m), at v times the
point-to-point transfers, whose steady-state backward sends Megatron-Core overlaps with the next chunk
(`p2p_transfer_counts`; what an overlapped transfer still costs is steptime.pp_p2p_s).
"""

from __future__ import annotations

import numpy as np

from costmodels.comm import group_collective_time_s, pp_group, tp_group
from costmodels.hardware import HardwareProfile
from costmodels.plan import PlanArrays
from costmodels.specs import ModelSpec, TrainingSpec

ACTIVATION_BYTES = 2
"""Activations and their gradients cross stages in bf16 (also with fp8 GEMMs: Transformer Engine keeps them bf16)."""


def bubble_microbatch_equivalents(plans: PlanArrays) -> np.ndarray:
    """Idle time of the pipeline in units of one microbatch's forward+backward on a stage: (p-1)/v
    (arXiv 2104.04473 eqs. 1–2: bubble fraction (p-1)/m, interleaved (p-1)/(v·m), times m microbatches)."""
    return (plans.pp - 1) / plans.vpp.astype(float)


def bubble_fraction(plans: PlanArrays, microbatches: np.ndarray) -> np.ndarray:
    """Bubble time over the ideal (bubble-free) pipeline time: (p-1)/(v·m)."""
    return bubble_microbatch_equivalents(plans) / microbatches


def p2p_bytes(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Bytes one GPU sends across a stage boundary per microbatch and direction: its 1/tp share of the
    b·(s/cp)·h bf16 activation. With SP each rank holds exactly that share (Megatron-Core
    p2p_communication.py sends the tensor each rank holds); without SP the TP ranks hold replicas and Megatron's
    scatter/gather optimisation (arXiv 2104.04473 §4.1) sends 1/tp of it per rank and all-gathers it over the TP
    group on the receiving side (see p2p_transfer_s)."""
    return plans.mbs * (training.seq_len / plans.cp) * model.hidden_size * ACTIVATION_BYTES / plans.tp


def p2p_transfer_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec, plans: PlanArrays,
                   num_gpus: int, nvlink_domain_gpus: int) -> np.ndarray:
    """One stage-to-stage transfer (one direction, one microbatch, one chunk): on InfiniBand as soon as the pipeline
    spans nodes (the slowest boundary sets the pace), else NVLink. Without SP it is followed by the TP all-gather of
    the scatter/gather optimisation (arXiv 2104.04473 §4.1)."""
    placement = pp_group(plans, num_gpus, nvlink_domain_gpus)
    shard_bytes = p2p_bytes(model, training, plans)
    one = group_collective_time_s(profile, placement, "send_recv", shard_bytes)
    regather = group_collective_time_s(profile, tp_group(plans, nvlink_domain_gpus), "all_gather",
                                       shard_bytes * plans.tp)
    return one + np.where(plans.sp, 0.0, regather)


def overlaps_p2p(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """Whether the steady-state transfers run asynchronously beside the other pass (--overlap-p2p-communication,
    TrainingSpec.overlap_p2p_comm): Megatron-LM's validate_args turns it off for the non-interleaved schedule
    ('non-interleaved schedule does not support overlapping p2p communication'), so only vpp > 1."""
    return (plans.pp > 1) & (plans.vpp > 1) & training.overlap_p2p_comm


def interleaved_warmup_chunks(plans: PlanArrays, microbatches: np.ndarray) -> np.ndarray:
    """Forward chunk passes the first pipeline rank runs before its first backward in the interleaved schedule:
    (p−1)·2 + (v−1)·p, at most all v·m (Megatron-Core `pipeline_parallel/schedules.py`,
    forward_backward_pipelining_with_interleaving: num_warmup_microbatches with microbatch_group_size_per_vp_stage
    = p, its default); the cooldown runs as many backward chunk passes."""
    return np.minimum((plans.pp - 1) * 2 + (plans.vpp - 1) * plans.pp, plans.vpp * microbatches)


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
    overlap, W = interleaved_warmup_chunks. (Between 4eeff55d1f, 2023-10, and those commits more of them did:
    priced as today's release, an upper bound for that software.)"""
    transfers = 2.0 * (plans.vpp * microbatches + plans.pp - 1)
    steady_backward_sends = plans.vpp * microbatches - interleaved_warmup_chunks(plans, microbatches)
    overlapped = np.where(overlaps_p2p(training, plans), steady_backward_sends, 0.0)   # 0 without a pipeline
    return np.where(plans.pp > 1, transfers - overlapped, 0.0), overlapped
