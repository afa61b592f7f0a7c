"""Pipeline parallelism: the schedule's bubble and the stage-to-stage transfers.

1F1B (PipeDream-Flush; Narayanan et al., arXiv 2104.04473 §2.2.1): with p stages and m microbatches the pipeline
idles (p-1) microbatch-times of forward+backward per step, a bubble fraction (p-1)/m of the ideal time.
Interleaved 1F1B with v virtual chunks per rank (§2.2.2): the bubble shrinks to (p-1)/(v·m), at v times the
point-to-point transfers.
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
    group on the receiving side (see p2p_time_s)."""
    return plans.mbs * (training.seq_len / plans.cp) * model.hidden_size * ACTIVATION_BYTES / plans.tp


def p2p_time_s(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec, plans: PlanArrays,
               num_gpus: int, nvlink_domain_gpus: int, microbatches: np.ndarray) -> np.ndarray:
    """Transfers on the critical path of a step: each rank sends forward and backward once per chunk per
    microbatch (2·v·m, arXiv 2104.04473 §2.2.2: interleaving multiplies communication by v) plus the 2(p-1)
    of the pipeline's fill and drain; on InfiniBand as soon as the pipeline spans nodes (the slowest boundary
    sets the pace), else NVLink. Without SP each transfer is followed by the TP all-gather of the scatter/gather
    optimisation (§4.1). Megatron's 1F1B blocks on these transfers, so they are not hidden."""
    placement = pp_group(plans, num_gpus, nvlink_domain_gpus)
    shard_bytes = p2p_bytes(model, training, plans)
    one = group_collective_time_s(profile, placement, "send_recv", shard_bytes)
    regather = group_collective_time_s(profile, tp_group(plans, nvlink_domain_gpus), "all_gather",
                                       shard_bytes * plans.tp)
    one = one + np.where(plans.sp, 0.0, regather)
    transfers = 2.0 * (plans.vpp * microbatches + plans.pp - 1)
    return np.where(plans.pp > 1, transfers * one, 0.0)
