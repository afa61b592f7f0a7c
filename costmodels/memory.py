"""Memory per GPU on one pipeline stage, as named terms, vectorised over many plans (DESIGN.md §4).

Every term is its own function of (model, training, the stage's shape) with its source in a comment; the total on a
stage is the explicit sum of the terms `memory_terms_bytes` returns, and `peak_memory` reports the worst pipeline rank.

Conventions (Megatron-LM mixed precision, bf16):
- weights bf16 (2 bytes/param); main gradients fp32 (4 bytes/param, Megatron accumulates and all-reduces gradients in
  fp32 by default for bf16; 2 with TrainingSpec.grad_reduce_in_fp32 off, --grad-reduce-in-bf16); Adam fp32 master
  copy + m + v (12 bytes/param) -> 18 bytes/param unsharded, as in
  Megatron's `megatron/training/theoretical_memory_usage.py` (`num_bytes_per_parameter = 18`).
- zero=1 is Megatron's distributed optimizer: `6 + 12/dp` bytes/param (same file), where dp counts the CP ranks too:
  Megatron-Core builds the optimizer on the dp·cp group; zero=2 also shards the gradients and zero=3 also the weights (ZeRO, Rajbhandari et al., arXiv 1910.02054 §5: P_os, P_os+g, P_os+g+p).
  Routed-expert parameters shard over the expert-data-parallel group edp = N/(etp·ep·pp) instead of dp
  (Megatron-Core `expert_data_parallel_group`).
- activations follow Korthikanti et al., arXiv 2205.05198 §4 (Table 2), generalised term by term below (the 34 of
  s·b·h·(34 + 5·a·s/h) is rebuilt from the real MLP width, gated MLPs, GQA/MLA and the norm kind); bf16 tensors are 2
  bytes per element, dropout masks 1 byte, token ids 8 bytes (int64), softmax statistics fp32.
- decoder layers are placed contiguously on the pipeline ranks (costmodels.params, which ignores the interleaved
  placement of chunks when counting MoE layers per rank).

Tokens of one micro-batch, per GPU:
- `T = s·b/cp`: the micro-batch's tokens on one context-parallel rank (every TP rank of it sees them);
- `T_rep = T/t` with sequence parallelism, else `T`: tensors outside the tensor-parallel region (norms, residual
  stream, dropout masks) are replicated over TP without SP and split over it with SP (Korthikanti §4.2.2);
- `T/t` for tensors inside the tensor-parallel region (split by heads or by MLP columns).

Not counted, on purpose: Megatron's DDP gradient buckets (views into the fp32 gradient buffer) and the distributed
optimizer's parameter all-gather (into the bf16 parameter buffer itself) need no memory of their own; allocator
fragmentation is what the cluster's headroom (20% by default) is for; the activation gradients alive during the
backward pass are a few s·b·h and, like Korthikanti and Megatron, left out. Under fp8 the linear layers' saved inputs
are fp8 (`saved_linear_input_bytes`); weights stay bf16, and Transformer Engine keeps fp8 copies of them beside
(`fp8_weight_copies_bytes`), unless the weights are fp8 parameters (TrainingSpec.fp8_param_gather): then the copies'
layouts are the weights and there is no bf16 copy (`layer_weight_bytes_per_param`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from costmodels import engines, params
from costmodels.compute import fp8_tn_only, moe_load_factor
from costmodels.errors import InputError
from costmodels.hardware import HardwareProfile
from costmodels.pipeline import microbatch_group
from costmodels.plan import (Plan, PlanArrays, Recompute, RecomputeModule, StageContent, data_parallel_size,
                             embedding_loss_slots, expert_data_parallel_size, layers_on_stage,
                             layers_per_middle_stage, num_microbatches, recomputes_module)
from costmodels.specs import (ClusterSpec, CrossEntropyKernel, Engine, Fp8Recipe, LaunchPath, MlpKind, ModelSpec,
                              NormKind, PipelineSchedule, TrainingSpec, fp8_copy_bytes_per_element)
from costmodels.structure import stage_list

BF16_BYTES = 2
FP32_BYTES = 4
MASK_BYTES = 1          # dropout masks are uint8 / bool in PyTorch
TOKEN_ID_BYTES = 8      # int64 token ids (Megatron theoretical_memory_usage: "8 * s * b" input to embedding)
WEIGHT_BYTES_PER_PARAM = BF16_BYTES
OPTIMIZER_BYTES_PER_PARAM = 3 * FP32_BYTES   # fp32 master weights + Adam m + Adam v

# ---- which Plan fields each term depends on (besides model, cluster, training) --------------------------------------
# dp = N/(tp·cp·pp) counts through (tp, cp, pp); edp = N/(etp·ep·pp) through (etp, ep, pp); num_microbatches through
# (tp, cp, pp, mbs). A term that differs between pipeline ranks also lists "pp" (the rank's position: first, last).
_STATIC_LAYER_KNOBS = ("tp", "pp", "cp", "zero", "first_stage_layers", "last_stage_layers")
_STATIC_EXPERT_KNOBS = ("pp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers")
_STATIC_EMBEDDING_KNOBS = ("tp", "pp", "cp", "zero")
_STAGE_ACTIVATION_KNOBS = ("tp", "sp", "cp", "pp", "vpp", "mbs", "recompute", "recompute_layers",
                           "recompute_modules", "first_stage_layers", "last_stage_layers")

TERM_KNOBS: dict[str, tuple[str, ...]] = {
    "weights": _STATIC_LAYER_KNOBS,
    "gradients": _STATIC_LAYER_KNOBS,
    "optimizer_states": _STATIC_LAYER_KNOBS,
    "expert_weights": _STATIC_EXPERT_KNOBS,
    "expert_gradients": _STATIC_EXPERT_KNOBS,
    "expert_optimizer_states": _STATIC_EXPERT_KNOBS,
    "embedding_weights": _STATIC_EMBEDDING_KNOBS,
    "embedding_gradients": _STATIC_EMBEDDING_KNOBS,
    "embedding_optimizer_states": _STATIC_EMBEDDING_KNOBS,
    "layer_activations": _STAGE_ACTIVATION_KNOBS,
    "recomputed_layer_inputs": _STAGE_ACTIVATION_KNOBS,
    "sac_saved_activations": _STAGE_ACTIVATION_KNOBS + ("ep", "etp"),
    "moe_router_activations": _STAGE_ACTIVATION_KNOBS,
    "moe_dispatch_activations": _STAGE_ACTIVATION_KNOBS + ("etp",),
    "expert_mlp_activations": _STAGE_ACTIVATION_KNOBS + ("etp",),
    "moe_stash_working_set": ("tp", "cp", "pp", "mbs", "etp", "recompute", "recompute_layers",
                              "recompute_modules", "first_stage_layers", "last_stage_layers"),
    "recompute_working_set": ("tp", "sp", "cp", "mbs", "etp", "recompute", "recompute_layers", "pp", "vpp",
                              "first_stage_layers", "last_stage_layers"),
    "embedding_activations": ("tp", "sp", "cp", "pp", "vpp", "mbs"),
    "output_layer_activations": ("tp", "sp", "cp", "pp", "mbs"),
    "logits": ("tp", "cp", "pp", "mbs"),
    "cross_entropy_buffers": ("tp", "cp", "pp", "mbs"),
    "pending_output_wgrad": ("tp", "sp", "cp", "pp", "mbs"),
    "deferred_output_wgrad": ("tp", "sp", "cp", "pp", "mbs"),
    "pipeline_outputs": _STAGE_ACTIVATION_KNOBS,
    "mtp_activations": ("tp", "sp", "cp", "pp", "mbs", "etp"),
    "fp8_weight_copies": ("tp", "pp", "cp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers"),
    "zero_gradient_buckets": ("tp", "pp", "cp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers"),
    "ddp_gradient_buckets": ("tp", "pp", "cp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers"),
    "zero3_prefetch_buffers": ("tp", "pp", "cp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers"),
    "tp_comm_userbuffers": ("tp", "sp", "cp", "mbs"),
    "cuda_graph_attention_masks": ("tp", "cp", "pp", "vpp", "mbs", "first_stage_layers", "last_stage_layers"),
    "cuda_graph_loader_batches": ("tp", "cp", "pp", "mbs"),
    "moe_dispatcher_buffers": ("tp", "sp", "cp", "mbs", "ep", "etp", "pp", "first_stage_layers",
                               "last_stage_layers"),
}
"""Plan fields each memory term depends on. Fixed-overhead terms (one per key of the profile's
`memory.overheads_gib`, e.g. cuda_context, nccl_buffers) depend on no knob: see `term_knobs`."""

_VARIES_WITH_LAYERS = "layers"            # through the rank's layer count and dense/MoE mix (first/last split, pp)
_VARIES_WITH_LAYERS_IN_FLIGHT = "layers_in_flight"   # ... and the micro-batches the rank holds (pp - stage, vpp)
TERM_STAGE_DEPENDENCE: dict[str, str] = {
    **{name: _VARIES_WITH_LAYERS for name in (
        "weights", "gradients", "optimizer_states", "expert_weights", "expert_gradients", "expert_optimizer_states",
        "fp8_weight_copies", "recompute_working_set", "zero_gradient_buckets", "ddp_gradient_buckets",
        "zero3_prefetch_buffers", "moe_stash_working_set", "moe_dispatcher_buffers")},
    **{name: "first_and_last" for name in (
        "embedding_weights", "embedding_gradients", "embedding_optimizer_states", "cuda_graph_loader_batches")},
    **{name: _VARIES_WITH_LAYERS_IN_FLIGHT for name in (
        "layer_activations", "recomputed_layer_inputs", "sac_saved_activations", "moe_router_activations",
        "moe_dispatch_activations", "expert_mlp_activations", "pipeline_outputs", "cuda_graph_attention_masks")},
    "embedding_activations": "first",
    "tp_comm_userbuffers": "every",
    **{name: "last" for name in ("output_layer_activations", "logits", "cross_entropy_buffers",
                                 "pending_output_wgrad", "deferred_output_wgrad", "mtp_activations")},
}
"""How each term varies between pipeline ranks: 'first' / 'last' (zero elsewhere), 'first_and_last' (zero on middle
ranks), 'layers' (with the rank's layers), 'layers_in_flight' (with its layers and its in-flight micro-batches),
'every' (the same on every rank, STAGE_INDEPENDENT_TERMS). The fixed overheads are the same on every rank. Under an
engine that frees the gradients between steps with one micro-batch a step (`gradients_at_peak_share`), the gradient
terms hold the share of them that exceeds the rank's activations: they stay 'layers' terms, but their size on a rank
also reads its activations (GRADIENT_TERM_EXTRA_KNOBS), and is zero where those are the larger. The loader
batches a whole-iteration CUDA graph keeps are 'first_and_last' where Megatron-LM builds the loader, and on every
rank where it is built on every rank (TrainingSpec.dataloader_on_every_rank: Megatron-Bridge)."""

STAGE_INDEPENDENT_TERMS: frozenset[str] = frozenset({"tp_comm_userbuffers"})
"""Terms of TERM_KNOBS equal on every pipeline rank (TERM_STAGE_DEPENDENCE 'every'), like the fixed overheads,
which have no knobs."""


MODEL_STATE_TERMS: tuple[str, ...] = (
    "weights", "gradients", "optimizer_states", "expert_weights", "expert_gradients", "expert_optimizer_states",
    "embedding_weights", "embedding_gradients", "embedding_optimizer_states", "fp8_weight_copies")
"""Weights (and their fp8 copies), gradients and optimizer states (what Korthikanti and Megatron call 'weights and
optimizer')."""

ACTIVATION_TERMS: tuple[str, ...] = (
    "layer_activations", "recomputed_layer_inputs", "sac_saved_activations", "recompute_working_set",
    "moe_router_activations",
    "moe_dispatch_activations", "expert_mlp_activations", "moe_stash_working_set", "embedding_activations",
    "output_layer_activations",
    "logits", "cross_entropy_buffers", "pending_output_wgrad", "deferred_output_wgrad", "pipeline_outputs",
    "mtp_activations")
"""Everything kept for (or created by) the backward pass."""

GRADIENT_TERM_EXTRA_KNOBS: tuple[str, ...] = ("ep", "etp", "zero")
"""Besides the activation terms' knobs, what the gradients at the peak read under an engine that frees them: the
expert sharding and the ZeRO stage of the gradients themselves (`gradients_at_peak_share`)."""

BUFFER_TERMS: tuple[str, ...] = ("zero_gradient_buckets", "ddp_gradient_buckets", "zero3_prefetch_buffers",
                                  "tp_comm_userbuffers", "moe_dispatcher_buffers", "cuda_graph_attention_masks",
                                  "cuda_graph_loader_batches")
"""Working buffers: communication's, and the CUDA graphs' static inputs; the profile's fixed overheads are the
remaining terms."""


def group_bytes(terms: dict[str, np.ndarray], group: tuple[str, ...]) -> np.ndarray:
    """Sum of the terms of `group` present in `terms` (e.g. ACTIVATION_TERMS)."""
    return sum((value for name, value in terms.items() if name in group), np.zeros_like(next(iter(terms.values()))))


GRADIENT_TERMS: tuple[str, ...] = ("gradients", "embedding_gradients", "expert_gradients")
"""The gradients of a rank's parameters, whose share at the peak `gradients_at_peak_share` gives."""


def term_knobs(term: str, training: "TrainingSpec | None" = None) -> tuple[str, ...]:
    """Plan fields `term` depends on; fixed overheads (any other key) depend on none. Under an engine that frees its
    gradients between steps (`frees_gradients_between_steps`), a gradient term also depends on what sets the
    activations it may replace at the peak and on the micro-batch count (`gradients_at_peak_share`)."""
    knobs = TERM_KNOBS.get(term, ())
    if training is not None and term in GRADIENT_TERMS and frees_gradients_between_steps(training):
        activation_knobs = (knob for name in ACTIVATION_TERMS for knob in TERM_KNOBS[name])
        return tuple(dict.fromkeys((*knobs, *activation_knobs, *GRADIENT_TERM_EXTRA_KNOBS)))
    return knobs


# ---- the shape of one pipeline rank, shared by the term functions -------------------------------------------------

@dataclass(frozen=True)
class StageShape:
    """Everything the term functions need about pipeline rank `stage` of each plan (arrays of len(plans))."""

    plans: PlanArrays
    stage: np.ndarray
    is_first: np.ndarray
    is_last: np.ndarray
    layers: np.ndarray
    """Decoder layers on the rank (all its virtual chunks)."""
    moe_layers: np.ndarray
    recomputed_layers: np.ndarray
    """Layers whose activations are dropped and recomputed (full recompute, Megatron's block method; torchtitan's
    per-op selective checkpointing, which keeps some op outputs besides: sac_saved_activations_bytes)."""
    offloaded_layers: np.ndarray
    """Layers whose activations are on the host (TrainingSpec.cpu_offload_layers; pp = 1 only)."""
    in_flight: np.ndarray
    """Micro-batches whose activations the rank holds at its peak, in units of the whole rank's layers."""
    num_microbatches: np.ndarray
    """Micro-batches per step (gbs / (dp·mbs))."""
    dp: np.ndarray
    edp: np.ndarray
    dp_cp: np.ndarray
    """Group the non-expert gradients and optimizer states shard over: dp·cp (Megatron-Core builds the distributed
    optimizer on `get_data_parallel_group(with_context_parallel=True)`, megatron/core/optimizer/__init__.py)."""
    layer_params_per_gpu: np.ndarray
    """Non-expert decoder-layer (and MTP) parameters on one GPU of the rank."""
    expert_params_per_gpu: np.ndarray
    embedding_params_per_gpu: np.ndarray
    """Word/position embedding (first rank), output layer and final norm (last rank) on one GPU."""
    tokens: np.ndarray
    """T = s·b/cp: tokens of one micro-batch on one context-parallel rank."""
    tokens_outside_tp: np.ndarray
    """T/t with sequence parallelism, else T."""
    tokens_inside_tp: np.ndarray
    """T/t."""

    @property
    def stored_layers(self) -> np.ndarray:
        """Layers whose activations stay on the GPU: neither recomputed nor offloaded."""
        return self.layers - self.recomputed_layers - self.offloaded_layers

    @property
    def stored_fraction(self) -> np.ndarray:
        return np.where(self.layers > 0, self.stored_layers / np.maximum(self.layers, 1e-12), 0.0)


def in_flight_microbatches(plans: PlanArrays, stage: np.ndarray, microbatches: np.ndarray,
                           schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B, group: int = 0,
                           layers: "np.ndarray | None" = None, embedding_slot: "np.ndarray | bool" = False,
                           loss_slot: "np.ndarray | bool" = False, moe_a2a_overlap: bool = False) -> np.ndarray:
    """Micro-batches of activations held by pipeline rank `stage` at its peak, in units of the rank's whole layers.

    1F1B (PipeDream-Flush, Narayanan et al. arXiv 2104.04473 §2.2): rank r runs pp - r - 1 warm-up forwards and
    holds pp - r micro-batches when the first backward starts.
    Interleaved 1F1B: Megatron-Core's schedule (megatron/core/pipeline_parallel/schedules.py,
    `get_pp_rank_microbatches`) warms up W = (pp - r - 1)·2 + (vpp - 1)·g chunk-micro-batches, g the micro-batch
    group (TrainingSpec.microbatch_group_size_per_vp_stage, default pp), and the first steady step adds one: the
    rank holds N = W + 1 chunk-micro-batches (never more than the step's m·vpp), taken in the order of
    `get_schedule_table`: g micro-batches through chunk 0, the same g through chunk 1, ..., then the next group.
    With vpp equal chunks of L_r/vpp layers that is N/vpp whole-rank micro-batches; for g = pp and r = 0,
    pp·(1 + (pp - 1)/(pp·vpp)), Korthikanti §4.2.3's factor and Megatron theoretical_memory_usage's
    `interleaved_schedule_memory_penalty`; for vpp = 1, pp - r. Where the embedding (loss) takes a layer slot of
    the first (last) rank (`--account-for-embedding/loss-in-pipeline-split`, costmodels.plan.embedding_loss_slots),
    that rank's first (last) chunk holds one decoder layer fewer, and a lighter chunk moves the peak past the first
    steady step (its entries leave while heavier ones come): such a rank's peak is the schedule walked
    (interleaved_held_layers, in whole-rank micro-batches). `layers` (the rank's decoder layers) is needed for
    that; without it chunks are equal.
    Never more than the step's micro-batches (theoretical_memory_usage: `min(1, num_microbatches / pp)`).
    With the MoE all-to-all overlapped between micro-batches (`moe_a2a_overlap`, overlap_moe_expert_parallel_comm)
    the interleaved schedule warms up one chunk-micro-batch more, so that every steady step's forward and backward
    are independent (get_pp_rank_microbatches: `num_warmup_microbatches = num_warmup_microbatches + 1`).
    Zero-bubble schedules (not interleaved; arXiv 2401.10241 §2.3): worker r holds (p − r)·M_B + r·M_W under ZB-H1 /
    ZB-1p and (2p − 2r − 1)·M_B + 2r·M_W under ZB-H2 / ZB-2p, M_W the activations a pending W pass keeps (the
    layer input and the output gradient, Table 1: 32sbh against M_B's sb(34h + 5as)); priced at M_B, so p and
    2p − 1 on every rank (the first rank's exact peak, an upper bound of at most 6% on the others).
    """
    pp = plans.pp.astype(float)
    if schedule is PipelineSchedule.ZB_1P:
        return np.minimum(np.broadcast_to(pp, np.shape(stage)), microbatches)
    if schedule is PipelineSchedule.ZB_2P:
        return np.minimum(np.broadcast_to(2.0 * pp - 1.0, np.shape(stage)), microbatches)
    vpp = plans.vpp.astype(float)
    g = microbatch_group(pp, group)
    warmup = (pp - stage - 1.0) * 2.0 + (vpp - 1.0) * g + (1.0 if moe_a2a_overlap else 0.0)
    entries = np.minimum(warmup + 1.0, np.asarray(microbatches, dtype=float) * vpp)
    held = entries / vpp
    if layers is not None:
        # a rank whose first (last) chunk is a layer lighter: the peak comes where the held mix of chunks is heaviest,
        # past the first steady step (its entries leave, heavier ones come), so the schedule is walked
        e = np.asarray(embedding_slot, dtype=float) * (stage == 0)
        loss = np.asarray(loss_slot, dtype=float) * (stage == plans.pp - 1)
        rank_layers = np.asarray(layers, dtype=float)
        shape = np.shape(held)
        lighter = np.broadcast_to((vpp > 1) & (rank_layers > 0) & ((e > 0) | (loss > 0)) & np.isfinite(microbatches)
                                  & (microbatches <= MAX_WALKED_MICROBATCHES), shape)
        if lighter.any():
            columns = np.stack([np.broadcast_to(np.asarray(c, dtype=float), shape)[lighter] for c in
                                (pp, vpp, stage, np.round(microbatches), rank_layers, e, loss)], axis=1)
            cases, where = np.unique(columns, axis=0, return_inverse=True)
            walked = np.array([_walked_slot_rank(*case, group, moe_a2a_overlap) for case in cases])
            held = np.array(np.broadcast_to(held, shape), dtype=float)
            held[lighter] = walked[where.ravel()]
    plain = pp - stage
    held = np.where(plans.vpp > 1, held, plain)
    return np.minimum(held, microbatches)


def interleaved_held_layers(pp: int, vpp: int, rank: int, microbatches: int, group: int,
                            chunk_layers: "np.ndarray | list[float]", extra_warmup: int = 0) -> float:
    """Layer-micro-batches of activations pipeline rank `rank` holds at its peak in the interleaved schedule when its
    vpp chunks hold `chunk_layers` decoder layers each (chunk 0 first), by walking Megatron-Core's schedule
    (pipeline_parallel/schedules.py): forwards in `get_schedule_table` order (micro-batches in groups of g =
    `group`, or pp for 0: the group through chunk 0, the same group through chunk 1, ..., then the next group),
    backwards in the same order with chunk vpp-1-c for c (get_model_chunk_id(forward=False)); W = (pp - rank - 1)·2
    + (vpp - 1)·g warmup forwards (+ `extra_warmup`: the EP overlap's one more), then one forward and one backward
    per steady step. The peak is the largest sum of the held entries' chunk layers after a forward: with equal
    chunks W + 1 entries at any steady step (in_flight_microbatches' closed form), with unequal ones whenever the
    held mix of chunks is heaviest, later than the first steady step where a light chunk leaves and a heavy one
    comes."""
    layers = np.asarray(chunk_layers, dtype=float)
    g = int(microbatch_group(pp, group))
    chunks = np.concatenate([np.repeat(np.arange(vpp), min(g, microbatches - start))
                             for start in range(0, microbatches, g)]) if microbatches > 0 else np.zeros(0, int)
    total = len(chunks)
    if not total:
        return 0.0
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * g + extra_warmup, total)
    forwards = np.cumsum(layers[chunks])
    backwards = np.concatenate(([0.0], np.cumsum(layers[vpp - 1 - chunks])))
    steady = total - warmup
    if steady <= 0:
        return float(forwards[-1])
    step = np.arange(steady)
    return float(np.max(forwards[warmup + step] - backwards[step]))


def rank_in_flight(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, rank: "np.ndarray | int",
                   microbatches: np.ndarray, layers: np.ndarray, moe_a2a_overlap: bool) -> np.ndarray:
    """StageShape.in_flight of pipeline rank `rank`: a layout's ranks walked chunk by chunk (`layout_in_flight`),
    an even split's by `in_flight_microbatches` with the embedding / loss layer slots (a layout's chunks are its
    own: not known per rank there); `moe_a2a_overlap` the EP overlap's one more warm-up chunk."""
    if isinstance(rank, StageContent) and rank.chunk_layers is not None:
        return layout_in_flight(plans, rank, microbatches, training, moe_a2a_overlap)
    stage = np.broadcast_to(np.asarray(rank, dtype=np.int64), (len(plans),))
    slots = (False, False) if isinstance(rank, StageContent) else embedding_loss_slots(model.num_layers, plans)
    return in_flight_microbatches(plans, stage, microbatches, training.pipeline_schedule,
                                  training.microbatch_group_size_per_vp_stage, layers, *slots,
                                  moe_a2a_overlap=moe_a2a_overlap)


MAX_WALKED_MICROBATCHES = 1e5
"""An even split with an embedding or loss slot is walked (interleaved_held_layers) up to this many micro-batches a
step (a walk is O(m·vpp)); beyond, its chunks are taken as equal."""


@functools.lru_cache(maxsize=4096)
def _walked_slot_rank(pp: float, vpp: float, rank: float, microbatches: float, rank_layers: float, embedding: float,
                      loss: float, group: int, moe_a2a_overlap: bool) -> float:
    """in_flight_microbatches of an even split's rank with the embedding (loss) slot: its vpp chunks of
    (layers + slots) / vpp layers, the first (last) one a layer lighter, walked; in whole-rank micro-batches."""
    v = int(vpp)
    chunks = np.full(v, (rank_layers + embedding + loss) / v)
    chunks[0] -= embedding
    chunks[-1] -= loss
    return interleaved_held_layers(int(pp), v, int(rank), int(microbatches), group, chunks,
                                   1 if moe_a2a_overlap else 0) / rank_layers


def layout_in_flight(plans: PlanArrays, ranks: StageContent, microbatches: np.ndarray, training: TrainingSpec,
                     moe_a2a_overlap: bool) -> np.ndarray:
    """in_flight_microbatches of a layout's ranks, whose chunks may hold different numbers of layers: the
    interleaved schedule's peak held layers (`interleaved_held_layers`) over the rank's layers; 1F1B and the
    zero-bubble schedules hold whole micro-batches, as in_flight_microbatches says."""
    closed = in_flight_microbatches(plans, np.asarray(ranks), microbatches, training.pipeline_schedule,
                                    training.microbatch_group_size_per_vp_stage, moe_a2a_overlap=moe_a2a_overlap)
    interleaved = (plans.vpp > 1) & (training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B)
    held = np.array(closed, dtype=float)
    for i in np.flatnonzero(interleaved & (np.asarray(ranks.layers) > 0)):
        layers = interleaved_held_layers(int(plans.pp[i]), int(plans.vpp[i]), int(ranks[i]),
                                         int(round(float(microbatches[i]))),
                                         training.microbatch_group_size_per_vp_stage, ranks.chunk_layers[i],
                                         1 if moe_a2a_overlap else 0)
        held[i] = min(layers / float(ranks.layers[i]), float(microbatches[i]))
    return held


def stage_shape(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                stage: "np.ndarray | int") -> StageShape:
    """The shape of pipeline rank `stage` (int, or one rank per plan) for every plan."""
    rank = stage                 # as given: a candidate rank's identity lets costmodels.structure share its values
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(plans),))
    layers = layers_on_stage(model.num_layers, plans, rank)
    moe_layers = params.moe_layers_on_stage(model, plans, rank)
    # Megatron --recompute-method block --recompute-num-layers n: n layers of every virtual chunk are recomputed
    recompute_all = plans.recompute_layers == 0
    per_rank = np.minimum(plans.recompute_layers * plans.vpp, layers)
    # torchtitan's per-op selective checkpointing wraps every block (engines.per_op_sac): each keeps its input and
    # the op outputs its policy saves (sac_saved_activations_bytes), the rest is recomputed as under full
    checkpointed = (plans.recompute == Recompute.FULL) | engines.per_op_sac(training, plans)
    recomputed = np.where(checkpointed, np.where(recompute_all, layers, per_rank), 0.0)
    # CPU offloading (pp = 1, no recompute: rule cpu_offloading): at most L - N layers' activations on the GPU
    offloaded = np.where((plans.pp == 1) & (plans.recompute == Recompute.NONE),
                         np.minimum(float(training.cpu_offload_layers), layers), 0.0)
    non_expert, expert = params.stage_params_per_gpu(model, plans, rank)
    embedding = params.stage_embedding_params_per_gpu(model, plans, rank)
    tokens = training.seq_len * plans.mbs / plans.cp
    microbatches = num_microbatches(plans, cluster.num_gpus, training.global_batch_size)
    return StageShape(
        plans=plans, stage=stage, is_first=stage == 0, is_last=stage == plans.pp - 1,
        layers=layers, moe_layers=moe_layers, recomputed_layers=recomputed, offloaded_layers=offloaded,
        num_microbatches=microbatches,
        in_flight=rank_in_flight(model, training, plans, rank, microbatches, layers,
                                 training.moe_a2a_overlap and model.moe is not None),
        dp=data_parallel_size(plans, cluster.num_gpus), edp=expert_data_parallel_size(plans, cluster.num_gpus),
        dp_cp=data_parallel_size(plans, cluster.num_gpus) * plans.cp,
        layer_params_per_gpu=non_expert - embedding, expert_params_per_gpu=expert,
        embedding_params_per_gpu=embedding,
        tokens=tokens, tokens_outside_tp=np.where(plans.sp, tokens / plans.tp, tokens),
        tokens_inside_tp=tokens / plans.tp,
    )


# ---- weights, gradients, optimizer states ------------------------------------------------------------------------
# Bytes per parameter (module docstring): 2 + 4 + 12 = 18 unsharded; zero k shards the last k of
# (optimizer states, gradients, weights) over the data-parallel group, dp·cp (ZeRO arXiv 1910.02054 §5.1-5.3;
# Megatron distributed optimizer = zero 1: 6 + 12/dp, theoretical_memory_usage.py).

def _sharded(bytes_per_param: float, zero: np.ndarray, from_zero: int, shards: np.ndarray) -> np.ndarray:
    return bytes_per_param / np.where(zero >= from_zero, shards, 1.0)


def layer_weight_bytes_per_param(profile: HardwareProfile, training: TrainingSpec,
                                 zero: "np.ndarray | int") -> np.ndarray:
    """Bytes per decoder-layer weight (dense and routed-expert) a GPU keeps, at ZeRO stage `zero`: bf16, 2. As fp8
    parameters (fp8_param_gather), in place of the bf16 weight and of TE's workspace copies alike:
    - under the distributed optimizer (zero <= 1) the layouts Transformer Engine keeps of an fp8 weight
      (`fp8_weight_copies_per_param_bytes`: the per-tensor recipes' byte in Megatron-Core's uint8 parameter buffer
      plus, on a TN-only GPU, the transpose post_all_gather_processing keeps; block scaling's rowwise and columnwise
      data with their scales);
    - under Megatron-FSDP (zero >= 2) its uint8 buffers: one layout, the transpose or columnwise data made after a
      backward gather and discarded at the module's release (megatron_fsdp.py fp8_create_transpose_cache,
      release_params_fp8_transpose_cache; keep_fp8_transpose_cache off by default: `zero3_prefetch_buffers_bytes`
      counts it on the layer being computed), except MXFP8, whose rowwise and transpose buffers both persist
      (megatron_fsdp/param_and_grad_buffer.py transpose_weight_buffer).
    The layers' few norm and router weights stay bf16 and are counted with them (under 1% of a layer); the
    embedding and output layer are bf16 either way (`embedding_weights_bytes`).
    PyTorch FSDP under ZeRO-3 (engines torchtitan and pytorch: FSDP2's fully_shard and FSDP1's FULL_SHARD with a
    bf16 MixedPrecisionPolicy) keeps no bf16 copy: the sharded parameter stays fp32 and is the optimizer's master
    weight (counted in `optimizer_states_bytes`), and the bf16 weights exist only as the all-gathered unsharded
    copy of the layer being computed (`zero3_prefetch_buffers_bytes`): 0 persistent bytes."""
    zero = np.asarray(zero)
    if training.engine in (Engine.TORCHTITAN, Engine.PYTORCH):
        return np.where(zero >= 3, 0.0, float(WEIGHT_BYTES_PER_PARAM))
    recipe = training.fp8_scaling
    if not training.fp8_param_gather or recipe is None:
        return np.full(zero.shape, float(WEIGHT_BYTES_PER_PARAM))
    layouts = 2.0 if recipe is Fp8Recipe.MXFP8 else 1.0
    megatron_fsdp = layouts * fp8_copy_bytes_per_element(recipe, weight=True)
    return np.where(zero >= 2, megatron_fsdp, fp8_weight_copies_per_param_bytes(profile, training))


def _whole_through_step(training: TrainingSpec, shape: StageShape, sharded: np.ndarray, params: np.ndarray,
                        bytes_per_param: float) -> np.ndarray:
    """`sharded`, or where FSDP keeps the stage whole over the step (torchtitan with pipeline parallelism,
    engines.fsdp_gradients_unsynced) `params` × `bytes_per_param`: its gradients accumulate unsharded in the reduce
    dtype, and its bf16 parameters stay gathered after every backward (the schedule's
    set_reshard_after_backward(False)) until the next forward reshards them, beside the other micro-batches'
    activations in flight."""
    return np.where(engines.fsdp_gradients_unsynced(training, shape.plans), params * bytes_per_param, sharded)


def weights_bytes(profile: HardwareProfile, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Decoder-layer weights (non-expert) at `layer_weight_bytes_per_param`; ZeRO-3 shards them over dp·cp, except
    where the stage stays gathered after each backward (`_whole_through_step`)."""
    zero = shape.plans.zero
    sharded = shape.layer_params_per_gpu * _sharded(layer_weight_bytes_per_param(profile, training, zero), zero, 3,
                                                    shape.dp_cp)
    return _whole_through_step(training, shape, sharded, shape.layer_params_per_gpu, WEIGHT_BYTES_PER_PARAM)


def gradients_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Main gradients of the decoder layers, fp32 or bf16 (TrainingSpec.gradient_bytes_per_param: Megatron-Core's
    grad buffer has the reduce dtype, param_and_grad_buffer.py `grad_dtype = torch.float if grad_reduce_in_fp32
    else param.dtype`); ZeRO-2/3 shard them over dp·cp, except where they accumulate unsharded over the step
    (torchtitan with pipeline parallelism: engines.fsdp_gradients_unsynced). With bf16 gradients the distributed
    optimizer copies its shard to fp32 at the step (distrib_optimizer.py _copy_model_grads_to_main_grads:
    `shard_model_grad.float()`), 4/(dp·cp) bytes that live only while the activations are freed, so not at the
    peak."""
    sharded = shape.layer_params_per_gpu * _sharded(training.gradient_bytes_per_param, shape.plans.zero, 2,
                                                    shape.dp_cp)
    return _whole_through_step(training, shape, sharded, shape.layer_params_per_gpu, training.gradient_bytes_per_param)


def frees_gradients_between_steps(training: TrainingSpec) -> bool:
    """Whether the engine's gradients exist only from a step's backward to its optimizer step: PyTorch's optimizers
    free them (torch.optim.Optimizer.zero_grad's set_to_none=True, the default since PyTorch 2.0), which torchtitan
    calls at the start of every step (train.py train_step: `self.optimizers.zero_grad()`; 0.3.0's trainer.py:
    `zero_grad(set_to_none=disable_cuda_graphs)`, off under its whole-step CUDA graph, which the engine priced here
    does not run and autopar's torchtitan configs turn off) and a plain training loop before or after each step
    (nanoGPT: `optimizer.zero_grad(set_to_none=True)`). Megatron-Core's gradient buffer,
    DeepSpeed's partitioned gradient buffers and llm.c's gradient arrays are allocated once and stay."""
    return training.engine in (Engine.TORCHTITAN, Engine.PYTORCH)


def gradients_at_peak_share(shape: StageShape, gradient_bytes: np.ndarray, activation_bytes: np.ndarray
                            ) -> np.ndarray:
    """The share of a rank's gradients present at its memory peak under an engine that frees them between steps
    (`frees_gradients_between_steps`). With one micro-batch a step, none exists when the backward starts, where the
    rank holds all its activations; each layer's gradients appear as its backward ends (FSDP2's post-backward
    reduce-scatter writes the sharded gradients of the layer's parameter group, torch/distributed/fsdp/_fully_shard/
    _fsdp_param_group.py post_backward; DDP's AccumulateGrad allocates `.grad` on first write), when that layer's
    saved activations are freed. The two together are largest at one end of the backward: all the activations at
    its start, all the gradients at its end, so the gradients raise the peak by max(0, G - A): a share
    max(0, 1 - A/G) of them. With several micro-batches the first one's gradients stay through the others' forward:
    all of them. DDP's own copy of every gradient, which stays, is `ddp_gradient_buckets_bytes`. Elsewhere 1."""
    beyond_activations = np.clip(1.0 - activation_bytes / np.maximum(gradient_bytes, 1e-9), 0.0, 1.0)
    return np.where(shape.num_microbatches <= 1, beyond_activations, 1.0)


def _every_gradient_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """The rank's gradients together (GRADIENT_TERMS), each at its own ZeRO sharding."""
    total = gradients_bytes(training, shape) + embedding_gradients_bytes(training, shape)
    if model.moe is not None:
        total = total + expert_gradients_bytes(training, shape)
    return total


def full_gradient_bytes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                        stage: "np.ndarray | int") -> np.ndarray:
    """Every gradient of rank `stage`, whatever share of it the peak holds (gradients_at_peak_share): all of them
    exist at the optimizer step."""
    return _every_gradient_bytes(model, training, stage_shape(model, cluster, training, plans, stage))


def ddp_gradient_buckets_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """DDP (a plain PyTorch loop at zero 0 and 1 with data parallelism: torch.nn.parallel.DistributedDataParallel)
    all-reduces the gradients in flat buckets its Reducer allocates once at construction, as large as every
    gradient together, in the gradients' dtype; with gradient_as_bucket_view=False,
    the default, `.grad` is a tensor of its own beside them ('gradient_as_bucket_view ... can reduce peak memory
    usage, where the saved memory size will be equal to the total gradients size', DistributedDataParallel's
    docstring). So DDP holds a second copy of the rank's gradients that no zero_grad frees. Zero elsewhere: without
    data parallelism (nothing wraps the model in DDP); FSDP (zero 2 and 3) reduce-scatters from a layer's own buffer
    (zero_gradient_buckets_bytes); torchtitan replicates with fully_shard (replicate_with_fsdp since its PR #2458,
    2026-03), not DDP; Megatron-Core's buckets are views into its gradient buffer
    (distributed/param_and_grad_buffer.py); DeepSpeed's fixed-size reduce buffer (reduce_bucket_size) is not
    priced."""
    if training.engine is not Engine.PYTORCH:
        return np.zeros(len(shape.plans))
    # at zero 0 and 1 the gradients are not sharded: each term is the whole gradient
    return np.where((shape.plans.zero < 2) & (shape.dp > 1), _every_gradient_bytes(model, training, shape), 0.0)


def optimizer_states_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Master weights + Adam m, v of the decoder layers (fp32: 12 bytes; TrainingSpec.optimizer_state_bytes under the
    precision-aware optimizer); zero >= 1 shards them over dp·cp."""
    return shape.layer_params_per_gpu * _sharded(training.optimizer_bytes_per_param, shape.plans.zero, 1,
                                                 shape.dp_cp)


def expert_weights_bytes(profile: HardwareProfile, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Routed-expert weights (already split over ep·etp) at `layer_weight_bytes_per_param`; ZeRO-3 shards them over
    edp."""
    zero = shape.plans.zero
    sharded = shape.expert_params_per_gpu * _sharded(layer_weight_bytes_per_param(profile, training, zero), zero, 3,
                                                     shape.edp)
    return _whole_through_step(training, shape, sharded, shape.expert_params_per_gpu, WEIGHT_BYTES_PER_PARAM)


def expert_gradients_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    sharded = shape.expert_params_per_gpu * _sharded(training.gradient_bytes_per_param, shape.plans.zero, 2, shape.edp)
    return _whole_through_step(training, shape, sharded, shape.expert_params_per_gpu, training.gradient_bytes_per_param)


def expert_optimizer_states_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Megatron-Core's distributed optimizer shards expert states over the expert-data-parallel group."""
    return shape.expert_params_per_gpu * _sharded(training.optimizer_bytes_per_param, shape.plans.zero, 1,
                                                  shape.edp)


def fp8_weight_copies_per_param_bytes(profile: HardwareProfile, training: TrainingSpec) -> float:
    """Bytes per weight element of the fp8 copies Transformer Engine keeps of an fp8 linear layer's weight (0 in
    bf16). Megatron-Core's TE wrappers pass `is_first_microbatch` (extensions/transformer_engine.py, unless
    TransformerConfig.disable_parameter_transpose_cache, which Megatron-LM's command line cannot set: arguments.py
    excludes it; a Megatron-Bridge config can), so TE quantizes the weight on a step's first micro-batch into a
    workspace it keeps in the module (`self._fp8_workspaces[cache_name]`, module/linear.py, layernorm_linear.py,
    layernorm_mlp.py, grouped_linear.py) and reuses it for the other micro-batches and the backward: a permanent
    copy beside the bf16 weight. The weight quantizer is set for both usages (linear.py:
    `weight_quantizer.set_usage(rowwise=True, columnwise=...)`, the data gradient dX = dY·W reads the other layout):
    block scaling quantizes each layout on its own (two copies, each with its scales: MXFP8's byte per 32 elements,
    blockwise's fp32 per 128×128 weight block, specs.fp8_copy_bytes_per_element(weight=True)); per-tensor scaling
    keeps a transpose on a TN-only GPU (`compute.fp8_tn_only`: two copies) and one buffer for both usages elsewhere
    (tensor/float8_tensor.py: 'on non-TN-capable archs (Blackwell+) a single _data buffer backs both row- and
    column-wise usage'). Delayed or current scaling: 2 bytes per weight on H100, 1 on B200; MXFP8 ~2.06; blockwise
    ~2."""
    recipe = training.fp8_scaling
    if recipe is None:
        return 0.0
    copies = 2.0 if recipe.block_scaled or fp8_tn_only(profile) else 1.0
    return copies * fp8_copy_bytes_per_element(recipe, weight=True)


def fp8_weight_copies_bytes(profile: HardwareProfile, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Transformer Engine's fp8 weight workspaces (`fp8_weight_copies_per_param_bytes`) of the rank's decoder layers,
    dense and routed-expert weights alike (the norms' and router's few parameters, which stay bf16, are counted
    with them: under 1% of a layer). The embedding and output layer run in bf16 and have none. Whole, not sharded,
    under every ZeRO stage: Megatron-FSDP unshards a layer by pointing its parameters at the gathered buffer, and
    TE caches the quantized whole weight as under DDP (it skips the cache only for torch's FSDP2, `is_fsdp2`, and
    for weights that are fp8 parameters already: with fp8_param_gather the term is absent, the weights terms hold
    those layouts instead). Frameworks that call TE without `is_first_microbatch`, or run
    torchao's fp8 (torchtitan), keep no copy: their exports say so."""
    per_param = fp8_weight_copies_per_param_bytes(profile, training)
    return (shape.layer_params_per_gpu + shape.expert_params_per_gpu) * per_param


def embedding_weights_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Embedding (first rank), output layer and final norm (last rank), bf16."""
    sharded = shape.embedding_params_per_gpu * _sharded(WEIGHT_BYTES_PER_PARAM, shape.plans.zero, 3, shape.dp_cp)
    return _whole_through_step(training, shape, sharded, shape.embedding_params_per_gpu, WEIGHT_BYTES_PER_PARAM)


def embedding_gradients_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    sharded = shape.embedding_params_per_gpu * _sharded(training.gradient_bytes_per_param, shape.plans.zero, 2,
                                                        shape.dp_cp)
    return _whole_through_step(training, shape, sharded, shape.embedding_params_per_gpu,
                               training.gradient_bytes_per_param)


def embedding_optimizer_states_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    return shape.embedding_params_per_gpu * _sharded(training.optimizer_bytes_per_param, shape.plans.zero, 1,
                                                     shape.dp_cp)


# ---- activations of one decoder layer, one micro-batch, one GPU ---------------------------------------------------
# Korthikanti §4.1 counts, for a GPT layer with MHA, a 4h MLP, LayerNorm and dropout (bytes, no parallelism):
#   attention: QKV input 2sbh, Q and K for QK^T 4sbh, softmax output 2as²b, its dropout mask as²b,
#              dropout output 2as²b and V 2sbh for the product with V, output-projection input 2sbh,
#              dropout mask sbh                                                    -> 11sbh + 5as²b
#   MLP:       first-linear input 2sbh, GeLU input 8sbh, second-linear input 8sbh, dropout mask sbh  -> 19sbh
#   norms:     two LayerNorm inputs                                                -> 4sbh
# total sbh(34 + 5as/h). With TP (no SP) the 10sbh outside the TP region (norm inputs 4, QKV input 2, MLP input 2,
# masks 2) stay replicated and the 24sbh + 5as²b inside are split by t; SP splits the 10sbh too (§4.2.2).
# The functions below rebuild each of those numbers from the real shape:
#   - Q is a·d wide, K and V g·d (GQA/MQA, arXiv 2305.13245); Megatron's unfused attention
#     (megatron/core/transformer/dot_product_attention.py) repeats K and V to all a heads before the batched matmuls,
#     so without flash attention the stored K, V are a·d wide; flash attention stores Q, K, V as they are plus the
#     fp32 log-sum-exp (a·s·b·4 bytes) and never the a·s² scores (Dao et al. arXiv 2205.14135 §3.1).
#   - MLA (DeepSeek-V2 arXiv 2405.04434 §2.1): the latent vectors are stored too (inputs of the latent norms and
#     of the up projections) and K is materialised per head with a·(d_nope + d_rope).
#   - MLP of width F: plain GeLU stores its input and the second linear's input, 2·2·F per token (F = 4h gives the
#     16sbh); gated SwiGLU stores the fused [gate, up] input (2·2F, Megatron fused_bias_swiglu.py saves its input)
#     and the down-projection input (2F): 6F per token.
#   - dropout: masks (and the dropout copy of unfused scores) only when the model trains with dropout
#     (ModelSpec.dropout > 0: GPT-2/3 and Megatron GPT at 0.1; Llama, Mistral, Qwen, DeepSeek, BLOOM and MPT at 0).
#   - norms: each stores its input (2h per token) and its fp32 statistics: LayerNorm mean and rstd (8 bytes per
#     token), RMSNorm rstd only (4 bytes per token).
#   - fp8 (Transformer Engine): a linear layer keeps the quantized copy of its input its weight gradient reads, not
#     the bf16 one (`saved_linear_input_bytes`): QKV, fc1 and fc2 inputs shrink to about a byte an element; the
#     output projection keeps flash attention's bf16 output (delayed scaling: an fp8 copy beside it).

def saved_linear_input_bytes(training: TrainingSpec) -> float:
    """Bytes per element of a linear layer's input that Transformer Engine keeps for its weight gradient: the bf16
    input; in fp8 the quantized copy the backward reads instead, one layout with its scales (TE module/linear.py and
    grouped_linear.py: the rowwise data is discarded, 'not needed in backward pass', and `saved_inputmat = inputmat`;
    specs.fp8_copy_bytes_per_element)."""
    recipe = training.fp8_scaling
    return BF16_BYTES if recipe is None else fp8_copy_bytes_per_element(recipe)


def _qkv_input_bytes_per_element(model: ModelSpec, training: TrainingSpec) -> float:
    """The attention's input as stored: what its QKV linear keeps. MLA's q and kv down projections each keep an fp8
    copy of the one norm output, which in fp8 is about the one bf16 tensor they share in bf16: priced as that."""
    return BF16_BYTES if model.mla is not None else saved_linear_input_bytes(training)


def _mlp_input_bytes_per_element(model: ModelSpec, training: TrainingSpec, moe_layer: bool) -> float:
    """The MLP's input as stored: a dense MLP's fc1 keeps its (fp8) copy; a MoE layer's router, a plain bf16 linear
    (moe/router.py), keeps the bf16 input, and a shared expert adds an fp8 copy only under delayed scaling
    (moe/shared_experts.py sets save_original_input for the other recipes; TE refuses it with DelayedScaling)."""
    if not moe_layer:
        return saved_linear_input_bytes(training)
    assert model.moe is not None
    extra = 0.0
    if model.moe.num_shared_experts and training.fp8_scaling is Fp8Recipe.DELAYED:
        extra = saved_linear_input_bytes(training)
    return BF16_BYTES + extra


def _uses_dropout(model: ModelSpec) -> bool:
    return bool(model.dropout)


def _norm_bytes_per_token(model: ModelSpec) -> float:
    """One norm: its bf16 input and fp32 statistics."""
    stats = 2 * FP32_BYTES if model.norm is NormKind.LAYERNORM else FP32_BYTES
    return BF16_BYTES * model.hidden_size + stats


def _activation_input_bytes_per_column(model: ModelSpec) -> float:
    """The MLP activation's bf16 input per column of the MLP's width: gate and up (2 × 2) when gated, else 2."""
    return 2 * BF16_BYTES if model.mlp is MlpKind.GATED else BF16_BYTES


def _mlp_bytes_per_token(model: ModelSpec, training: TrainingSpec, width: float) -> float:
    """Inside the TP region, per token of an MLP `width` wide (before splitting by t): the activation's bf16 input
    (`_activation_input_bytes_per_column`) and the second linear's input (`saved_linear_input_bytes`, width)."""
    return (_activation_input_bytes_per_column(model) + saved_linear_input_bytes(training)) * width


def _norms_activation_bytes(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """The two norms of a layer (pre-attention and pre-MLP): 4sbh in Korthikanti, outside the TP region."""
    return 2 * _norm_bytes_per_token(model) * shape.tokens_outside_tp


def _attention_core_parts(model: ModelSpec, training: TrainingSpec, shape: StageShape,
                          keep_scores: "np.ndarray | bool") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Q/K/V and scores, output-projection input, outside-TP inputs) bytes per micro-batch of one layer's
    self-attention (`_attention_activation_bytes`, their sum)."""
    h, a = model.hidden_size, model.num_attention_heads
    dropout = _uses_dropout(model)
    flash = training.flash_attention
    # the QKV input; the output's dropout mask
    outside = _qkv_input_bytes_per_element(model, training) * h + (MASK_BYTES * h if dropout else 0)
    if model.mla is not None:
        mla = model.mla
        q_width = a * mla.qk_head_dim
        k_width = a * mla.qk_head_dim                                         # k_pe broadcast to every head
        v_width = a * mla.v_head_dim
        # latent inputs of the norms and of the up projections (replicated over TP in Megatron-Core)
        latent = 2 * mla.kv_lora_rank + mla.qk_rope_head_dim + (2 * mla.q_lora_rank if mla.q_lora_rank else 0)
        outside += BF16_BYTES * latent
        out_width = a * mla.v_head_dim
    else:
        q_width = model.q_size
        # unfused attention repeats K, V to all heads; when t exceeds the KV heads each TP rank keeps a whole
        # (replicated) KV head (Megatron-Core GQA with tp > num_query_groups): g·d·max(1, t/g) before splitting by t
        kv_replication = np.maximum(1.0, shape.plans.tp / model.num_kv_heads)
        k_width = model.kv_size * kv_replication if flash else model.q_size
        v_width = k_width
        out_width = model.q_size
    # Q, K, V, and the output-projection input: flash attention keeps its bf16 output for the backward and the
    # projection the same tensor; under fp8 delayed scaling the projection keeps an fp8 copy of it beside, under the
    # other recipes Megatron-Core has it keep the original (attention.py: set_save_original_input(linear_proj) when
    # fp8_recipe != 'delayed', "to avoid the extra memory usage of the quantized tensor")
    delayed = training.fp8_scaling is Fp8Recipe.DELAYED
    out_bytes = (saved_linear_input_bytes(training) + (BF16_BYTES if flash else 0)) if delayed else BF16_BYTES
    if flash:
        # flash attention keeps only the fp32 log-sum-exp per head and query
        score_bytes_per_query = FP32_BYTES
    else:
        # softmax output 2as²b (+ dropout mask as²b and dropout output 2as²b), split by t over heads; with CP each
        # rank holds its s/cp queries against all s keys: a·s·T
        score_bytes_per_query = (BF16_BYTES + (MASK_BYTES + BF16_BYTES if dropout else 0)) * training.seq_len
    scores = np.where(keep_scores, a * score_bytes_per_query * shape.tokens_inside_tp, 0.0)
    core = BF16_BYTES * (q_width + k_width + v_width) * shape.tokens_inside_tp + scores
    return core, out_bytes * out_width * shape.tokens_inside_tp, outside * shape.tokens_outside_tp


def _attention_activation_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape,
                                keep_scores: "np.ndarray | bool") -> np.ndarray:
    """Self-attention of one layer (11sbh + 5as²b for GPT); `keep_scores` False when the core is recomputed."""
    core, projection_input, outside = _attention_core_parts(model, training, shape, keep_scores)
    return outside + core + projection_input


def _mlp_input_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape, moe_layer: bool) -> np.ndarray:
    """MLP (or router / dispatch) input 2sbh (`_mlp_input_bytes_per_element`) and the MLP's output dropout mask sbh,
    outside the TP region."""
    per_token = _mlp_input_bytes_per_element(model, training, moe_layer) * model.hidden_size \
        + (MASK_BYTES * model.hidden_size if _uses_dropout(model) else 0)
    return per_token * shape.tokens_outside_tp


def _dense_layer_activation_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape,
                                  keep_scores: "np.ndarray | bool") -> np.ndarray:
    """One dense decoder layer: sbh(34 + 5as/h) for GPT without parallelism."""
    mlp = _mlp_input_bytes(model, training, shape, moe_layer=False) \
        + _mlp_bytes_per_token(model, training, model.ffn_hidden_size) * shape.tokens_inside_tp
    attention = _attention_activation_bytes(model, training, shape, keep_scores)
    return _norms_activation_bytes(model, shape) + attention + mlp


def _moe_layer_non_expert_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape,
                                keep_scores: "np.ndarray | bool") -> np.ndarray:
    """One MoE layer without its routing and routed experts: norms, attention, MLP input, shared experts."""
    assert model.moe is not None
    shared = _mlp_bytes_per_token(model, training, model.moe.shared_expert_ffn_hidden_size) * shape.tokens_inside_tp
    return (_norms_activation_bytes(model, shape) + _attention_activation_bytes(model, training, shape, keep_scores)
            + _mlp_input_bytes(model, training, shape, moe_layer=True) + shared)


# ---- MoE: router, dispatch, routed experts (per MoE layer, per micro-batch, per GPU) ------------------------------

def _router_bytes_per_layer(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """Router logits (bf16, E per token) and their fp32 softmax/sigmoid scores, kept for the backward, plus the
    top-k probabilities (fp32) and indices (int64) (GShard arXiv 2006.16668 §2.2; Megatron-Core moe/router.py).
    The router is replicated over TP and sees the rank's tokens (split over TP with SP)."""
    assert model.moe is not None
    e, k = model.moe.num_experts, model.moe.top_k
    return ((BF16_BYTES + FP32_BYTES) * e + (FP32_BYTES + TOKEN_ID_BYTES) * k) * shape.tokens_outside_tp


def _dispatch_bytes_per_layer(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """What the dispatcher leaves stored for the backward: the routing weights that travel with the token copies, one
    fp32 per copy the GPU receives, saved by the experts' weighted activation for the weights' gradient.

    No copy of the hidden states: the permutation is an index_select (it saves the indices), the all-to-all saves
    nothing, and since Megatron-Core 0.12 ("Memory efficient token permutation", Megatron-LM !2668, 2025-04-09;
    `moe/experts.py` passes `permuted_probs` to the activation) the weights are applied inside the experts, so the
    combine's unpermute is a plain scatter-add. Before it, the combine multiplied the expert outputs by the weights
    and kept them: top_k·h more bf16 per token (moe_utils.unpermute of core_v0.11.0)."""
    assert model.moe is not None
    return FP32_BYTES * _expert_copies_received(model, training, shape)


def _dispatch_buffers_bytes_per_layer(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """The dispatch all-to-all's send and receive buffers, top_k copies of each token's hidden state each: alive
    while a layer's forward runs (a working set, not stored; Megatron-Core moe/token_dispatcher.py)."""
    assert model.moe is not None
    return 2 * BF16_BYTES * model.moe.top_k * model.hidden_size * shape.tokens_outside_tp


def _expert_load_factor(training: TrainingSpec) -> float:
    """Rows of the busiest expert rank's buffers relative to the tokens a perfectly balanced rank receives: the
    busiest expert's load the compute is priced at (compute.moe_load_factor: the imbalance factor dropless, capped at
    a capacity factor c, exactly c padded to capacity), or, with a rank token budget
    (TrainingSpec.moe_rank_capacity_factor, HybridEP / NCCL-EP), the budget every rank's buffers are sized at,
    whatever the routing (token_dispatcher.py _HybridEPManager.setup_metadata: the permuted tokens' static
    `num_permuted_tokens`)."""
    if training.moe_rank_capacity_factor is not None:
        return float(training.moe_rank_capacity_factor)
    return float(moe_load_factor(training))


def _expert_mlp_bytes_per_copy(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """What the routed experts store per token copy they receive: the expert input (2h, whole in the etp group;
    what TE's GroupedLinear keeps, fp8 in fp8) and the MLP intermediates of its F_e/etp columns."""
    assert model.moe is not None
    return (saved_linear_input_bytes(training) * model.hidden_size
            + _mlp_bytes_per_token(model, training, model.moe.expert_ffn_hidden_size) / shape.plans.etp)


def _expert_mlp_bytes_per_layer(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Routed-expert MLP activations on the tokens this GPU's experts receive.

    Per pipeline stage a micro-batch step routes dp·s·b·k token copies; the stage's N/pp GPUs form edp·ep
    expert-tensor-parallel groups of etp GPUs that each process the same tokens, so one GPU receives
    s·b·k·etp/(tp·cp) = T·k·etp/t tokens on average (× the load factor), each stored as
    `_expert_mlp_bytes_per_copy`.
    """
    return _expert_copies_received(model, training, shape) * _expert_mlp_bytes_per_copy(model, training, shape)


def _balanced_copies(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """Token copies a perfectly balanced GPU's experts receive per micro-batch: T·k·etp/t."""
    assert model.moe is not None
    return shape.tokens_inside_tp * model.moe.top_k * shape.plans.etp


def _expert_copies_received(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Token copies (buffer rows) one GPU's experts hold per micro-batch: T·k·etp/t × the load factor
    (_expert_load_factor)."""
    return _balanced_copies(model, shape) * _expert_load_factor(training)


# ---- activations on the stage ------------------------------------------------------------------------------------

def _stored_layer_counts(model: ModelSpec, shape: StageShape) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) layers on the rank whose activations are stored (recomputed ones split pro rata)."""
    moe = shape.moe_layers * shape.stored_fraction
    dense = (shape.layers - shape.moe_layers) * shape.stored_fraction
    return dense, moe


def layer_activations_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Stored activations of the non-recomputed decoder layers (Korthikanti Table 2), × micro-batches in flight.
    Selective recompute (§4.2.1) drops the attention scores (module core_attn); the other modules of
    Megatron-Core's --recompute-modules drop what `selective_dropped_bytes_per_layer` lists; fine-grained activation
    offloading moves what `offloaded_bytes_per_layer` lists to the host, but `_offload_resident_share` of it."""
    keep_scores = ~recomputes_module(shape.plans, RecomputeModule.CORE_ATTN)
    dense, moe = _stored_layer_counts(model, shape)
    dropped_dense, dropped_moe = selective_dropped_bytes_per_layer(model, training, shape)
    per_microbatch = dense * (_dense_layer_activation_bytes(model, training, shape, keep_scores) - dropped_dense)
    if model.moe is not None:
        per_microbatch = per_microbatch + moe * (_moe_layer_non_expert_bytes(model, training, shape, keep_scores)
                                                 - dropped_moe)
    if training.offload_modules:
        offloaded_dense, offloaded_moe, _ = offloaded_bytes_per_layer(model, training, shape)
        offloaded = dense * offloaded_dense + moe * offloaded_moe
        per_microbatch = per_microbatch - offloaded * (1.0 - _offload_resident_share(shape))
    return per_microbatch * shape.in_flight


def selective_dropped_bytes_per_layer(model: ModelSpec, training: TrainingSpec,
                                      shape: StageShape) -> tuple[np.ndarray, np.ndarray]:
    """(dense layer, MoE layer outside its routed experts) activation bytes per micro-batch that the selected
    recompute modules do not keep (Megatron-Core transformer_layer.py / mlp.py / moe_layer.py / multi_latent_attention
    .py: CheckpointWithoutOutput around the module; its input stays stored, its outputs and interior go):
    - layernorm: the outputs of the norms Megatron-Core runs as modules of their own (ModelSpec.num_separate_norms: the
      input norm under MLA, the pre-MLP norm of a MoE layer; the others are fused into the linear layer after them
      and recompute nothing), 2h per token each outside the TP region, what the layers after them keep
      (`_qkv_input_bytes_per_element`, `_mlp_input_bytes_per_element`; under fp8 those keep the original input then,
      set_save_original_input);
    - mlp: a dense MLP's interior (_mlp_bytes_per_token of its width, inside TP);
    - shared_experts: the shared-expert MLP's interior (module moe drops it too: its checkpoint runs them);
    - mla_up_proj: Q, K and V as the up projections produce them (a·(d_qk + d_qk + d_v), inside TP).
    The routed-expert modules (moe_act, moe) act on the expert terms (expert_mlp_activations_bytes and the router
    and dispatch terms)."""
    plans = shape.plans
    zeros = np.zeros(len(plans))
    norms = recomputes_module(plans, RecomputeModule.LAYERNORM)

    def norm_outputs(moe_layer: bool) -> np.ndarray:
        per_element = (_qkv_input_bytes_per_element(model, training) if model.mla is not None else 0.0) \
            + (_mlp_input_bytes_per_element(model, training, moe_layer=True) if moe_layer else 0.0)
        return np.where(norms, per_element * model.hidden_size * shape.tokens_outside_tp, 0.0)
    mla = zeros
    if model.mla is not None:
        a = model.num_attention_heads
        width = a * (2 * model.mla.qk_head_dim + model.mla.v_head_dim)
        mla = np.where(recomputes_module(plans, RecomputeModule.MLA_UP_PROJ),
                       BF16_BYTES * width * shape.tokens_inside_tp, 0.0)
    dense_mlp = np.where(recomputes_module(plans, RecomputeModule.MLP),
                         _mlp_bytes_per_token(model, training, model.ffn_hidden_size) * shape.tokens_inside_tp, 0.0)
    shared = zeros
    if model.moe is not None and model.moe.num_shared_experts:
        # its interior, and under delayed scaling the fp8 copy of its input its fc1 keeps (the checkpoint keeps the
        # original: _mlp_input_bytes_per_element's extra)
        fc1_copy = _mlp_input_bytes_per_element(model, training, moe_layer=True) - BF16_BYTES
        # module moe's checkpoint holds the shared experts too (moe_layer.py custom_forward runs
        # shared_experts_compute inside it): their interior goes under either module
        shared = np.where(recomputes_module(plans, RecomputeModule.SHARED_EXPERTS)
                          | recomputes_module(plans, RecomputeModule.MOE),
                          _mlp_bytes_per_token(model, training, model.moe.shared_expert_ffn_hidden_size)
                          * shape.tokens_inside_tp + fc1_copy * model.hidden_size * shape.tokens_outside_tp, 0.0)
    moe_norms = norm_outputs(moe_layer=True) if model.moe is not None else zeros
    return norm_outputs(moe_layer=False) + mla + dense_mlp, moe_norms + mla + shared


OFFLOAD_RESIDENT_LAYERS = 2.0
"""Layers' worth of one micro-batch's offloaded tensors still on the GPU at the rank's peak under fine-grained
activation offloading (pipeline_parallel/fine_grained_activation_offload.py): the last group of each module name stays
(post_warmup_callback: 'Mark the last group with the same name as not offloadable to make sure the reloading won't
block the main stream'), and one more is on the GPU while it is copied out (bulk_offload releases a group once its
D2H copy has been issued, the next layer running beside it) or brought back one layer ahead of its backward
(bulk_reload: 'Pre-load the last layer of the next backward chunk')."""


def offloaded_bytes_per_layer(model: ModelSpec, training: TrainingSpec,
                              shape: StageShape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense layer, MoE layer outside its routed experts, routed-expert token copy) bytes per micro-batch that
    Megatron-Core's fine-grained activation offloading (TrainingSpec.offload_modules) moves to the host: what each
    module saves for its backward, as this model stores it (transformer_layer.py, attention.py, moe/experts.py
    open an offloading context around the module, whose saved tensors are copied out; those under
    min_offloaded_tensor_size, 1M elements, stay, which this leaves out: a micro-batch's tensors are larger):
    - attn_norm: the input norm's input and statistics, where the norm is a module of its own (MLA; elsewhere
      Transformer Engine fuses it into linear_qkv and input_layernorm is IdentityOp, which offloads nothing);
    - qkv_linear: the QKV linear's saved input; where the norm is fused into it (TELayerNormColumnParallelLinear)
      also the norm's input and statistics it saves; under MLA the norm's output, unless module layernorm already
      drops it;
    - core_attn: Q, K, V and the kernel's log-sum-exp (the unfused scores where kept); its output stays with the
      output projection unless attn_proj goes too (Megatron-Core requires core_attn with attn_proj: the two share
      it);
    - attn_proj: the output projection's input;
    - mlp_norm: a MoE layer's pre-MLP norm input and statistics (a dense MLP fuses it into fc1: IdentityOp);
    - under per-layer CUDA graphs neither norm is offloaded (transformer_layer.py _set_offload_modules turns them off
      with a warning: they cross the graphs' boundaries);
    - expert_fc1, moe_act: per routed token copy the experts' input (what fc1 keeps) and the activation's input;
    - fused_group_mlp: everything the routed MLP keeps per copy.
    All × TrainingSpec.offload_fraction (the share of the groups offloaded). Zero for every layer when no module is
    offloaded."""
    offload = set(training.offload_modules)
    zeros = np.zeros(len(shape.plans))
    if not offload:
        return zeros, zeros, zeros
    h = model.hidden_size
    keep_scores = ~recomputes_module(shape.plans, RecomputeModule.CORE_ATTN)
    core, projection_input, _ = _attention_core_parts(model, training, shape, keep_scores)
    norm = _norm_bytes_per_token(model) * shape.tokens_outside_tp
    if training.launch is LaunchPath.CUDA_GRAPH:
        offload -= {"attn_norm", "mlp_norm"}
    attention = zeros
    if "attn_norm" in offload and model.mla is not None:
        attention = attention + norm
    if "qkv_linear" in offload:
        if model.mla is None:
            attention = attention + norm + _qkv_input_bytes_per_element(model, training) * h * shape.tokens_outside_tp
        else:
            kept = ~recomputes_module(shape.plans, RecomputeModule.LAYERNORM)
            attention = attention + np.where(kept, BF16_BYTES * h * shape.tokens_outside_tp, 0.0)
    if "core_attn" in offload:
        attention = attention + core
    if "attn_proj" in offload:
        attention = attention + projection_input
    moe_layer = attention + (norm if "mlp_norm" in offload and model.moe is not None else zeros)
    per_copy = zeros
    if model.moe is not None:
        if "fused_group_mlp" in offload:
            per_copy = _expert_mlp_bytes_per_copy(model, training, shape)
        if "expert_fc1" in offload:
            per_copy = per_copy + saved_linear_input_bytes(training) * h
        if "moe_act" in offload:
            per_copy = per_copy + _activation_input_bytes_per_column(model) * model.moe.expert_ffn_hidden_size \
                / shape.plans.etp
    share = training.offload_fraction
    return attention * share, moe_layer * share, per_copy * share


def offloaded_bytes_by_layer_kind(model: ModelSpec, training: TrainingSpec, shape: StageShape
                                  ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((stored dense layers, bytes each offloads), (stored MoE layers, bytes each offloads, its routed experts'
    included)) per micro-batch on the rank: the traffic of fine-grained activation offloading
    (costmodels.steptime.offload_copies_s)."""
    dense, moe = _stored_layer_counts(model, shape)
    dense_bytes, moe_bytes, per_copy = offloaded_bytes_per_layer(model, training, shape)
    if model.moe is not None:
        moe_bytes = moe_bytes + _stored_expert_rows(model, training, shape) * per_copy * _moe_kept(shape)
    return (dense, dense_bytes), (moe, moe_bytes)


def _offload_resident_share(shape: StageShape) -> np.ndarray:
    """The share of the offloaded tensors the GPU still holds: OFFLOAD_RESIDENT_LAYERS of the layer-micro-batches the
    rank keeps (all of them when it keeps fewer)."""
    held = shape.stored_layers * shape.in_flight
    return np.minimum(1.0, OFFLOAD_RESIDENT_LAYERS / np.maximum(held, 1e-12))


def recomputed_layer_inputs_bytes(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """Full recompute keeps only each recomputed layer's input, 2sbh (/t with SP, /cp with CP) (Korthikanti §4.1,
    'full activation recomputation'; Megatron tensor_parallel/random.py CheckpointFunction)."""
    per_layer = BF16_BYTES * model.hidden_size * shape.tokens_outside_tp
    return shape.recomputed_layers * per_layer * shape.in_flight


SAC_LOGSUMEXP_BYTES = 4
"""The attention kernel's per-row log-sum-exp, fp32 per query and head, which its backward reads."""


def _sac_kept_matmul_bytes_per_token(model: ModelSpec, shape: StageShape, moe_layer: bool) -> np.ndarray:
    """Bytes per token (of the TP shard, tokens_inside_tp) of the matmul outputs per-op SAC keeps in one block
    (engines.sac_kept_matmuls): a column-parallel output is d_out/tp a token, a replicated one d_out, a
    row-parallel one the whole hidden state of every token before its reduce-scatter (tp × a shard token's)."""
    tp = shape.plans.tp.astype(float)
    per_token = np.zeros(len(shape.plans))
    for matmul in engines.sac_kept_matmuls(model, moe_layer):
        width = {"column": matmul.d_out / tp, "row": matmul.d_out * tp, "none": matmul.d_out * tp}[matmul.split]
        per_token = per_token + BF16_BYTES * width
    return per_token


def sac_saved_activations_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """What torchtitan's per-op selective activation checkpointing keeps of each checkpointed block besides its input
    (recomputed_layer_inputs_bytes), × micro-batches in flight (engines.per_op_sac for the policy and its source):
    - every other matmul output (`_sac_kept_matmul_bytes_per_token`);
    - the attention kernel's output (heads × value head dim per token, inside TP) and its log-sum-exp
      (SAC_LOGSUMEXP_BYTES per head and query);
    - with sequence parallelism, the two reduce-scatter outputs (the block's hidden state after attention and
      after the MLP, 2h per token outside TP);
    - a MoE layer's all-to-all outputs where the policy keeps them (TrainingSpec.sac_saves_all_to_all, ep > 1):
      the dispatched token copies this GPU's experts receive (_expert_copies_received) and the combined copies
      returned to its tokens (top_k per token), h each;
    the router's top-k indices (12 bytes per copy) are left out. The routed experts, norms and activations keep
    nothing: they are recomputed. Zero where recompute is not per-op SAC."""
    plans = shape.plans
    heads = model.num_attention_heads / plans.tp.astype(float)
    value_width = (model.num_attention_heads * model.mla.v_head_dim if model.mla is not None else model.q_size) \
        / plans.tp.astype(float)
    attention_out = (BF16_BYTES * value_width + SAC_LOGSUMEXP_BYTES * heads) * shape.tokens_inside_tp
    scatters = np.where(plans.sp & (plans.tp > 1), 2.0 * BF16_BYTES * model.hidden_size * shape.tokens_outside_tp,
                        0.0)
    moe_layers = shape.moe_layers
    dense_layers = shape.layers - moe_layers
    dense = _sac_kept_matmul_bytes_per_token(model, shape, False) * shape.tokens_inside_tp
    per_microbatch = dense_layers * (dense + attention_out + scatters)
    if model.moe is not None:
        moe = _sac_kept_matmul_bytes_per_token(model, shape, True) * shape.tokens_inside_tp
        if training.sac_saves_all_to_all:
            copies = _expert_copies_received(model, training, shape) \
                + model.moe.top_k * shape.tokens_outside_tp
            moe = moe + np.where(plans.ep > 1, BF16_BYTES * model.hidden_size * copies, 0.0)
        per_microbatch = per_microbatch + moe_layers * (moe + attention_out + scatters)
    checkpointed = shape.recomputed_layers / np.maximum(shape.layers, 1e-12)
    return np.where(engines.per_op_sac(training, plans), per_microbatch * checkpointed * shape.in_flight, 0.0)


def _moe_kept(shape: StageShape) -> np.ndarray:
    """1 where the routed MLP's activations are kept, 0 where module `moe` recomputes the whole routed MLP."""
    return np.where(recomputes_module(shape.plans, RecomputeModule.MOE), 0.0, 1.0)


def moe_router_activations_bytes(model: ModelSpec, shape: StageShape) -> np.ndarray:
    if model.moe is None:
        return np.zeros(len(shape.plans))
    return (_stored_layer_counts(model, shape)[1] * _router_bytes_per_layer(model, shape) * shape.in_flight
            * _moe_kept(shape))


def moe_dispatch_activations_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    if model.moe is None:
        return np.zeros(len(shape.plans))
    return (_stored_layer_counts(model, shape)[1] * _dispatch_bytes_per_layer(model, training, shape) * shape.in_flight
            * _moe_kept(shape))


def _stored_expert_rows(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Rows of routed-expert activations stored per MoE layer and micro-batch: the buffers' rows
    (_expert_copies_received); under the paged stash (TrainingSpec.moe_paged_stash_factor) the stash's share, its
    factor times the expected rows, the budget over the rank capacity factor (experts.py _fused_forward:
    `avg_num_tokens = max_num_tokens // cap_factor`; paged_stash.py allocate_stash_buffers:
    `num_tokens = max_avg_tokens_across_vp_stages * moe_paged_stash_buffer_size_factor_cuda`)."""
    if training.moe_paged_stash_factor is not None:
        return _balanced_copies(model, shape) * training.moe_paged_stash_factor
    return _expert_copies_received(model, training, shape)


def _expert_act_output_bytes_per_copy(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """The activation's output each copy keeps (the down projection's input, F_e/etp columns), what module moe_act
    drops: 2 bytes per column, what fc2 would keep in fp8 (it keeps the original then, experts.py
    set_save_original_input)."""
    assert model.moe is not None
    return saved_linear_input_bytes(training) * model.moe.expert_ffn_hidden_size / shape.plans.etp


def expert_mlp_activations_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Routed-expert activations (`_stored_expert_rows` × `_expert_mlp_bytes_per_copy`); module moe_act drops the
    activation's output (`_expert_act_output_bytes_per_copy`), module moe all of them; fine-grained offloading
    moves what expert_fc1 / moe_act / fused_group_mlp save to the host but `_offload_resident_share`."""
    if model.moe is None:
        return np.zeros(len(shape.plans))
    moe = _stored_layer_counts(model, shape)[1]
    per_copy = _expert_mlp_bytes_per_copy(model, training, shape) - np.where(
        recomputes_module(shape.plans, RecomputeModule.MOE_ACT),
        _expert_act_output_bytes_per_copy(model, training, shape), 0.0)
    if training.offload_modules:
        offloaded_per_copy = offloaded_bytes_per_layer(model, training, shape)[2]
        per_copy = per_copy - offloaded_per_copy * (1.0 - _offload_resident_share(shape))
    per_layer = _stored_expert_rows(model, training, shape) * per_copy
    return moe * per_layer * shape.in_flight * _moe_kept(shape)


def moe_stash_working_set_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Under the paged stash, one MoE layer's routed-expert activations at full budget length beside the stash: the
    layer's forward saves them at the budget's rows before paged_stash_group_commit copies them in, and its backward
    reloads them to that length (paged_stash.py on_get_saved_tensor pads to max_num_tokens); one layer at a time.
    Zero without the stash, or where the rank has no MoE layer or recomputes the routed MLP."""
    if model.moe is None or training.moe_paged_stash_factor is None:
        return np.zeros(len(shape.plans))
    per_copy = _expert_mlp_bytes_per_copy(model, training, shape) - np.where(
        recomputes_module(shape.plans, RecomputeModule.MOE_ACT),
        _expert_act_output_bytes_per_copy(model, training, shape), 0.0)
    one_layer = _expert_copies_received(model, training, shape) * per_copy
    return np.where(shape.moe_layers * shape.stored_fraction > 0, one_layer * _moe_kept(shape), 0.0)


def _full_layer_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Every activation of the heaviest kind of layer on the rank (dense or MoE), one micro-batch, scores included,
    and a MoE layer's dispatch buffers, alive while its forward re-runs."""
    has_dense = shape.layers - shape.moe_layers > 0
    heaviest = np.where(has_dense, _dense_layer_activation_bytes(model, training, shape, True), 0.0)
    if model.moe is not None:
        moe = (_moe_layer_non_expert_bytes(model, training, shape, True) + _router_bytes_per_layer(model, shape)
               + _dispatch_bytes_per_layer(model, training, shape) + _dispatch_buffers_bytes_per_layer(model, shape)
               + _expert_mlp_bytes_per_layer(model, training, shape))
        heaviest = np.maximum(heaviest, np.where(shape.moe_layers > 0, moe, 0.0))
    return heaviest


def recompute_working_set_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """With full recompute, the backward pass re-runs one layer's forward and holds all of its activations (one
    micro-batch) while back-propagating through it (Chen et al. arXiv 1604.06174 §4; Korthikanti §4.1 leaves this
    transient out of its per-layer figures)."""
    has_recomputed = shape.recomputed_layers > 0
    return np.where(has_recomputed, _full_layer_bytes(model, training, shape), 0.0)


def embedding_activations_bytes(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """First rank: int64 token ids (8sb) and the embedding dropout mask (sbh, /t with SP) per micro-batch in
    flight (Megatron theoretical_memory_usage.py: 'Input to embedding', 'Dropout in embedding layer').
    The embedding output itself is the first layer's input, counted there."""
    ids = TOKEN_ID_BYTES * shape.tokens
    mask = MASK_BYTES * model.hidden_size * shape.tokens_outside_tp if _uses_dropout(model) else 0.0
    return np.where(shape.is_first, (ids + mask) * shape.in_flight, 0.0)


# The last rank runs each micro-batch's loss and starts its backward at once (1F1B), so the loss-side tensors below
# are held for one micro-batch.

def output_layer_activations_bytes(model: ModelSpec, shape: StageShape) -> np.ndarray:
    """Last rank: final norm input and output-layer input, 2sbh each (/t with SP: Megatron's column-parallel output
    layer saves the un-gathered input) (Megatron theoretical_memory_usage.py: 'Inputs to output layer')."""
    per_token = _norm_bytes_per_token(model) + BF16_BYTES * model.hidden_size
    return np.where(shape.is_last, per_token * shape.tokens_outside_tp, 0.0)


def _logits_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    vocab_per_gpu = params.padded_vocab_size(model, shape.plans.tp) / shape.plans.tp
    per_element = FP32_BYTES if training.cross_entropy is CrossEntropyKernel.UNFUSED else BF16_BYTES
    return per_element * vocab_per_gpu * shape.tokens


def _cross_entropy_buffer_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    stats = 3 * FP32_BYTES * shape.tokens                                # max, sum of exp, target logit per token
    if training.cross_entropy is not CrossEntropyKernel.UNFUSED:
        return stats
    vocab_per_gpu = params.padded_vocab_size(model, shape.plans.tp) / shape.plans.tp
    return stats + BF16_BYTES * vocab_per_gpu * shape.tokens              # bf16 logits beside their fp32 copy


def logits_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Last rank: the s·b·V/t logits kept for the loss backward: the fp32 copy Megatron's vocab-parallel cross
    entropy works on (megatron/core/tensor_parallel/cross_entropy.py, `.float()` of the output), or bf16 when the
    loss is fused (Megatron --cross-entropy-loss-fusion / TE fused cross entropy) or apex's xentropy kernel (which
    saves the bf16 logits themselves: flash_attn.losses.cross_entropy `ctx.save_for_backward(logits, ...)`)."""
    return np.where(shape.is_last, _logits_bytes(model, training, shape), 0.0)


def cross_entropy_buffers_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Last rank: per-token fp32 max, sum of exponentials and target logit; unfused, also the bf16 logits that live
    beside the fp32 copy (and are matched by the bf16 logit gradient in the backward)."""
    return np.where(shape.is_last, _cross_entropy_buffer_bytes(model, training, shape), 0.0)


def pending_output_wgrad_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Last rank, zero-bubble schedules: each micro-batch whose output-layer W pass is still pending keeps that
    layer's output gradient (the s·b·V/t logit gradient, bf16 as it enters the linear's backward) and its input
    (2sbh, /t with SP). sail-sg's fork defers every Megatron linear's weight gradient with both tensors
    (megatron/core/tensor_parallel/layers.py: WeightGradStore.put(weight, partial(pre_process, grad_output, input),
    ...)), the column-parallel output layer's too; the decoder layers' pending W are in `in_flight`
    (in_flight_microbatches), this is the output layer's, which the 'last' terms count once. The last rank holds
    in_flight − 1 of them (arXiv 2401.10241 §2.3: worker p holds M_B + (p − 1)·M_W under ZB-1p, 2p − 2 under ZB-2p)."""
    if training.pipeline_schedule is PipelineSchedule.ONE_F_ONE_B:
        return np.zeros(len(shape.plans))
    pending = np.maximum(shape.in_flight - 1.0, 0.0)
    vocab_per_gpu = params.padded_vocab_size(model, shape.plans.tp) / shape.plans.tp
    gradient = BF16_BYTES * vocab_per_gpu * shape.tokens
    inputs = BF16_BYTES * model.hidden_size * shape.tokens_outside_tp
    return np.where(shape.is_last, pending * (gradient + inputs), 0.0)


def pipeline_outputs_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """With deallocate_pipeline_outputs off (TrainingSpec), each chunk-micro-batch a rank holds keeps the output it
    sent to the next stage (2h per token, /t with SP) until its backward (schedules.py: deallocate_output_tensor
    returns at once when `not deallocate_pipeline_outputs`, and the schedule keeps output_tensors for backward_step).
    The held entries are `in_flight` × vpp; the last rank's last chunk sends nothing (its output is the loss), and
    its peak holds the first entries of Megatron-Core's schedule table (in_flight_microbatches): g micro-batches
    through each chunk in turn, the last chunk's last, so (vpp − 1)·g of its W + 1 = (vpp − 1)·g + 1 send (g the
    micro-batch group); none without interleaving. Zero with pp = 1."""
    if training.deallocate_pipeline_outputs:
        return np.zeros(len(shape.plans))
    plans = shape.plans
    vpp, pp = plans.vpp.astype(float), plans.pp.astype(float)
    entries = shape.in_flight * vpp
    g = microbatch_group(pp, training.microbatch_group_size_per_vp_stage)
    full = np.floor(entries / (g * vpp))
    last_chunk = full * g + np.clip(entries - full * g * vpp - (vpp - 1.0) * g, 0.0, g)
    sending = np.where(shape.is_last, entries - last_chunk, entries)
    per_entry = BF16_BYTES * model.hidden_size * shape.tokens_outside_tp
    return np.where(plans.pp > 1, sending * per_entry, 0.0)


def deferred_output_wgrad_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Last rank, with the output layer's weight gradient deferred to the pipeline flush
    (TrainingSpec.defer_output_wgrad): each deferred micro-batch's output-layer input, appended in its forward (2h
    per token, /t with SP: the un-gathered input_parallel, tensor_parallel/layers.py ColumnParallelLinear.forward
    `self.embedding_activation_buffer.append(input_parallel)`), and its logit gradient, appended in its backward (the
    s·b·V/t bf16 grad_output, LinearWithGradAccumulationAndAsyncCommunication.backward
    `grad_output_buffer.append(grad_output)`), held until finish_embedding_wgrad_compute drains them after the
    cooldown (pipeline_parallel/schedules.py). min(limit, micro-batches) of them (limit 0: all): the buffers fill
    while the rank keeps its steady-state micro-batches in flight, so the peak is bounded by the two together."""
    if not training.defer_output_wgrad:
        return np.zeros(len(shape.plans))
    microbatches = shape.num_microbatches
    limit = training.wgrad_deferral_limit
    deferred = np.minimum(microbatches, limit) if limit else microbatches
    vocab_per_gpu = params.padded_vocab_size(model, shape.plans.tp) / shape.plans.tp
    gradient = BF16_BYTES * vocab_per_gpu * shape.tokens
    inputs = BF16_BYTES * model.hidden_size * shape.tokens_outside_tp
    return np.where(shape.is_last & (shape.plans.pp > 1), deferred * (gradient + inputs), 0.0)


def mtp_activations_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """Last rank: each DeepSeek-V3 multi-token-prediction module (report arXiv 2412.19437 §2.2) stores a full decoder
    layer, its two input norms and the 2h-wide input of its projection, and its own logits and loss buffers."""
    if model.num_mtp_layers == 0:
        return np.zeros(len(shape.plans))
    if model.moe is not None:
        layer = (_moe_layer_non_expert_bytes(model, training, shape, True) + _router_bytes_per_layer(model, shape)
                 + _dispatch_bytes_per_layer(model, training, shape)
                 + _expert_mlp_bytes_per_layer(model, training, shape))
    else:
        layer = _dense_layer_activation_bytes(model, training, shape, True)
    inputs = (2 * _norm_bytes_per_token(model) + BF16_BYTES * 2 * model.hidden_size) * shape.tokens_outside_tp
    loss = _logits_bytes(model, training, shape) + _cross_entropy_buffer_bytes(model, training, shape)
    return np.where(shape.is_last, model.num_mtp_layers * (layer + inputs + loss), 0.0)


# ---- ZeRO-2/3 working buffers --------------------------------------------------------------------------------------

def _largest_layer_params_per_gpu(model: ModelSpec, plans: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, expert) parameters of the largest decoder layer on one GPU (split as in costmodels.params)."""
    tp = plans.tp.astype(float)
    attn_sharded, attn_replicated = params.attention_params_split(model)
    common = attn_sharded / tp + attn_replicated + 2 * params.norm_params(model)
    dense = common + params.mlp_params(model, model.ffn_hidden_size) / tp
    if model.moe is None or model.num_moe_layers == 0:
        return dense, np.zeros(len(plans))
    shared, router = params.moe_shared_params_split(model)
    moe_non_expert = common + shared / tp + router
    moe_expert = params.routed_expert_params(model) / (plans.ep * plans.etp)
    if model.num_dense_layers == 0:
        return moe_non_expert, moe_expert
    return np.maximum(dense, moe_non_expert), moe_expert


def _unsharded_layer_bytes(model: ModelSpec, shape: StageShape, layers_held: int, bytes_per_param: float
                           ) -> np.ndarray:
    """Bytes of `layers_held` whole layers beyond this GPU's own 1/dp (1/edp for experts) shard of them, bounded by
    what the stage holds."""
    non_expert, expert = _largest_layer_params_per_gpu(model, shape.plans)
    stage_non_expert = shape.layer_params_per_gpu + shape.embedding_params_per_gpu
    held_non_expert = np.minimum(layers_held * non_expert, stage_non_expert)
    held_expert = np.minimum(layers_held * expert, shape.expert_params_per_gpu)
    return bytes_per_param * (held_non_expert * (1.0 - 1.0 / shape.dp_cp) + held_expert * (1.0 - 1.0 / shape.edp))


def zero_gradient_buckets_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """ZeRO-2/3: a layer's whole gradient, in the reduce dtype, exists until it is reduce-scattered (ZeRO §5.2
    'bucketization'; DeepSpeed reduce_bucket_size; FSDP's unsharded gradient before its reduce-scatter). The GPU's
    own shard of it is already in the gradient terms, so this is the other (1 - 1/(dp·cp)) of one layer. None where
    the gradients stay unsharded over the step (engines.fsdp_gradients_unsynced: whole in the gradient terms)."""
    bucketed = (shape.plans.zero >= 2) & ~engines.fsdp_gradients_unsynced(training, shape.plans)
    return np.where(bucketed, _unsharded_layer_bytes(model, shape, 1, training.gradient_bytes_per_param), 0.0)


def zero3_prefetch_buffers_bytes(model: ModelSpec, profile: HardwareProfile, training: TrainingSpec,
                                 shape: StageShape) -> np.ndarray:
    """ZeRO-3: the all-gathered weights of the layer being computed and of the one prefetched next (ZeRO §5.3;
    DeepSpeed stage3_prefetch_bucket_size; FSDP forward/backward prefetch with limit_all_gathers), beyond the
    GPU's own shard, at the bytes a gather carries (TrainingSpec.param_gather_bytes_by_zero: bf16, or fp8
    parameters' one layout); with fp8 parameters other than MXFP8 (whose gathers bring either layout), the layer
    being computed backward also holds the second layout Megatron-FSDP makes after the gather: the transpose on a
    TN-only GPU, block scaling's columnwise data (fp8_weight_copies_per_param_bytes less the one gathered)."""
    gathered = training.param_gather_bytes_by_zero[3]
    made_after = 0.0
    if training.fp8_param_gather and training.fp8_scaling not in (None, Fp8Recipe.MXFP8):
        made_after = fp8_weight_copies_per_param_bytes(profile, training) - gathered
    # none where the whole stage stays gathered after each backward (in weights_bytes: _whole_through_step)
    prefetching = (shape.plans.zero == 3) & ~engines.fsdp_gradients_unsynced(training, shape.plans)
    return np.where(prefetching, _unsharded_layer_bytes(model, shape, 2, gathered)
                    + _unsharded_layer_bytes(model, shape, 1, made_after), 0.0)


# ---- MoE dispatcher buffers ----------------------------------------------------------------------------------------

def moe_dispatcher_buffers_bytes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                                 shape: StageShape) -> np.ndarray:
    """HybridEP's persistent buffers (TrainingSpec.moe_hybridep), allocated once for the largest exchange and shared
    by every MoE layer of the rank. Megatron-Core sizes the buffer by the first dispatch's tokens
    (transformer/moe/fused_a2a.py: init_hybrid_ep_buffer(group, hidden_dim, num_tokens, num_local_experts) with
    `num_tokens, hidden_dim = x.shape[-2:]`, the rank's T/t tokens under SP) over the tensor×expert-parallel group
    of G = etp·ep ranks; HybridEP's NVLink coordinator (DeepEP hybrid-ep branch, csrc/hybrid_ep/buffer/
    intranode.cu) holds the worst case, every token of the group routed to one rank, `max_num_of_tokens =
    max_num_of_tokens_per_rank · num_of_ranks_per_node · num_of_nodes` = G·T/t rows, in one buffer the dispatch and
    the combine share (hybrid_ep_buffer.py: use_shared_buffer=True): the tokens in bf16 (2h), their routing
    probabilities over the experts of the NVLink domain (fp32, (E/ep) experts per rank × R ranks,
    R = min(G, the job's NVLink domain)) and the dispatch's fp32 scaling factors (h/128). The inter-domain RDMA
    buffers, when the EP group spans NVLink domains (internode_doca.cu: T/t·h per remote domain), are not
    priced."""
    if model.moe is None or not training.moe_hybridep:
        return np.zeros(len(shape.plans))
    plans = shape.plans
    group = (plans.ep * plans.etp).astype(float)
    ranks_per_domain = np.minimum(group, float(cluster.nvlink_domain_gpus))
    experts_per_rank = model.moe.num_experts / plans.ep
    h = model.hidden_size
    per_row = BF16_BYTES * h + FP32_BYTES * experts_per_rank * ranks_per_domain + FP32_BYTES * (h // 128)
    rows = shape.tokens_outside_tp * group
    return np.where(shape.moe_layers > 0, rows * per_row, 0.0)


# ---- tensor-parallel communication overlap ------------------------------------------------------------------------

UB_ALL_GATHER_BUFFERS = 8
"""Transformer Engine's userbuffers for all-gather overlaps (module/base.py initialize_ub,
`layers_all_gather_overlap`: qkv_fprop, qkv_dgrad, proj_dgrad, proj_wgrad, fc1_fprop, fc1_dgrad, fc2_dgrad,
fc2_wgrad), uint8 under an fp8 recipe (`fp8_buf`), else bf16."""
UB_REDUCE_SCATTER_BUFFERS = 4
"""... and for reduce-scatter overlaps (`layers_reduce_scatter_overlap`: proj_fprop, fc2_fprop, qkv_wgrad,
fc1_wgrad), bf16."""


def tp_comm_userbuffers_bytes(model: ModelSpec, training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    """TP communication overlap (TrainingSpec.tp_comm_overlap, sequence parallelism, tp > 1): Transformer Engine
    registers one userbuffer per overlapped GEMM of a layer, shared by all layers, each the gathered activation's
    shape, (s·mbs/cp) × h (Megatron-Bridge training/initialize.py and Megatron-LM initialize.py
    `input_shape = [seq_length * micro_batch_size // context_parallel_size, hidden_size]`; TE module/base.py
    initialize_ub add_ub for each of the 12 names, comm_gemm_overlap.cpp CommOverlapBase / CommOverlapP2PBase
    `register_user_buffer_collective(&buffer_ptr, buffer_bytes, ...)`): 8 all-gather buffers (1 byte an element
    under fp8, 2 in bf16) and 4 reduce-scatter ones (bf16). Those are TE's default methods; a configuration that
    runs a reduce-scatter GEMM by ring exchange holds (2·tp − 1)/tp of its buffer (CommOverlapP2PBase::initialize),
    not priced apart."""
    rows = training.seq_len * plans.mbs / plans.cp
    gather = 1.0 if training.fp8_scaling is not None else float(BF16_BYTES)
    per_row = model.hidden_size * (UB_ALL_GATHER_BUFFERS * gather + UB_REDUCE_SCATTER_BUFFERS * BF16_BYTES)
    on = training.tp_comm_overlap & plans.sp & (plans.tp > 1)
    return np.where(on, rows * per_row, 0.0)


# ---- CUDA graphs ----------------------------------------------------------------------------------------------------

def captures_attention_mask(training: TrainingSpec) -> bool:
    """Whether per-layer CUDA graphs keep an attention mask among their static inputs: Transformer Engine's capture
    path (TrainingSpec.cuda_graph_impl transformer_engine) with the attention captured (--cuda-graph-modules names
    attn, or names nothing: the whole layer). Megatron-Core's own CudaGraphManager (local) clones its inputs into
    the graph pool and keeps no mask of its own; a whole-iteration capture keeps the data loader's batches instead
    (cuda_graph_loader_batches_bytes: a mask among them where the loader builds one)."""
    return (training.launch is LaunchPath.CUDA_GRAPH and not training.cuda_graph_full_iteration
            and training.cuda_graph_impl == "transformer_engine"
            and (not training.cuda_graph_modules or "attn" in training.cuda_graph_modules))


def cuda_graph_attention_masks_bytes(model: ModelSpec, training: TrainingSpec, shape: StageShape,
                                     rank: "np.ndarray | int") -> np.ndarray:
    """The attention masks among Transformer Engine CUDA graphs' static inputs (`captures_attention_mask`), beside
    what the eager step holds (a causal attention takes no mask; the zero mask a replay passes when the layer gets
    none lives one layer at a time): Megatron-Core's TransformerLayer.get_layer_static_inputs (0.19,
    transformer_layer.py) adds a bool mask of shape (mbs, 1, s/cp, s), `~torch.tril(ones(s/cp, s))` tiled over
    the micro-batch (s the whole sequence; tp and sequence parallelism do not shrink it), to the hidden states of
    every (layer, micro-batch) sample it captures, and TECudaGraphHelper._get_sample_arguments
    (transformer/cuda_graphs.py) reuses a sample's buffers only once that forward's backward has run in the
    pipeline order: the rank holds one set per layer-forward in flight at the schedule's peak, the count the stored
    activations have (shape.layers × shape.in_flight; one per layer with pp 1, whose graphs are captured for one
    micro-batch and replayed). Under the EP all-to-all overlap the helper orders the capture without the
    overlap's extra warm-up chunk but runs forward and backward layer by layer: the plain count and one layer more
    (pp 1: every micro-batch captured, one layer more). The buffers belong to the graphs (make_graphed_callables'
    static inputs) for the rest of training. 1 byte an element."""
    if not captures_attention_mask(training):
        return np.zeros(len(shape.plans))
    held = shape.layers * shape.in_flight
    if training.moe_a2a_overlap and model.moe is not None:
        held = shape.layers * rank_in_flight(model, training, shape.plans, rank, shape.num_microbatches,
                                             shape.layers, moe_a2a_overlap=False) + 1.0
    per_layer_forward = shape.plans.mbs * (training.seq_len / shape.plans.cp) * training.seq_len
    return held * per_layer_forward


LOADER_BYTES_PER_TOKEN = 8 + 8 + 4 + 8
"""A GPT batch from Megatron-Core's GPTDataset, per token: tokens and labels (int64), the loss mask (fp32) and the
position ids (int64) (datasets/gpt_dataset.py GPTDataset.__getitem__)."""


def cuda_graph_loader_batches_bytes(training: TrainingSpec, shape: StageShape) -> np.ndarray:
    """The data loader's batches a whole-iteration CUDA graph keeps (TrainingSpec.cuda_graph_full_iteration):
    FullCudaGraphWrapper.data_read reads every micro-batch of the step from the iterator before the graph runs, and
    StaticBufferLoader copies each into a static CUDA buffer kept for the run (full_cuda_graph.py; one list indexed
    by micro-batch, shared by the model chunks), on the ranks that read the data: the first and last pipeline
    ranks (Megatron-LM builds the loader on their tensor-parallel rank 0, the worst GPU of the rank; the others get
    it by broadcast inside the step), every rank where the loader is built on every rank
    (TrainingSpec.dataloader_on_every_rank: Megatron-Bridge). A batch holds the whole sequence before context parallelism slices it:
    LOADER_BYTES_PER_TOKEN a token, and with the loader's mask (TrainingSpec.dataloader_attention_mask) a bool
    (1, s, s) mask a sample. The evaluation graph's own buffers are not priced."""
    if not training.cuda_graph_full_iteration:
        return np.zeros(len(shape.plans))
    seq = float(training.seq_len)
    per_sample = seq * LOADER_BYTES_PER_TOKEN + (seq * seq if training.dataloader_attention_mask else 0.0)
    reads = shape.is_first | shape.is_last | training.dataloader_on_every_rank
    return np.where(reads, shape.num_microbatches * shape.plans.mbs * per_sample, 0.0)


# ---- fixed overheads -----------------------------------------------------------------------------------------------

def fixed_overheads_bytes(cluster: ClusterSpec, num_plans: int) -> dict[str, np.ndarray]:
    """CUDA context, NCCL buffers, ...: named per-GPU constants from the hardware profile (memory.overheads_gib)."""
    return {name: np.full(num_plans, float(value)) for name, value in cluster.profile.memory_overheads_bytes.items()}


# ---- the optimizer step, after the backward -------------------------------------------------------------------------

def optimizer_step_grad_copy_bytes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                                   plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    """The fp32 copy of bf16 main gradients (grad_reduce_in_fp32 off) that Megatron's optimizers make at the step,
    4 bytes per parameter the GPU updates: its dp·cp shard (experts: edp) under the distributed optimizer
    (distrib_optimizer.py _copy_model_grads_to_main_grads: `shard_main_param.grad = shard_model_grad.float()`),
    every parameter without it (optimizer.py Float16OptimizerWithFloat16Params: `main_param.grad =
    model_param.main_grad.float()`, a new tensor only when main_grad is not fp32 already). It exists only while
    the backward's activations are freed, so it is not a term of the peak: the step's own peak is the model states,
    the fixed overheads and this (`autopar estimate` warns where that is the higher one). Zero with fp32 gradients."""
    if training.grad_reduce_in_fp32:
        return np.zeros(len(plans))
    shape = stage_shape(model, cluster, training, plans, stage)
    sharded = shape.plans.zero >= 1
    dense = (shape.layer_params_per_gpu + shape.embedding_params_per_gpu) / np.where(sharded, shape.dp_cp, 1)
    return FP32_BYTES * (dense + shape.expert_params_per_gpu / np.where(sharded, shape.edp, 1))


# ---- totals --------------------------------------------------------------------------------------------------------

def memory_terms_bytes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                       stage: "np.ndarray | int", only: "Collection[str] | None" = None) -> dict[str, np.ndarray]:
    """Named memory terms (bytes per GPU) on pipeline rank `stage` of every plan; their sum is the rank's total.
    With `only`, just the terms named there (a solver summing one group of terms)."""
    shape = stage_shape(model, cluster, training, plans, stage)
    moe = model.moe is not None
    entries: list[tuple[str, bool, Callable[[], np.ndarray]]] = [
        ("weights", True, lambda: weights_bytes(cluster.profile, training, shape)),
        ("gradients", True, lambda: gradients_bytes(training, shape)),
        ("optimizer_states", True, lambda: optimizer_states_bytes(training, shape)),
        ("embedding_weights", True, lambda: embedding_weights_bytes(training, shape)),
        ("embedding_gradients", True, lambda: embedding_gradients_bytes(training, shape)),
        ("embedding_optimizer_states", True, lambda: embedding_optimizer_states_bytes(training, shape)),
        ("expert_weights", moe, lambda: expert_weights_bytes(cluster.profile, training, shape)),
        ("expert_gradients", moe, lambda: expert_gradients_bytes(training, shape)),
        ("expert_optimizer_states", moe, lambda: expert_optimizer_states_bytes(training, shape)),
        ("fp8_weight_copies", training.fp8_scaling is not None and not training.fp8_param_gather,
         lambda: fp8_weight_copies_bytes(cluster.profile, training, shape)),
        ("layer_activations", True, lambda: layer_activations_bytes(model, training, shape)),
        ("recomputed_layer_inputs", True, lambda: recomputed_layer_inputs_bytes(model, shape)),
        ("sac_saved_activations", training.engine is Engine.TORCHTITAN,
         lambda: sac_saved_activations_bytes(model, training, shape)),
        ("recompute_working_set", True, lambda: recompute_working_set_bytes(model, training, shape)),
        ("moe_router_activations", moe, lambda: moe_router_activations_bytes(model, shape)),
        ("moe_dispatch_activations", moe, lambda: moe_dispatch_activations_bytes(model, training, shape)),
        ("expert_mlp_activations", moe, lambda: expert_mlp_activations_bytes(model, training, shape)),
        ("moe_stash_working_set", moe and training.moe_paged_stash_factor is not None,
         lambda: moe_stash_working_set_bytes(model, training, shape)),
        ("embedding_activations", True, lambda: embedding_activations_bytes(model, shape)),
        ("output_layer_activations", True, lambda: output_layer_activations_bytes(model, shape)),
        ("logits", True, lambda: logits_bytes(model, training, shape)),
        ("cross_entropy_buffers", True, lambda: cross_entropy_buffers_bytes(model, training, shape)),
        ("pending_output_wgrad", training.pipeline_schedule is not PipelineSchedule.ONE_F_ONE_B,
         lambda: pending_output_wgrad_bytes(model, training, shape)),
        ("pipeline_outputs", not training.deallocate_pipeline_outputs,
         lambda: pipeline_outputs_bytes(model, training, shape)),
        ("deferred_output_wgrad", training.defer_output_wgrad,
         lambda: deferred_output_wgrad_bytes(model, training, shape)),
        ("mtp_activations", bool(model.num_mtp_layers), lambda: mtp_activations_bytes(model, training, shape)),
        ("zero_gradient_buckets", True, lambda: zero_gradient_buckets_bytes(model, training, shape)),
        ("ddp_gradient_buckets", training.engine is Engine.PYTORCH,
         lambda: ddp_gradient_buckets_bytes(model, training, shape)),
        ("zero3_prefetch_buffers", True, lambda: zero3_prefetch_buffers_bytes(model, cluster.profile, training,
                                                                              shape)),
        ("tp_comm_userbuffers", training.tp_comm_overlap, lambda: tp_comm_userbuffers_bytes(model, training, plans)),
        ("cuda_graph_attention_masks", captures_attention_mask(training),
         lambda: cuda_graph_attention_masks_bytes(model, training, shape, stage)),
        ("cuda_graph_loader_batches", training.cuda_graph_full_iteration,
         lambda: cuda_graph_loader_batches_bytes(training, shape)),
        ("moe_dispatcher_buffers", moe and training.moe_hybridep,
         lambda: moe_dispatcher_buffers_bytes(model, cluster, training, shape)),
    ]
    terms = {name: term() for name, present, term in entries if present and (only is None or name in only)}
    if frees_gradients_between_steps(training) and any(name in terms for name in GRADIENT_TERMS):
        def present_sum(group: tuple[str, ...]) -> np.ndarray:
            return sum((terms[name] if name in terms else term()
                        for name, present, term in entries if present and name in group), np.zeros(len(plans)))

        share = gradients_at_peak_share(shape, present_sum(GRADIENT_TERMS), present_sum(ACTIVATION_TERMS))
        terms.update({name: terms[name] * share for name in GRADIENT_TERMS if name in terms})
    modelled = {name for name, present, _ in entries if present}
    for name, value in fixed_overheads_bytes(cluster, len(plans)).items():
        if name in modelled:   # a profile's own overhead may not shadow a modelled term (the sum would count it twice)
            raise InputError("profile", f"{cluster.profile.source_path or cluster.profile.name}: "
                                        f"memory.overheads_gib key {name!r} is the name of a modelled memory term; "
                                        "rename it")
        if only is None or name in only:
            terms[name] = value
    return terms


def layout_memory_terms_bytes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                              plan: Plan) -> dict[str, np.ndarray]:
    """Named memory terms of every pipeline rank (index 0..pp-1) of a plan with a layout: each rank's own decoder and
    MoE layers (params.layout_rank_content), its role and in-flight micro-batches from its index, as for the even
    split (costmodels.layout)."""
    ranks = params.layout_rank_content(model, plan.layout, plan.pp)
    plans = PlanArrays.from_plans([plan]).take(np.zeros(plan.pp, dtype=np.int64))
    return memory_terms_bytes(model, cluster, training, plans, ranks)


def total_bytes(terms: dict[str, np.ndarray]) -> np.ndarray:
    """The explicit sum of the named terms."""
    return sum(terms.values())


def candidate_worst_stages(model: ModelSpec, plans: PlanArrays) -> list[np.ndarray]:
    """The pipeline ranks that can hold the peak, as a list of per-plan stage arrays (entries may repeat).

    Why these are enough: a middle rank r (0 < r < pp-1) differs from another middle rank only through (a) the
    micro-batches it holds, in_flight(r), which never increases with r (`in_flight_microbatches`), and (b) how many
    of its (equally many) layers are MoE layers. Its total is a non-decreasing function of in_flight(r) for a fixed
    layer mix. The mix is periodic in r with period f = moe layer_freq (shifting a rank by f ranks shifts its first
    layer by a multiple of f) once the rank lies wholly past the first_dense_layers; before that (ranks that still
    hold dense-first layers) it may differ. So any middle rank r >= r_k + f, with r_k the first middle rank wholly
    past the dense-first layers, is dominated by rank r - f, which has the same mix and holds at least as many
    micro-batches. The first rank (embedding, first_stage_layers) and the last (output layer, loss, MTP,
    last_stage_layers) are special and always candidates. For a dense model r_k = 1 and f = 1: ranks 0, 1, pp-1.
    """
    return stage_list(plans, ("candidate_worst_stages", id(model)), lambda p: _candidate_worst_stages(model, p))


def _candidate_worst_stages(model: ModelSpec, plans: PlanArrays) -> list[np.ndarray]:
    pp = plans.pp
    middle_layers = np.maximum(layers_per_middle_stage(model.num_layers, plans), 1e-9)
    first_layers = layers_on_stage(model.num_layers, plans, 0)
    if model.moe is not None:
        dense_first, period = model.moe.first_dense_layers, model.moe.layer_freq
    else:
        dense_first, period = 0, 1
    first_clean_middle = 1 + np.ceil(np.maximum(dense_first - first_layers, 0) / middle_layers)
    last_middle_candidate = np.minimum(pp - 2, first_clean_middle + period - 1)
    deepest = int(np.max(last_middle_candidate, initial=0))
    stages = [np.zeros(len(plans), dtype=np.int64)]
    for j in range(1, deepest + 1):
        stages.append(np.where(j <= last_middle_candidate, j, 0).astype(np.int64))
    stages.append((pp - 1).astype(np.int64))
    return stages


def peak_memory(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays
                ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(peak bytes per GPU, the pipeline rank holding it, that rank's named terms) for every plan.

    Evaluates only `candidate_worst_stages` (exact, see there); ties go to the lowest rank.
    """
    candidates = candidate_worst_stages(model, plans)
    per_candidate = [memory_terms_bytes(model, cluster, training, plans, stage) for stage in candidates]
    totals = np.stack([total_bytes(terms) for terms in per_candidate])            # (candidates, plans)
    stages = np.stack(candidates)
    # lowest rank among the maxima: order candidates by (total desc, stage asc)
    best_total = totals.max(axis=0)
    is_best = totals >= best_total
    masked_stage = np.where(is_best, stages, np.iinfo(np.int64).max)
    choice = np.argmin(masked_stage, axis=0)
    columns = np.arange(len(plans))
    worst_stage = stages[choice, columns]
    worst_terms = {name: np.stack([terms[name] for terms in per_candidate])[choice, columns]
                   for name in per_candidate[0]}
    peak = total_bytes(worst_terms)
    return peak, worst_stage, worst_terms
